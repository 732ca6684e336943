"""Atomic file writes: a temp file in the target directory, fsync, ``os.replace``.

A reader never sees a half-written export, and a failure (read-only directory, full disk)
leaves nothing behind and surfaces as a one-line :class:`TuiprofError`.
"""
from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import Iterator

from ..errors import TuiprofError


def _why(exc: BaseException) -> str:
    """What an OSError means for a file being written, in words (never its temp path)."""
    code = getattr(exc, "errno", None)
    if code == errno.ENOSPC or "full" in str(exc).lower():
        return "the disk is full"
    if code == errno.EROFS:
        return "it is on a read-only file system"
    if code in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if code == errno.ENOENT:
        return "no such directory"
    if code == errno.ENOTDIR:
        return "a part of the path is a file, not a directory"
    if code == errno.EISDIR:
        return "it is a directory; give a file name"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _fail(path: Path, exc: BaseException) -> TuiprofError:
    return TuiprofError(f"cannot write {path}: {_why(exc)}")


def check_output(path: str | Path, flag: str = "") -> Path:
    """Refuse at once an output file that could not be written at the end of a run: its
    directory missing or not a directory, the path itself a directory, a read-only file system,
    no permission. A temp file is created and removed beside it (the only sure test)."""
    p = Path(path)
    what = f"{flag} {p}" if flag else str(p)
    if p.is_dir():
        raise TuiprofError(f"cannot write {what}: it is a directory; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise TuiprofError(f"cannot write {what}: directory {_first_missing(parent)} does not "
                           f"exist")
    if not parent.is_dir():
        raise TuiprofError(f"cannot write {what}: {parent} is a file, not a directory")
    _try_create(parent, what)
    return p


def check_output_dir(path: str | Path, flag: str = "") -> Path:
    """Refuse at once an output directory that could not be made or written: the nearest
    directory that exists must take a new file (the rest is created when writing)."""
    d = Path(path)
    what = f"{flag} {d}" if flag else str(d)
    probe = d
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise TuiprofError(f"cannot write {what}: {probe} is a file, not a directory")
    _try_create(probe, what)
    return d


def _first_missing(d: Path) -> Path:
    while not d.parent.exists() and d.parent != d:
        d = d.parent
    return d


def _try_create(directory: Path, what: str) -> None:
    try:
        fd, name = tempfile.mkstemp(prefix=".tuiprof-check.", dir=directory)
    except OSError as exc:
        why = _why(exc)
        if why == "permission denied":
            why = f"permission denied in {directory}"
        elif why.startswith("it is on"):
            why = f"{directory} is on a read-only file system"
        raise TuiprofError(f"cannot write {what}: {why}") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success fsync it and move it into place.

    The caller writes the temp file (any way it likes, closing it before the block ends).
    On any exception the temp file is removed and ``OSError`` becomes :class:`TuiprofError`.
    """
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix,
                                        dir=directory)
        os.close(fd)
    except OSError as exc:
        raise _fail(target, exc) from None
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        _fsync_dir(directory)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise _fail(target, exc) from None
        if type(exc).__name__ in ("OperationalError", "DatabaseError"):  # sqlite3
            raise _fail(target, exc) from None
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    target = Path(path)
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
    return target


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 ``text`` atomically (``\\n`` line ends, no translation)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def ensure_dir(path: str | Path) -> Path:
    """Create an output directory (and parents); one-line error when that is impossible."""
    d = Path(path)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail(d, exc) from None
    if not d.is_dir():
        raise TuiprofError(f"cannot write {d}: not a directory")
    return d


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
