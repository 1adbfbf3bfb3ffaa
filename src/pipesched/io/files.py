"""Safe file output: an output file appears whole or not at all, nothing is overwritten until
the new content is complete, and the files of one command are written all or none
(``write_all``)."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipesched.errors import PipeschedError
from pipesched.limits import MAX_INPUT_BYTES


@dataclass(frozen=True)
class Output:
    """One file a command writes: its path, its content, and the option that named it."""

    path: str | os.PathLike[str]
    data: str | bytes
    field: str = "output"


def check_output_path(path: str | os.PathLike[str], field: str = "output") -> Path:
    """Fail early (before any work) if ``path`` cannot be written: its folder must exist
    and be writable, and the path must be new or a regular file (a link, a device, a pipe
    or a folder there would be replaced by a file, or read as one)."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise PipeschedError(f"{field}={target}: directory {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK):
        raise PipeschedError(f"{field}={target}: directory {folder} is not writable; choose another path")
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise PipeschedError(f"{field}={target}: cannot check it ({exc.strerror}); choose another path") from None
    if stat.S_ISDIR(mode):
        raise PipeschedError(f"{field}={target}: is a directory; give a file name")
    if not stat.S_ISREG(mode):
        raise PipeschedError(f"{field}={target}: is {_kind(mode)}, not a regular file; give a regular file or a new "
                             "path")
    return target


def _kind(mode: int) -> str:
    """What a non-regular, non-folder file system entry is, in words."""
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))
    return next((words for test, words in kinds if test(mode)), "a special file")


def check_outputs(paths: Iterable[tuple[str, str | os.PathLike[str] | None]]) -> list[Path]:
    """Check every ``(field, path)`` a command will write (None: not asked for) like
    ``check_output_path``, and that no two name the same file."""
    targets: list[Path] = []
    seen: dict[str, str] = {}  # absolute path -> the field that names it
    for field, path in paths:
        if path is None:
            continue
        target = check_output_path(path, field)
        key = os.path.abspath(target)
        if key in seen:
            raise PipeschedError(f"{field}={target}: the same file as {seen[key]}; give each output its own file")
        seen[key] = field
        targets.append(target)
    return targets


def write_all(outputs: Sequence[Output]) -> list[Path]:
    """Write a command's files all or none: each to a temporary file beside its target,
    then, once every one is complete, rename them into place: a failure to write any (a
    full disk, an unwritable folder) replaces none and leaves no temporary file."""
    targets = check_outputs((output.field, output.path) for output in outputs)
    temporaries: list[str] = []
    try:
        for output, target in zip(outputs, targets, strict=True):
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
                temporaries.append(tmp)
                _fill(fd, output.data)
            except OSError as exc:
                raise PipeschedError(f"{output.field}={target}: cannot write ({exc.strerror}); choose another path; "
                                     "no output file was written") from None
        for k, (output, target) in enumerate(zip(outputs, targets, strict=True)):
            try:
                os.replace(temporaries[k], target)
            except OSError as exc:
                raise PipeschedError(f"{output.field}={target}: cannot write ({exc.strerror}); choose another "
                                     "path") from None
    finally:
        for tmp in temporaries:
            Path(tmp).unlink(missing_ok=True)  # the ones not renamed into place
    return targets


def _fill(fd: int, data: str | bytes) -> None:
    """Write ``data`` to the new temporary file ``fd`` with the usual permissions, and close it."""
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        # mkstemp makes owner-only files; give the output the usual permissions (umask applies)
        os.fchmod(fd, 0o666 & ~_umask())
        handle = os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8", "newline": ""}))
    except BaseException:
        os.close(fd)
        raise
    with handle:
        handle.write(data)


def write_atomic(path: str | os.PathLike[str], data: str | bytes, field: str = "output") -> Path:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place."""
    return write_all([Output(path, data, field)])[0]


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
