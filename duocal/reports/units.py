"""Numbers for people: bytes in the unit that reads best (the runtime owns the rule; its messages use it too),
and the unit a plot's byte axis takes."""

from duocal_runtime.planning.sizes import bytes_with_count, human_bytes

__all__ = ["byte_unit", "bytes_with_count", "human_bytes"]


def byte_unit(largest: float) -> tuple[str, float]:
    """The binary unit in which `largest` bytes reads with at most four digits: (name, bytes per unit)."""
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= size:
            return name, size
    return "B", 1
