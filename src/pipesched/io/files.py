"""Safe file output: an output file appears whole or not at all, and nothing is overwritten
until the new content is complete."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from pipesched.errors import PipeschedError
from pipesched.limits import MAX_INPUT_BYTES


def check_output_path(path: str | os.PathLike[str], field: str = "output") -> Path:
    """Fail early (before any work) if ``path`` cannot be written."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise PipeschedError(f"{field}={target}: directory {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK):
        raise PipeschedError(f"{field}={target}: directory {folder} is not writable; choose another path")
    if target.is_dir():
        raise PipeschedError(f"{field}={target}: is a directory; give a file name")
    return target


def write_atomic(path: str | os.PathLike[str], data: str | bytes, field: str = "output") -> Path:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place."""
    import tempfile  # only commands that write files need it

    target = check_output_path(path, field)
    mode = "wb" if isinstance(data, bytes) else "w"
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        # mkstemp makes owner-only files; give the output the usual permissions (umask applies)
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8", "newline": ""})) as handle:
            handle.write(data)
        os.replace(tmp, target)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise PipeschedError(f"{field}={target}: cannot write ({exc.strerror}); choose another path") from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def names_a_path(text: str, presets: Iterable[str] = ()) -> bool:
    """Whether an input naming a preset or a file names something on disk: a file, or a
    directory that is no preset's name (read_text refuses it as a directory, rather than
    calling it an unknown preset)."""
    path = Path(text)
    return path.is_file() or (path.is_dir() and text not in presets)


def read_text(path: str | os.PathLike[str], field: str = "file") -> str:
    """Read a UTF-8 text input file of at most MAX_INPUT_BYTES, with a one-line error when
    that is impossible (a device or pipe is read only up to the limit too)."""
    source = Path(path)
    try:
        with source.open("rb") as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except FileNotFoundError:
        raise PipeschedError(f"{field}={source}: no such file; check the path") from None
    except IsADirectoryError:
        raise PipeschedError(f"{field}={source}: is a directory; give a file") from None
    except OSError as exc:
        raise PipeschedError(f"{field}={source}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_INPUT_BYTES:
        raise PipeschedError(f"{field}={source}: over the limit of {MAX_INPUT_BYTES:,} bytes of an input file; "
                             "give a smaller file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PipeschedError(f"{field}={source}: not UTF-8 text; give a text file") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as open() reads text
