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


def _fail(path: Path, exc: BaseException) -> TuiprofError:
    code = getattr(exc, "errno", None)
    if code == errno.ENOSPC or "full" in str(exc).lower():
        why = "the disk is full"
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "permission denied"
    elif code == errno.ENOENT:
        why = "no such directory"
    elif code == errno.ENOTDIR:
        why = "a part of the path is a file, not a directory"
    else:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return TuiprofError(f"cannot write {path}: {why}")


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
