"""Sessions that outlive a terminal: ``tuiprof run --detach``, ``tuiprof ls``, ``tuiprof attach
[ID]``, ``tuiprof stop ID``; and the session every live run holds (docs/remote.md).

A live ``tuiprof run`` holds its session itself (:class:`~tuiprof.sessions.holder.HeldSession`:
the session's directory, its socket, a mirror of every process). ``--detach`` hands the same
thing to a *keeper*: a process of its own (``python -m tuiprof.sessions.keeper DIR``), in a new
session (no terminal: a closed SSH connection does not reach it), that writes a snapshot every
``--snapshot-every`` minutes and at the end, and that UIs attach to.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import secrets
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import TuiprofError
from ..text import printable
from .common import say

DETACH_WAIT_S = 60.0       # how long `run --detach` waits for its keeper to start the session
DEFAULT_SNAPSHOT_MIN = 15.0


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "attach":
        p.add_argument("id", nargs="*", metavar="ID|HOST:PORT|SOCKET",
                       help="the session (tuiprof ls; not needed when only one runs); or "
                            "several hosts' sessions in one UI: [NAME=]HOST:PORT (TCP, "
                            "--token-file) or [NAME=]PATH (a socket forwarded with ssh -L), "
                            "mixed (docs/fleet.md)")
        p.add_argument("--connect", metavar="SOCKET|HOST:PORT",
                       help="a session's socket forwarded from another machine (ssh -L "
                            "LOCAL.sock:REMOTE/s.sock), or a session listening on TCP (tuiprof "
                            "run --detach --listen; needs --token-file); docs/remote.md")
        p.add_argument("--token-file", action="append", default=[],
                       help="the file holding the session's token (--connect, HOST:PORT); "
                            "once for every TCP address, or once each in order")
        p.add_argument("--export-dir", default=".", help="where e writes its snapshot")
    elif name == "stop":
        p.add_argument("id", help="the session to end (tuiprof ls)")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """``tuiprof run``'s options for sessions that outlive the terminal."""
    g = p.add_argument_group("long-running sessions (docs/remote.md)")
    g.add_argument("--detach", action="store_true",
                   help="run the session in the background, print its id and exit "
                        "(tuiprof ls, tuiprof attach ID, tuiprof stop ID)")
    g.add_argument("--snapshot-every", type=float, default=DEFAULT_SNAPSHOT_MIN, metavar="MIN",
                   help="a detached session writes its snapshot every MIN minutes (0: only "
                        f"at its end; default {DEFAULT_SNAPSHOT_MIN:g})")
    g.add_argument("--listen", metavar="HOST:PORT",
                   help="a detached session also listens on TCP, with a token (written to "
                        "the file --token-file names, or to the session's directory); "
                        "without it only its Unix socket (reach it over ssh -L)")
    g.add_argument("--token-file", dest="listen_token_file",
                   help="the token for --listen: read from this file if it exists, else "
                        "written there")
    g.add_argument("--no-follow", action="store_true",
                   help="a program's child processes are not profiled (default: every "
                        "Python process it starts is)")
    from ..export.feeds import add_feed_arguments  # noqa: PLC0415
    add_feed_arguments(p)


def run(name: str, args: argparse.Namespace) -> int:
    if name == "ls":
        return cmd_ls(args)
    if name == "attach":
        return cmd_attach(args)
    if name == "stop":
        return cmd_stop(args)
    raise TuiprofError(f"unknown command {name}")


# ---------------------------------------------------------------------------- holding
def _runtime():
    from ..sessions import runtime  # noqa: PLC0415

    return runtime


def child_options(args: argparse.Namespace) -> dict:
    """What each followed process of a program collects: the session process's options."""
    from .program import sample_every, source_options  # noqa: PLC0415

    # the main process's policy, resolved: every process samples as the main one does
    return {"cupti": not args.no_cupti, "nvml": not args.no_nvml, "nvml_hz": args.nvml_hz,
            "sample_every": sample_every(args, bool(getattr(args, "headless", False))), "alloc_every": args.alloc_every,
            "detach_between_bursts": not args.cupti_attached, "ring_tokens": args.ring_tokens,
            "sources": {k: v for k, v in source_options(args).items()
                        if isinstance(v, (str, int, float, list, type(None)))}}


