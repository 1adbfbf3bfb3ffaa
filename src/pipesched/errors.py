"""One error type for every bad input: the CLI prints its message on one line and exits 2."""

from __future__ import annotations


class PipeschedError(Exception):
    """A problem with the user's input, worded for the user: field, value, and the fix.

    The message is a single line; the CLI prints it to stderr and exits with status 2.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class OutOfMemory(PipeschedError):
    """A configuration that cannot fit in its devices' memory whatever is tried (no
    partition of the model fits, ...): a valid input with no feasible answer."""


def invalid(field: str, value: object, fix: str) -> PipeschedError:
    """Build the standard message ``field=value: fix``.

    >>> str(invalid("microbatches", 0, "must be at least 1"))
    'microbatches=0: must be at least 1'
    """
    return PipeschedError(f"{field}={value!s}: {fix}")


def require(condition: bool, field: str, value: object, fix: str) -> None:
    """Raise ``invalid(field, value, fix)`` unless ``condition`` holds."""
    if not condition:
        raise invalid(field, value, fix)
