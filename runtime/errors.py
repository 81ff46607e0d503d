"""Errors the runtime raises for bad user input.

All are `ValueError`s so callers that only know the standard library still catch them; the
message always says what to do next.
"""


class ProfileError(ValueError):
    """A profile file or object is malformed, or does not belong to the given model."""


class PlanError(ValueError):
    """A plan cannot be built from the given profile and settings (bad sizes, impossible budget)."""


class CacheFullError(ValueError):
    """A static cache was asked to hold more token positions than its `max_length`."""
