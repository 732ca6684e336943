"""Atomic file writes: a temp file in the target directory, fsync, ``os.replace``.

A reader never sees a half-written export, and a failure (read-only directory, full disk)
leaves nothing behind and surfaces as a one-line :class:`TuiprofError`.

An output path that is not a regular file is never replaced: :func:`output_kind` is the one
rule every output goes through, before the run (:func:`check_output`) and when writing. A
character device or a FIFO (``/dev/null``, ``/dev/stdout``, ``>(wc -c)``) is written in place
as a stream, the way ``cat > PATH`` would; ``/dev/stdout``, ``/dev/stderr`` and ``/dev/fd/N``
are written through the descriptor this process holds (at its offset, after what was printed);
a block device, a socket or anything else that is not a file is refused.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from ..errors import TuiprofError


FILE, STREAM = "file", "stream"
# a descriptor of this process named as a path: written through the descriptor itself
_OWN_FD = re.compile(r"/dev/(?:(stdout)|(stderr)|fd/(\d+))|/proc/self/fd/(\d+)")


def output_kind(path: str | Path, flag: str = "") -> str:
    """How an output path is written: ``FILE`` (a regular file, or none yet: atomically, a temp
    file beside it renamed over it) or ``STREAM`` (a character device, a FIFO, or a path under
    ``/dev`` or ``/proc``: opened and written in place, never replaced or removed). Anything
    else (a directory, a block device, a socket) is refused in one line."""
    p = Path(path)
    what = f"{flag} {p}" if flag else str(p)
    try:
        st = os.stat(p)
    except OSError:
        st = None
    if st is None:
        # nothing there (or a dangling link): a new regular file; never one made inside /dev
        if _under_dev(p):
            raise TuiprofError(f"cannot write {what}: no such device; give a file name "
                               f"outside /dev")
        return FILE
    mode = st.st_mode
    if stat.S_ISREG(mode):
        # /dev/stdout redirected to a file: the shell's descriptor, not a file to replace
        return STREAM if _under_dev(p) else FILE
    if stat.S_ISDIR(mode):
        raise TuiprofError(f"cannot write {what}: it is a directory; give a file name")
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return STREAM
    kind = "a block device" if stat.S_ISBLK(mode) else (
        "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    raise TuiprofError(f"cannot write {what}: it is {kind}; give a file name, a FIFO or a "
                       f"character device such as /dev/stdout")


def _under_dev(p: Path) -> bool:
    """A name of /dev itself or of /proc (``/dev/stdout``, ``/dev/fd/1``), not of a file
    system mounted below /dev (``/dev/shm`` holds files like any directory)."""
    text = os.path.abspath(p)
    return (os.path.dirname(text) in ("/dev", "/dev/fd") or text.startswith("/proc/")
            or _OWN_FD.fullmatch(text) is not None)


def _why(exc: BaseException, path: Path | None = None) -> str:
    """What an OSError means for a file being written, in words (never its temp path);
    ``path``: a stream's (a device or a FIFO), named in what happened to it."""
    code = getattr(exc, "errno", None)
    if path is not None:
        if code == errno.ENOSPC:
            return f"no space left on {path}"
        if code == errno.EPIPE:
            return f"the reader of {path} closed it"
        if code == errno.ENXIO:
            return f"{path} has no reader (a FIFO) or no device behind it"
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


def _fail(path: Path, exc: BaseException, stream: bool = False) -> TuiprofError:
    return TuiprofError(f"cannot write {path}: {_why(exc, path if stream else None)}")


def check_output(path: str | Path, flag: str = "") -> Path:
    """Refuse at once an output file that could not be written at the end of a run: its
    directory missing or not a directory, the path itself a directory, a read-only file system,
    no permission. A temp file is created and removed beside it (the only sure test)."""
    p = Path(path)
    what = f"{flag} {p}" if flag else str(p)
    if output_kind(p, flag) == STREAM:
        # written in place at the end: it must take writes now (a FIFO is not opened here,
        # which would end its reader's input)
        if not os.access(p, os.W_OK):
            raise TuiprofError(f"cannot write {what}: permission denied")
        return p
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
        kind = "a file" if probe.is_file() else "a device or a FIFO"
        raise TuiprofError(f"cannot write {what}: {probe} is {kind}, not a directory")
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
    A stream (:func:`output_kind`) gets the temp file's bytes written into it instead; its
    temp file is in the temp directory.
    """
    target = Path(path)
    stream = output_kind(target) == STREAM
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix,
                                        dir=None if stream else directory)
        os.close(fd)
    except OSError as exc:
        raise _fail(target, exc) from None
    tmp = Path(tmp_name)
    try:
        yield tmp
        if stream:
            write_stream(target, tmp.read_bytes())
            tmp.unlink()
            return
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


def write_stream(path: str | Path, data: bytes) -> Path:
    """Write ``data`` into a stream in place: a device or a FIFO opened for writing (never
    created, truncated or replaced; a FIFO's open waits for its reader), or this process's
    own descriptor for ``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``."""
    target = Path(path)
    m = _OWN_FD.fullmatch(os.path.abspath(target))
    own = None if m is None else (1 if m.group(1) else 2 if m.group(2)
                                  else int(m.group(3) or m.group(4)))
    try:
        if own is not None:
            for stream in (sys.stdout, sys.stderr):   # what was printed comes first
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    stream.flush()
            fd = os.dup(own)
        else:
            fd = _open_stream(target)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        finally:
            os.close(fd)
    except OSError as exc:
        raise _fail(target, exc, stream=True) from None
    return target


FIFO_WAIT_S = 10.0   # how long a write waits for a FIFO's reader before it fails (rescued)


def _open_stream(target: Path) -> int:
    """A device or a FIFO opened for writing; a FIFO without a reader is waited for at most
    ``FIFO_WAIT_S`` (then ENXIO: the caller's rescue path keeps the data), never forever."""
    flags = os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC
    if not stat.S_ISFIFO(os.stat(target).st_mode):
        return os.open(target, flags)
    end = time.monotonic() + FIFO_WAIT_S
    while True:
        try:
            fd = os.open(target, flags | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > end:
                raise
            time.sleep(0.05)
            continue
        os.set_blocking(fd, True)
        return fd


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (a stream in place); returns the path."""
    target = Path(path)
    if output_kind(target) == STREAM:
        return write_stream(target, data)
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
