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
import dataclasses
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

from ..errors import TuiprofError
from ..text import printable
from .common import say
from .options import child_options

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
                        "(tuiprof ls, tuiprof attach ID, tuiprof stop ID); left on, it samples "
                        "a quarter as often as the live app and reads NVML at 2 Hz "
                        "(--sample-every live --nvml-hz 10: the live app's rates)")
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


def parse_listen(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise TuiprofError(f"--listen {text}: give HOST:PORT (e.g. 127.0.0.1:7777)")
    return host or "127.0.0.1", int(port)


def check_listen(text: str | None) -> None:
    """Before a detached session starts, in the terminal: the address ``--listen`` names can be
    listened on now (a port in use said here, not in the keeper's log after the start)."""
    addr = parse_listen(text)
    if addr is None:
        return
    try:
        socket.create_server(addr, reuse_port=False).close()
    except OSError as exc:
        raise TuiprofError(f"--listen {printable(text, 80)}: cannot listen there: "
                           f"{exc.strerror or exc} (choose another port, or stop what holds "
                           f"it)") from None


def check_token_file(args: argparse.Namespace) -> None:
    """Before a listener starts, in the terminal: ``--token-file`` is checked when it exists,
    else made (and said so)."""
    from ..sessions.tokens import new_token_file, read_token_file  # noqa: PLC0415

    if not getattr(args, "listen", None) or not args.listen_token_file:
        return
    path = Path(args.listen_token_file)
    if os.path.lexists(path):
        read_token_file(path)
        return
    new_token_file(path)
    say(f"tuiprof: --token-file {printable(path, 200)} did not exist: wrote a new token there "
        f"(256 random bits, mode 0600); give the same file to tuiprof attach --connect")


def hold_options(args: argparse.Namespace, detached: bool = False):
    """How this run holds its session (:class:`~tuiprof.sessions.launch.HoldOptions`), from
    the command line."""
    from ..sessions.launch import HoldOptions  # noqa: PLC0415

    follow = None if getattr(args, "no_follow", False) or args.program is None \
        else child_options(args)
    return HoldOptions(export_dir=args.export_dir, follow=follow,
                       snapshot_every_min=float(getattr(args, "snapshot_every", 0) or 0),
                       listen=parse_listen(getattr(args, "listen", None)) if detached else None,
                       token_file=getattr(args, "listen_token_file", None))


def hold(args: argparse.Namespace, main: Any, *, name: str, kind: str, stem: str) -> Any:
    """The session ``main`` (a RemoteControl not started yet) held by this process as the
    command line asks (:func:`tuiprof.sessions.launch.hold`)."""
    from ..export.feeds import Feeds, check_feeds  # noqa: PLC0415
    from ..sessions.launch import hold as hold_session  # noqa: PLC0415

    feeds = Feeds(getattr(args, "feeds_parsed", None) or check_feeds(args))
    return hold_session(main, hold_options(args), name=name, kind=kind, stem=stem, feeds=feeds)


def feed_arguments(args: argparse.Namespace) -> dict:
    """The feeds asked for, as given (a keeper checks and starts them)."""
    from ..export.feeds import FEEDS  # noqa: PLC0415

    return {f.name: getattr(args, f"feed_{f.name}") for f in FEEDS
            if getattr(args, f"feed_{f.name}", None)}


def check_snapshot_every(minutes: float) -> None:
    """``--snapshot-every``: a finite number of minutes, 0 (only at the end) or more."""
    if not math.isfinite(minutes) or minutes < 0:
        raise TuiprofError(f"--snapshot-every {minutes:g}: minutes, 0 (only at the end) or a "
                           "positive number")


# ---------------------------------------------------------------------------- --detach
def start_detached(args: argparse.Namespace, name: str, launch: dict) -> int:
    """``tuiprof run --detach ...``: hand the session (``launch``: what to start, as plain
    data) to a keeper process, print its id."""
    if getattr(args, "tp", 1) != 1:
        raise TuiprofError("--detach with --tp is not supported yet: run the ranks live, or "
                           "detach a program that starts them (tuiprof run --detach -- torchrun ...)")
    if args.headless or args.in_process:
        raise TuiprofError("--detach runs the live session in the background: drop "
                           "--headless / --in-process")
    check_snapshot_every(args.snapshot_every)
    check_listen(args.listen)
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
    from ..sessions.launch import start_keeper  # noqa: PLC0415

    rt = _runtime()
    launch = dict(launch, hold=dataclasses.asdict(hold_options(args, detached=True)),
                  feeds=feed_arguments(args))
    sid, directory, info = start_keeper(launch, name)
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
           "cmd_attach", "cmd_attach_fleet", "cmd_stop", "hold_options", "feed_arguments"]