def parse_listen(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise TuiprofError(f"--listen {text}: give HOST:PORT (e.g. 127.0.0.1:7777)")
    return host or "127.0.0.1", int(port)


TOKEN_BITS = 80          # the least estimated entropy of a listener's token
TOKEN_CHARS = 20         # and the fewest characters (a new token: 43, 256 random bits)
MAKE_TOKEN = ("remove it and tuiprof writes a new one (0600), or: python3 -c 'import secrets; "
              "print(secrets.token_urlsafe(32))' > FILE && chmod 600 FILE")


def token_weakness(token: str) -> str | None:
    """Why ``token`` is too easy to guess (None: it is not, as far as can be told): too short;
    too few bits by its characters' frequencies (``xxxx…``, ``password123…``); a run of one
    step (``abcdef…``, ``1212…``); one class of characters only (a phrase of lower-case
    words)."""
    n = len(token)
    if n < TOKEN_CHARS:
        return f"{n} characters (at least {TOKEN_CHARS})"
    counts = collections.Counter(token)
    bits = -sum(c * math.log2(c / n) for c in counts.values())
    if bits < TOKEN_BITS:
        return f"about {max(bits, 0.0):.0f} bits of entropy by its characters (at least {TOKEN_BITS})"
    steps = collections.Counter(ord(b) - ord(a) for a, b in zip(token, token[1:]))
    if steps.most_common(1)[0][1] * 3 > n - 1:
        return "a repeating sequence of characters"
    classes = sum(any(f(ch) for ch in token) for f in (
        str.islower, str.isupper, str.isdigit, lambda ch: not ch.isalnum() and not ch.isspace()))
    if classes < 2:
        return "one class of characters only"
    return None


def read_token_file(path: Path, flag: str = "--token-file") -> str:
    """A listener's token from ``path``: a regular file owned by this user that nobody else
    may read or write, holding a token hard to guess; anything else is refused in one line
    (another local user who could read it could stop or read the session)."""
    where = f"{flag} {printable(path, 200)}"
    try:
        st = os.stat(path)
    except OSError as exc:
        raise TuiprofError(f"{where}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise TuiprofError(f"{where}: not a regular file; {MAKE_TOKEN}")
    if st.st_uid != os.geteuid():
        raise TuiprofError(f"{where}: owned by uid {st.st_uid}, not by you (uid "
                           f"{os.geteuid()}); {MAKE_TOKEN}")
    if st.st_mode & 0o077:
        raise TuiprofError(f"{where}: group or others may read or write it (mode "
                           f"{stat.S_IMODE(st.st_mode):04o}); chmod 600 it, or {MAKE_TOKEN}")
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TuiprofError(f"{where}: cannot read it: {getattr(exc, 'strerror', None) or exc}") \
            from None
    weak = token_weakness(token)
    if weak:
        raise TuiprofError(f"{where}: the token is too easy to guess: {weak}; {MAKE_TOKEN}")
    return token


def new_token_file(path: Path) -> str:
    """A new token (256 random bits) in a new file ``path``, 0600; never over an existing one."""
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise TuiprofError(f"--token-file {printable(path, 200)}: cannot create it: "
                           f"{exc.strerror or exc}") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


def check_token_file(args: argparse.Namespace) -> None:
    """Before a listener starts, in the terminal: ``--token-file`` is checked when it exists,
    else made (and said so)."""
    if not getattr(args, "listen", None) or not args.listen_token_file:
        return
    path = Path(args.listen_token_file)
    if os.path.lexists(path):
        read_token_file(path)
        return
    new_token_file(path)
    say(f"tuiprof: --token-file {printable(path, 200)} did not exist: wrote a new token there "
        f"(256 random bits, mode 0600); give the same file to tuiprof attach --connect")


def listen_token(args: argparse.Namespace, directory: Path) -> str | None:
    """The token of a TCP listener: from --token-file when it exists (checked: a file only
    this user can read, a token hard to guess), else a new one written there (or in the
    session's directory), 0600."""
    if not getattr(args, "listen", None):
        return None
    path = Path(args.listen_token_file) if args.listen_token_file else directory / "token"
    if os.path.lexists(path):
        return read_token_file(path)
    return new_token_file(path)


def hold(args: argparse.Namespace, main: Any, *, name: str, kind: str, stem: str,
         detached: bool = False, directory: Path | None = None, sid: str | None = None) -> Any:
    """The session ``main`` (a RemoteControl not started yet) as held by this process: its
    directory, socket, and for a program the environment that follows its processes."""
    from ..sessions.follow import follow_env  # noqa: PLC0415
    from ..sessions.holder import HeldSession  # noqa: PLC0415

    rt = _runtime()
    try:
        if directory is None:
            sid, directory = rt.new_session_dir()
    except OSError as exc:
        raise TuiprofError(str(exc)) from None
    main.socket_path = str(directory / "main.sock")
    native = main.program is not None and getattr(main.program.get("spec"), "kind", "") == "native"
    if kind == "program" and not getattr(args, "no_follow", False) and not native:
        main.follow_env = follow_env(str(directory / rt.SESSION_SOCKET), child_options(args))
    every = float(getattr(args, "snapshot_every", 0) or 0)
    info = {"id": sid, "kind": kind, "name": name, "stem": stem, "state": "starting",
            "started": rt.now_utc(), "started_unix": time.time(),
            "export_dir": str(Path(args.export_dir).resolve()),
            "log": main.program["log_path"] if main.program else None,
            "snapshot_every_min": every if detached else None, "cwd": os.getcwd()}
    listen = parse_listen(getattr(args, "listen", None)) if detached else None
    token = listen_token(args, directory) if listen else None
    from ..export.feeds import Feeds, check_feeds  # noqa: PLC0415

    feeds = Feeds(getattr(args, "feeds_parsed", None) or check_feeds(args))
    return HeldSession(main, directory, sid, info=info, detached=detached,
                       pull_every=2.0 if detached else 1.0, listen=listen, token=token,
                       feeds=feeds)


def check_snapshot_every(minutes: float) -> None:
    """``--snapshot-every``: a finite number of minutes, 0 (only at the end) or more."""
    if not math.isfinite(minutes) or minutes < 0:
        raise TuiprofError(f"--snapshot-every {minutes:g}: minutes, 0 (only at the end) or a "
                           "positive number")


# ---------------------------------------------------------------------------- --detach
def start_detached(args: argparse.Namespace, name: str) -> int:
    """``tuiprof run --detach ...``: hand the session to a keeper process, print its id."""
    if getattr(args, "tp", 1) != 1:
        raise TuiprofError("--detach with --tp is not supported yet: run the ranks live, or "
                           "detach a program that starts them (tuiprof run --detach -- torchrun ...)")
    if args.headless or args.in_process:
        raise TuiprofError("--detach runs the live session in the background: drop "
                           "--headless / --in-process")
    check_snapshot_every(args.snapshot_every)
    parse_listen(args.listen)
    export = Path(args.export_dir)
    # a detached session writes there for hours with nobody watching: a mistyped directory
    # is said now rather than made (the live app's is in front of its user)
    if not export.is_dir():
        raise TuiprofError(f"--export-dir {printable(export, 200)}: "
                           + ("not a directory" if export.exists() else
                              "no such directory (create it first)"))
    if not os.access(export, os.W_OK | os.X_OK):
        raise TuiprofError(f"--export-dir {printable(export, 200)}: cannot write there "
                           "(permission denied)")
    check_token_file(args)
    rt = _runtime()
    try:
        sid, directory = rt.new_session_dir()
    except OSError as exc:
        raise TuiprofError(str(exc)) from None
    argv = [a for a in args.argv if a != "--detach"]
    rt.write_json(directory / "args.json", {"argv": argv, "cwd": os.getcwd()})
    rt.write_info(directory, {"id": sid, "name": name, "state": "starting",
                              "started": rt.now_utc(), "started_unix": time.time()})
    log = os.fdopen(os.open(directory / "keeper.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                            0o600), "ab")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "tuiprof.sessions.keeper", str(directory)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True)
    finally:
        log.close()
    t_end = time.monotonic() + DETACH_WAIT_S
    info: dict = {}
    while time.monotonic() < t_end:
        info = rt.read_info(directory) or {}
        if info.get("state") not in (None, "starting") or proc.poll() is not None:
            break
        time.sleep(0.1)
    info = rt.read_info(directory) or info
    state = info.get("state")
    if state not in ("running", "ended", "stopped"):
        why = info.get("error") or _tail(directory / "keeper.log") or "it did not start in time"
        raise TuiprofError(f"the detached session did not start: {why} (session {sid}; "
                           f"tuiprof stop {sid} removes it)")
    say(f"tuiprof: session {sid} started: {printable(name, 60)} (pid {info.get('pid')})")
    say(f"tuiprof: attach: tuiprof attach {sid} · stop: tuiprof stop {sid} · list: tuiprof ls")
    snap = info.get("snapshot")
    every = args.snapshot_every
    say(f"tuiprof: snapshot {'every %g min and ' % every if every else ''}at its end: "
        f"{snap or '(in ' + str(export) + ')'}" + (f" · log {info['log']}" if info.get("log") else ""))
    if info.get("listen"):
        tok = args.listen_token_file or str(directory / "token")
        say(f"tuiprof: listening on {info['listen']} (token in {tok}); prefer ssh -L to "
            f"{directory / rt.SESSION_SOCKET}")
    print(sid)
    return 0


def _tail(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return printable(lines[-1], 200) if lines else ""


# ---------------------------------------------------------------------------- ls
def _ask(directory: Path, op: str, timeout: float = 3.0) -> Any:
    from ..sessions import protocol  # noqa: PLC0415

    c = protocol.Client.unix(str(directory / _runtime().SESSION_SOCKET), role="control",
                             timeout=timeout)
    try:
        return c.request(op, timeout=timeout)
    finally:
        c.close(bye=True)


def session_state(directory: Path) -> dict:
    """A session's facts for ``ls``: its info, and live figures when it answers."""
    from ..sessions import protocol  # noqa: PLC0415

    rt = _runtime()
    info = rt.read_info(directory) or {"id": directory.name, "state": "unknown"}
    info.setdefault("id", directory.name)
    if info.get("state") in rt.LIVE_STATES:
        try:
            live = _ask(directory, "info")
            if isinstance(live, dict):
                info.update(live)
        except protocol.ProtocolError:
            holder = info.get("holder_pid")
            info["state"] = ("dead" if not rt.pid_alive(holder) or not
                             (directory / rt.SESSION_SOCKET).exists() else "not answering")
    return info


def cmd_ls(args: argparse.Namespace) -> int:
    rt = _runtime()
    try:
        dirs = rt.session_dirs()
    except OSError as exc:
        raise TuiprofError(str(exc)) from None
    rows = []
    for d in dirs:
        i = session_state(d)
        if i.get("kind") is None and i.get("state") == "unknown":
            continue
        state = str(i.get("state", "?"))
        if state in ("ended", "stopped") and i.get("exit_status") is not None:
            state += f" (exit {i['exit_status']})"
        elif state == "running":
            n = i.get("processes") or 1
            state += f" ({n} processes)" if type(n) is int and n > 1 else ""
            if not i.get("detached"):
                state += " [live app]"
        # info.json is written by a session's processes but read back as untrusted text: a
        # field of the wrong type is shown as it is (escaped), never raised over
        rows.append((printable(i.get("id"), 40), printable(i.get("name") or "?", 32),
                     printable(i.get("started") or "?", 32), printable(i.get("pid") or "–", 12),
                     _count(i.get("steps"), "0"), _count(i.get("requests"), "–"),
                     printable(state, 40)))
    if not rows:
        print("no sessions (start one with tuiprof run --detach -- python SCRIPT.py)")
        return 0
    head = ("ID", "PROGRAM/MODEL", "STARTED (UTC)", "PID", "STEPS", "REQUESTS", "STATE")
    widths = [max(len(r[k]) for r in rows + [head]) for k in range(len(head))]
    for r in [head] + rows:
        print("  ".join(c.ljust(w) if k not in (3, 4, 5) else c.rjust(w)
                        for k, (c, w) in enumerate(zip(r, widths))).rstrip())
    return 0


def _count(value: Any, none: str) -> str:
    """A count of ``ls`` (steps, requests): grouped when it is a whole number, else what the
    file holds, escaped."""
    if not value:
        return none
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}"
    return printable(value, 16)


# ---------------------------------------------------------------------------- attach, stop
def _session(sid: str | None) -> tuple[Path, dict]:
    """The directory of session ``sid`` (a prefix; None: the only one running) and its facts
    now; one line when there is no such session."""
    try:
        directory = _runtime().find_session(sid)
    except (LookupError, OSError) as exc:
        raise TuiprofError(str(exc)) from None
    return directory, session_state(directory)


def cmd_attach(args: argparse.Namespace) -> int:
    from ..sessions import protocol  # noqa: PLC0415
    from ..sessions.attached import AttachedSession  # noqa: PLC0415

    from ..sessions.fleet import is_address  # noqa: PLC0415

    rt = _runtime()
    ids = list(args.id or [])
    if ids and (len(ids) > 1 or is_address(ids[0])):
        if args.connect:
            raise TuiprofError("give the hosts as arguments, or one --connect, not both")
        return cmd_attach_fleet(args, ids)
    if len(args.token_file) > 1:
        raise TuiprofError("--token-file once with --connect")
    args.token_file = args.token_file[0] if args.token_file else None
    args.id = ids[0] if ids else None
    if args.connect and ("/" in args.connect or args.connect.endswith(".sock")):
        path = args.connect   # a session's socket forwarded here (ssh -L LOCAL.sock:REMOTE)

        def connect(role: str, **facts: Any) -> Any:
            return protocol.Client.unix(path, role=role, **facts)
        sid = args.id or Path(path).name
    elif args.connect:
        host, port = parse_listen(args.connect)  # type: ignore[misc]
        if not args.token_file:
            raise TuiprofError("--connect needs --token-file (the session's token)")
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise TuiprofError(f"cannot read {args.token_file}: {exc.strerror or exc}") from None

        def connect(role: str, **facts: Any) -> Any:
            return protocol.Client.tcp(host, port, token, role=role, **facts)
        sid = args.id or f"{host}:{port}"
    else:
        directory, info = _session(args.id)
        sid = directory.name
        if info.get("state") in ("ended", "stopped"):
            return _view_ended(info, sid)
        if info.get("state") not in ("running", "stopping"):
            raise TuiprofError(f"session {sid} is not running ({info.get('state')}): its keeper "
                               f"is gone; last snapshot: {info.get('snapshot') or 'none'} "
                               f"(tuiprof stop {sid} removes it)")
        path = str(directory / rt.SESSION_SOCKET)

        def connect(role: str, **facts: Any) -> Any:
            return protocol.Client.unix(path, role=role, **facts)
    ctl = AttachedSession(connect, sid)
    try:
        ctl.start()
    except (protocol.ProtocolError, protocol.RemoteError) as exc:
        ctl.close()
        raise TuiprofError(f"cannot attach to session {sid}: {exc}") from None
    from ..ui.app import run_app  # noqa: PLC0415

    name = printable(ctl.info.get("name") or sid, 40)
    return run_app(ctl, title=f"tuiprof {name} (session {sid})", export_dir=Path(args.export_dir),
                   auto_snapshot=False)


def cmd_attach_fleet(args: argparse.Namespace, texts: list) -> int:
    """``tuiprof attach HOST1:PORT HOST2:PORT …``: one UI over every host's session."""
    from ..sessions.fleet import FleetSession, parse_addresses  # noqa: PLC0415

    tokens = []
    for f in args.token_file:
        try:
            tokens.append(Path(f).read_text().strip())
        except OSError as exc:
            raise TuiprofError(f"cannot read {f}: {exc.strerror or exc}") from None
    try:
        addresses = parse_addresses(texts, tokens)
    except ValueError as exc:
        raise TuiprofError(str(exc)) from None
    ctl = FleetSession(addresses)
    ctl.start()
    # the first host that answers opens the UI; the others join as they answer (or read
    # as not reached, tried again)
    t_end = time.monotonic() + FLEET_FIRST_S
    while time.monotonic() < t_end and not any(h.state == "attached" for h in ctl.hosts):
        time.sleep(0.05)
    if not any(h.state == "attached" for h in ctl.hosts):
        why = "; ".join(f"{h.name}: {h.why or 'no answer'}" for h in ctl.hosts)
        ctl.close()
        raise TuiprofError(f"cannot attach to any host: {printable(why, 300)}")
    from ..ui.app import run_app  # noqa: PLC0415

    names = printable(", ".join(h.name for h in ctl.hosts), 60)
    return run_app(ctl, title=f"tuiprof fleet: {names}", export_dir=Path(args.export_dir),
                   auto_snapshot=False)


FLEET_FIRST_S = 15.0   # how long `attach` waits for a first host before saying none answers


def _view_ended(info: dict, sid: str) -> int:
    """An ended session: its final snapshot, read-only."""
    snap = info.get("snapshot")
    if not snap or not Path(snap).is_file():
        raise TuiprofError(f"session {sid} has ended (exit status {info.get('exit_status')}) "
                           f"and left no snapshot; tuiprof stop {sid} removes it")
    say(f"tuiprof: session {sid} has ended (exit status {info.get('exit_status')}); its final "
        f"snapshot, read-only: {snap}")
    from .files import run as files_run  # noqa: PLC0415

    return files_run("view", argparse.Namespace(snapshot=snap, path=snap, file=snap))


def cmd_stop(args: argparse.Namespace) -> int:
    from ..sessions import protocol  # noqa: PLC0415

    rt = _runtime()
    directory, info = _session(args.id)
    sid = directory.name
    state = info.get("state")
    if state in ("running", "stopping"):
        if not info.get("detached"):
            raise TuiprofError(f"session {sid} belongs to a live app: quit it there (q)")
        try:
            path = _ask(directory, "stop", timeout=330.0)
        except protocol.RemoteError as exc:
            raise TuiprofError(f"session {sid}: {exc}") from None
        except protocol.ProtocolError as exc:
            raise TuiprofError(f"session {sid} did not answer: {exc}") from None
        info = rt.read_info(directory) or info
        print(f"tuiprof: session {sid} stopped; snapshot: "
              f"{printable(path or info.get('snapshot'), 300)}")
        return 0
    snap = printable(info.get("snapshot") or "none", 300)
    import shutil  # noqa: PLC0415
    shutil.rmtree(directory, ignore_errors=True)
    if state in ("ended", "stopped"):
        print(f"tuiprof: session {sid} had ended (exit status "
              f"{printable(info.get('exit_status'), 12)}); snapshot: {snap}; removed from the list")
    else:
        print(f"tuiprof: session {sid} was not running ({printable(state, 40)}); last snapshot: "
              f"{snap}; removed from the list")
    return 0


__all__ = ["add_arguments", "add_run_arguments", "run", "hold", "start_detached", "cmd_ls",
           "cmd_attach", "cmd_attach_fleet", "cmd_stop", "child_options"]
