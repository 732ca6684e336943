"""Where sessions live: one private directory per user, one directory per session in it.

``$TUIPROF_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/tuiprof``, else ``/tmp/tuiprof-<uid>``;
created 0700 and refused unless it is a real directory owned by this user that nobody else
can enter. A session's directory (0700) holds:

* ``s.sock``: the session's server (the processes of the program register there, UIs
  attach there);
* ``p<pid>.sock``: each profiled process's own server (its store);
* ``info.json``: what ``tuiprof ls`` shows (id, program, started, pids, state, exit status,
  last snapshot), rewritten atomically by the process that holds the session;
* ``launch.json``: what a detached session's keeper starts and how it holds it (plain data);
* ``crash-<pid>.txt``: a process's fatal-signal report (Python's faulthandler);
* ``token``: the token of a TCP listener (``--listen``), 0600.

Standard library only (a program's child processes import it at start-up).
"""
from __future__ import annotations

import json
import os
import secrets
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

RUNTIME_ENV = "TUIPROF_RUNTIME_DIR"
SESSION_SOCKET = "s.sock"
INFO = "info.json"
MAX_INFO_BYTES = 1 << 20


class RuntimeDirError(OSError):
    """The runtime directory cannot be used safely (one line that says why)."""


def runtime_root(create: bool = True) -> Path:
    """The per-user directory of sessions (created private when missing)."""
    base = os.environ.get(RUNTIME_ENV)
    if base:
        root = Path(base)
    else:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        root = (Path(xdg) / "tuiprof" if xdg and _owned_private(Path(xdg))
                else Path(tempfile.gettempdir()) / f"tuiprof-{os.getuid()}")
    if create:
        ensure_private(root)
    return root


def _owned_private(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & 0o077)


def ensure_private(path: Path) -> Path:
    """Create ``path`` 0700 (parents as needed) or check that it is private to this user."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise RuntimeDirError(f"cannot create {path}: {exc.strerror or exc}") from None
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise RuntimeDirError(f"cannot use {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeDirError(f"{path} is not a directory (a link or a file): tuiprof keeps "
                              f"its sessions' sockets there; remove it or set {RUNTIME_ENV}")
    if st.st_uid != os.getuid():
        raise RuntimeDirError(f"{path} belongs to uid {st.st_uid}, not to you: set "
                              f"{RUNTIME_ENV} to a directory of your own")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)   # ours, but others could enter: close it
    return path


def new_session_dir(prefix: str = "") -> tuple[str, Path]:
    """A fresh session: (id, its private directory)."""
    root = runtime_root()
    for _ in range(100):
        sid = prefix + secrets.token_hex(3)
        d = root / sid
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue
        except OSError as exc:
            raise RuntimeDirError(f"cannot create {d}: {exc.strerror or exc}") from None
        return sid, d
    raise RuntimeDirError(f"cannot find a free session id in {root}")


def session_dirs() -> list[Path]:
    """Every session directory, oldest first."""
    root = runtime_root()
    out = []
    for d in root.iterdir():
        try:
            if d.is_dir() and not d.is_symlink():
                out.append((d.stat().st_mtime, d))
        except OSError:
            continue
    return [d for _, d in sorted(out)]


def find_session(sid: str | None) -> Path:
    """The directory of session ``sid`` (a unique prefix is enough; None: the only live
    session). Raises LookupError with a one-line reason."""
    if sid is not None and not sid.strip():
        # an empty prefix would name every session: with one session, stop "" stopped it
        raise LookupError("an empty session id: give one (tuiprof ls lists them)")
    dirs = session_dirs()
    if sid is None:
        live = [d for d in dirs if (read_info(d) or {}).get("state") in LIVE_STATES]
        if len(live) == 1:
            return live[0]
        if not live:
            raise LookupError("no running session (tuiprof ls lists them all; start one with "
                              "tuiprof run --detach ...)")
        raise LookupError(f"{len(live)} sessions are running: name one (tuiprof ls): "
                          + ", ".join(d.name for d in live))
    hits = [d for d in dirs if d.name == sid] or [d for d in dirs if d.name.startswith(sid)]
    if not hits:
        raise LookupError(f"no session {sid!r} (tuiprof ls lists them)")
    if len(hits) > 1:
        raise LookupError(f"{sid!r} names {len(hits)} sessions: "
                          + ", ".join(d.name for d in hits))
    return hits[0]


LIVE_STATES = ("starting", "running", "stopping")


def write_info(directory: Path, info: dict) -> None:
    """Rewrite the session's ``info.json`` atomically (a reader sees the old or the new)."""
    data = json.dumps(info, sort_keys=True, default=str).encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=".info.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, directory / INFO)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_info(directory: Path) -> dict | None:
    """The session's ``info.json`` (None when missing or unreadable)."""
    try:
        with open(directory / INFO, "rb") as fh:
            data = fh.read(MAX_INFO_BYTES + 1)
        if len(data) > MAX_INFO_BYTES:
            return None
        obj = json.loads(data)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def write_json(path: Path, obj: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, ValueError):
        return True
    try:   # a zombie has ended (its parent has not read its status yet)
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def now_utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


__all__ = ["RUNTIME_ENV", "SESSION_SOCKET", "RuntimeDirError", "runtime_root", "ensure_private",
           "new_session_dir", "session_dirs", "find_session", "write_info", "read_info",
           "pid_alive", "LIVE_STATES", "write_json"]
