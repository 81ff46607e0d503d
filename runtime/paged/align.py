"""Byte alignment of the pool's blocks and of the fields inside them."""

ALIGN = 128  # bytes: every block and field starts on it


def aligned(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to
