"""Errors the runtime raises for bad user input.

All are `ValueError`s so callers that only know the standard library still catch them; the
message always says what to do next.
"""


class ProfileError(ValueError):
    """A profile file or object is malformed, or does not belong to the given model."""


class PlanError(ValueError):
    """A plan cannot be built from the given profile and settings (bad sizes, impossible budget)."""


class ConflictingArgumentsError(PlanError):
    """More than one of arguments that exclude each other was given; `names` are those given (the
    API's spelling: a command line turns them into its option names)."""

    def __init__(self, message: str, names: tuple[str, ...]):
        super().__init__(message)
        self.names = names


class CacheFullError(ValueError):
    """A static cache was asked to hold more token positions than its `max_length`."""
