"""Byte counts for people: '102.7 MiB', with the exact count after it where a message needs both; the binary
units themselves, defined here once."""

KiB, MiB, GiB = 2**10, 2**20, 2**30


def human_bytes(n: float) -> str:
    """'512 B', '1.5 KiB', '180.3 MiB', '16.00 GiB': the largest binary unit below 1024 of it."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}" if unit != "GiB" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def bytes_with_count(n: int) -> str:
    """'102.7 MiB (107,642,880 bytes)': readable first, exact for whoever compares numbers; '512 B' alone."""
    return human_bytes(n) if abs(n) < 1024 else f"{human_bytes(n)} ({int(n):,} bytes)"


def byte_unit(largest: float) -> tuple[str, float]:
    """The binary unit in which `largest` bytes reads with at most four digits: (name, bytes per unit)."""
    for name, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if largest >= size:
            return name, size
    return "B", 1
