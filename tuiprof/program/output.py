"""What the profiled program prints: kept whole in a log file, recent lines in the store.

The program's file descriptors 1 and 2 (so C libraries' output too) point at two pipes; one
thread reads both, appends every byte to the log file, optionally copies them to the
terminal (``tee``: a headless run), and hands complete, sanitised lines to
``store.add_output`` (a bounded ring the live app's log view reads). Nothing is lost: the
log file has everything; the ring keeps the newest lines.
"""
from __future__ import annotations

import os
import selectors
import stat
import sys
import threading
from pathlib import Path
from typing import Callable, Iterable

from ..store import SessionStore
from ..text import OUTPUT_LIMIT, output_line

MAX_LINE = OUTPUT_LIMIT   # characters kept of one line in the ring
MAX_PARTIAL = 1 << 16     # bytes of an unfinished line before it is cut


def clean_line(text: str, home: str | None = None, limit: int = MAX_LINE) -> str:
    """One printed line made safe for a screen and a shared snapshot
    (:func:`tuiprof.text.output_line`)."""
    return output_line(text, home, limit)


def pump(reads: Iterable[int], on_chunk: Callable[[int, bytes], None],
         on_end: Callable[[int], None]) -> None:
    """Read the pipes ``reads`` until each is at its end: every chunk to ``on_chunk(r, data)``,
    then ``on_end(r)``; each read end is closed when done."""
    sel = selectors.DefaultSelector()
    open_ends = set(reads)
    for r in open_ends:
        sel.register(r, selectors.EVENT_READ)
    while open_ends:
        for key, _ in sel.select():
            r = key.fd
            try:
                chunk = os.read(r, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                sel.unregister(r)
                open_ends.discard(r)
                on_end(r)
                os.close(r)
                continue
            on_chunk(r, chunk)
    sel.close()


LOG_MODE = 0o600     # a program's log: its output may hold what only its user should read


def open_log(path: str) -> int:
    """A program's log, emptied and private (``LOG_MODE``) whoever made the file before: a
    live run creates it in advance, a file left by an earlier run keeps its old mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, LOG_MODE)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o777 != LOG_MODE:   # never a device's
            os.fchmod(fd, LOG_MODE)
    except OSError:          # not ours to change (another user's file we may write)
        pass
    return fd


def write_all(chunk: bytes, *fds: int) -> None:
    """``chunk`` to each fd that is open (>= 0): the log, the terminal. A failed write (the
    terminal is gone, the disk is full) loses only that copy."""
    for fd in fds:
        if fd >= 0:
            try:
                os.write(fd, chunk)
            except OSError:
                pass


def split_lines(partial: dict, r: int, chunk: bytes, final: bool = False) -> list[bytes]:
    """The complete lines of pipe ``r`` after ``chunk`` (``partial[r]``: what came before the
    last newline); at the end, or past ``MAX_PARTIAL`` bytes without one (a progress bar), the
    unfinished line too."""
    parts = (partial[r] + chunk).split(b"\n")
    rest = parts.pop()
    if (final and rest) or len(rest) > MAX_PARTIAL:
        parts.append(rest)
        rest = b""
    partial[r] = rest
    return parts


class OutputCapture:
    """Redirects fds 1 and 2 of this process into the log file and the store's ring."""

    def __init__(self, store: SessionStore, log_path: str | Path, tee: bool = False) -> None:
        self.store = store
        self.log_path = str(log_path)
        self.tee = tee
        self.lines = 0
        self.bytes = 0
        self._saved: dict[int, int] = {}     # fd -> a copy of what it was
        self._reads: dict[int, int] = {}     # pipe read end -> fd it serves
        self._partial: dict[int, bytes] = {}
        self._log = -1
        self._thread: threading.Thread | None = None
        self._home = os.path.expanduser("~")

    def start(self) -> None:
        """Open the log file and swap fds 1 and 2 for pipes; raises OSError."""
        self._flush_python()
        self._log = open_log(self.log_path)
        for fd in (1, 2):
            r, w = os.pipe()
            self._saved[fd] = os.dup(fd)
            os.dup2(w, fd)
            os.close(w)
            self._reads[r] = fd
            self._partial[r] = b""
        for stream in (sys.stdout, sys.stderr):  # a program's lines appear as it prints them
            try:
                stream.reconfigure(line_buffering=True)
            except (AttributeError, ValueError, OSError):
                pass
        self._thread = threading.Thread(target=self._read, name="tuiprof-output", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Give fds 1 and 2 back and collect the rest of the output (at most ``timeout``
        seconds: a child process of the program may still hold a pipe open)."""
        if not self._saved:
            return
        self._flush_python()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)   # the pipes' last write ends close: the reader sees the end
        if self._thread is not None:
            self._thread.join(timeout)
        for saved in self._saved.values():
            os.close(saved)
        self._saved.clear()
        if self._log >= 0 and not (self._thread and self._thread.is_alive()):
            os.close(self._log)
            self._log = -1

    def flush(self) -> None:
        """Push what Python buffered to the pipes (the program ended; the capture goes on)."""
        self._flush_python()

    def original(self, fd: int) -> int:
        """The fd that ``fd`` pointed at before the capture (tuiprof's own messages)."""
        return self._saved.get(fd, fd)

    @staticmethod
    def _flush_python() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass

    # ------------------------------------------------------------------ reader
    def _read(self) -> None:
        pump(self._reads, self._chunk, lambda r: self._lines(r, b"", final=True))
        if self._log >= 0 and not self._saved:
            os.close(self._log)
            self._log = -1

    def _chunk(self, r: int, chunk: bytes) -> None:
        self._write(r, chunk)
        self._lines(r, chunk)

    def _write(self, r: int, chunk: bytes) -> None:
        self.bytes += len(chunk)
        write_all(chunk, self._log, self._saved.get(self._reads[r], self._reads[r])
                  if self.tee else -1)

    def _lines(self, r: int, chunk: bytes, final: bool = False) -> None:
        parts = split_lines(self._partial, r, chunk, final)
        if not parts:
            return
        self.lines += len(parts)
        keep = parts[-(self.store.output_len or len(parts)):]
        self.store.add_output([clean_line(p.decode("utf-8", "replace"), self._home)
                               for p in keep], skipped=len(parts) - len(keep))


class RelayedOutput:
    """The session process's side when another process relays the program's output: fds 1
    and 2 already point at that process's pipes, so a line is out of this process as soon as
    it is printed and nothing is lost if the program ends the process (``os._exit``), is killed
    or crashes. Only Python's own streams are made line-buffered here."""

    lines = 0

    def __init__(self, *_: object, **__: object) -> None:
        pass

    def start(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.reconfigure(line_buffering=True)
            except (AttributeError, ValueError, OSError):
                pass

    def stop(self, timeout: float = 2.0) -> None:
        OutputCapture._flush_python()

    flush = stop


class OutputRelay:
    """The program's stdout and stderr, read in the process that writes the snapshot (not the
    program's own): every byte to the log file as it arrives, optionally to this process's
    terminal (``tee``), and the newest sanitised lines in a bounded ring. The program's
    process gets the pipes' write ends (:meth:`child_fds`)."""

    def __init__(self, log_path: str | Path, tee: bool = False, ring: int = 1000) -> None:
        self.log_path = str(log_path)
        self.tee = tee
        self._ring: list[str] = []
        self._ring_len = ring
        self.lines = 0
        self.bytes = 0
        self._log = open_log(self.log_path)
        self._pipes = [os.pipe(), os.pipe()]     # (read, write) for the program's fd 1 and 2
        self._partial = {r: b"" for r, _ in self._pipes}
        self._to = {self._pipes[0][0]: 1, self._pipes[1][0]: 2}
        self._lock = threading.Lock()
        self._home = os.path.expanduser("~")
        self._thread = threading.Thread(target=self._read, name="tuiprof-relay", daemon=True)

    def child_fds(self) -> tuple[int, int]:
        """The write ends for the program's fds 1 and 2."""
        return self._pipes[0][1], self._pipes[1][1]

    def started(self) -> None:
        """The program's process has its copies: close ours (its end is then the pipes' end)
        and start reading."""
        for _, w in self._pipes:
            os.close(w)
        self._thread.start()

    def finish(self, timeout: float = 2.0) -> None:
        """Read to the end (at most ``timeout`` s more: a child of the program may still hold
        a pipe open) and close the log."""
        self._thread.join(timeout)
        with self._lock:
            if self._log >= 0:
                os.close(self._log)
                self._log = -1

    def recent(self) -> list[str]:
        with self._lock:
            return list(self._ring)

    def _read(self) -> None:
        pump([r for r, _ in self._pipes], self._chunk,
             lambda r: self._split(r, b"", final=True))

    def _chunk(self, r: int, chunk: bytes) -> None:
        self._write(r, chunk)
        self._split(r, chunk)

    def _write(self, r: int, chunk: bytes) -> None:
        with self._lock:
            self.bytes += len(chunk)
            write_all(chunk, self._log, self._to[r] if self.tee else -1)

    def _split(self, r: int, chunk: bytes, final: bool = False) -> None:
        parts = split_lines(self._partial, r, chunk, final)
        if not parts:
            return
        keep = parts[-self._ring_len:]
        lines = [clean_line(p.decode("utf-8", "replace"), self._home) for p in keep]
        with self._lock:
            self.lines += len(parts)
            self._ring = (self._ring + lines)[-self._ring_len:]
