"""One error type for every bad input: the CLI prints its message on one line and exits 2."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable

SHORT_VALUE_CHARS = 60  # longest value an error line repeats in full
_LONG_WORD_CHARS = 240  # longest word of an error line (a path may be long; a data row is longer)
_MAX_MESSAGE_CHARS = 2000  # longest error line (values are shortened long before this)


class PipeschedError(Exception):
    """A problem with the user's input, worded for the user: field, value, and the fix.

    The message is a single line, with any word too long to read (a huge number, a whole
    row of a file) shortened; the CLI prints it to stderr and exits with status 2.
    """

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def shorten(value: object, width: int = SHORT_VALUE_CHARS) -> str:
    """``value`` as text an error line can repeat: long text keeps its start and says how
    long it was; a huge integer says how many digits it has (Python refuses to print
    integers of over 4,300 digits).

    >>> shorten(10**5000)
    '<a 5001-digit integer>'
    >>> shorten("x" * 100)
    'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... (100 characters)'
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * width:
        digits = math.floor(value.bit_length() * math.log10(2)) + 1  # within one of the truth
        return f"<a {digits}-digit integer>"
    text = value if isinstance(value, str) else _text(value, width)
    if len(text) <= width:
        return text
    return f"{text[: 2 * width // 3]}... ({len(text):,} characters)"


def _text(value: object, width: int) -> str:
    if isinstance(value, list | tuple | dict | set) and len(value) > width:
        return f"<a {type(value).__name__} of {len(value):,} items>"
    try:
        return str(value)
    except ValueError:  # an integer too long to print, inside a container
        return f"<a {type(value).__name__}>"


def one_line(message: str) -> str:
    """``message`` on one line, each over-long word shortened."""
    words = [word if len(word) <= _LONG_WORD_CHARS else shorten(word, _LONG_WORD_CHARS // 2)
             for word in message.split()]
    line = " ".join(words)
    if len(line) > _MAX_MESSAGE_CHARS:
        line = f"{line[: _MAX_MESSAGE_CHARS // 2]} ... {line[-_MAX_MESSAGE_CHARS // 4:]}"
    return line


def suggest(name: object, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the known name closest to ``name``, or "" when none is close.

    >>> suggest("h100", ["a100-80gb", "h100-sxm", "h200"])
    ' (did you mean h100-sxm?)'
    """
    if not isinstance(name, str) or len(name) > SHORT_VALUE_CHARS:
        return ""

    known = list(known)
    lowered = name.lower()
    starts = [choice for choice in known if choice.lower().startswith(lowered) and lowered]
    close = starts[:1] or difflib.get_close_matches(lowered, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class OutOfMemory(PipeschedError):
    """A configuration that cannot fit in its devices' memory whatever is tried (no
    partition of the model fits, ...): a valid input with no feasible answer."""


def invalid(field: str, value: object, fix: str) -> PipeschedError:
    """Build the standard message ``field=value: fix`` (the value shortened).

    >>> str(invalid("microbatches", 0, "must be at least 1"))
    'microbatches=0: must be at least 1'
    """
    return PipeschedError(f"{field}={shorten(value)}: {fix}")


def require(condition: bool, field: str, value: object, fix: str) -> None:
    """Raise ``invalid(field, value, fix)`` unless ``condition`` holds."""
    if not condition:
        raise invalid(field, value, fix)
