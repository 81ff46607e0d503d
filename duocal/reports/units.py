"""Numbers for people: bytes in the unit that reads best (the runtime owns the rule; its messages use it too)."""

from duocal_runtime.planning.sizes import bytes_with_count, human_bytes

__all__ = ["bytes_with_count", "human_bytes"]
