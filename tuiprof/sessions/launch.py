"""Starting sessions, the layer that owns their processes: the session a run holds itself
(:func:`hold`), a detached session handed to a keeper process (:func:`start_keeper`), and the
session processes of ``--model`` and of a program (:func:`model_control`,
:func:`program_control`). The CLI parses and checks the command line into plain data
(:class:`HoldOptions`, a :class:`~tuiprof.spec.ProfilerOptions`, a program's description) and
prints; a detached session's keeper reads the same data back from ``launch.json``."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import TuiprofError
from ..program.launch import ProgramSpec, parse_program
from ..spec import ProfilerOptions
from . import runtime as rt
from .client import RemoteControl
from .follow import follow_env
from .holder import HeldSession
from .tokens import listen_token

DETACH_WAIT_S = 60.0       # how long `run --detach` waits for its keeper to start the session
LAUNCH_FILE = "launch.json"


@dataclasses.dataclass(frozen=True)
class HoldOptions:
    """How a run holds its session: where its files go, the options of every followed process
    of a program (None: not followed), and for a detached one its snapshots and listener."""

    export_dir: str = "."
    follow: dict | None = None
    snapshot_every_min: float = 0.0
    listen: tuple | None = None          # (host, port): a detached session's TCP listener
    token_file: str | None = None        # its token (--token-file), else one in its directory


def hold(main: Any, opts: HoldOptions, *, name: str, kind: str, stem: str,
         feeds: Any = None, detached: bool = False, directory: Path | None = None,
         sid: str | None = None) -> HeldSession:
    """The session ``main`` (a RemoteControl not started yet) as held by this process: its
    directory, socket, and for a program the environment that follows its processes."""
    try:
        if directory is None:
            sid, directory = rt.new_session_dir()
    except OSError as exc:
        raise TuiprofError(str(exc)) from None
    main.socket_path = str(directory / "main.sock")
    native = main.program is not None and getattr(main.program.get("spec"), "kind", "") == "native"
    if kind == "program" and opts.follow is not None and not native:
        main.follow_env = follow_env(str(directory / rt.SESSION_SOCKET), opts.follow)
    info = {"id": sid, "kind": kind, "name": name, "stem": stem, "state": "starting",
            "started": rt.now_utc(), "started_unix": time.time(),
            "export_dir": str(Path(opts.export_dir).resolve()),
            "log": main.program["log_path"] if main.program else None,
            "snapshot_every_min": opts.snapshot_every_min if detached else None,
            "cwd": os.getcwd()}
    listen = tuple(opts.listen) if detached and opts.listen else None
    token = listen_token(opts.token_file, directory) if listen else None
    if feeds is None:
        from ..export.feeds import Feeds  # noqa: PLC0415 - the feeds' modules load with them
        feeds = Feeds({})
    return HeldSession(main, directory, sid, info=info, detached=detached,
                       pull_every=2.0 if detached else 1.0, listen=listen, token=token,
                       feeds=feeds)


# ---------------------------------------------------------------------------- the controls
def model_control(options: ProfilerOptions, store_kwargs: dict,
                  export_dir: str) -> RemoteControl:
    """The session process of the built-in engine (``options.engine``), not started."""
    return RemoteControl(options, store_kwargs, orphan_snapshot_dir=export_dir)


def prepare_native(spec: ProgramSpec, cupti: bool) -> None:
    """A native program's injection library, built now (cached after the first time): a
    missing compiler or missing headers is one line before anything starts."""
    if spec.kind == "native" and cupti:
        from ..injection.build import build  # noqa: PLC0415 - a compiler run, rarely

        build()


def _new_log(export: Path, base: str) -> Path:
    """A log file of its own: sessions started in the same second into one directory (the
    nodes of a job on one machine) each get theirs (``-2``, ``-3``, …), never a shared one.
    0600 as a headless run's: a program's output can hold what only its user may read."""
    for n in range(1, 1000):
        path = export / (f"{base}.log" if n == 1 else f"{base}-{n}.log")
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return path
        except FileExistsError:
            continue
    raise OSError(f"{base}.log and 998 more exist already")


def program_control(spec: ProgramSpec, stem: str, options: ProfilerOptions, store_kwargs: dict,
                    export_dir: str, sources: dict, proxy: str | None = None,
                    meta: Any = None) -> RemoteControl:
    """The session process that runs the program ``spec``, not started; its output goes to a
    log of its own in ``export_dir``."""
    prepare_native(spec, options.cupti)
    export = Path(export_dir)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        export.mkdir(parents=True, exist_ok=True)
        log = _new_log(export, f"tuiprof-{stem}-{stamp}")
    except OSError as exc:
        raise TuiprofError(f"cannot write the program's log in {export}: "
                           f"{exc.strerror or exc}") from None
    program = {"spec": spec, "log_path": str(log), "options": sources, "proxy": proxy,
               "meta": meta}
    return RemoteControl(options, store_kwargs, orphan_snapshot_dir=export_dir, program=program)


# ---------------------------------------------------------------------------- detached
def start_keeper(launch: dict, name: str) -> tuple[str, Path, dict]:
    """A detached session: a new session directory, ``launch`` (plain data: what to start and
    how to hold it) written there, and a keeper process (``python -m tuiprof.sessions.keeper
    DIR``) in a new session (no terminal) that starts it. Returns (id, directory, its info)
    once the keeper says how the start went, or after ``DETACH_WAIT_S``."""
    try:
        sid, directory = rt.new_session_dir()
    except OSError as exc:
        raise TuiprofError(str(exc)) from None
    rt.write_json(directory / LAUNCH_FILE, dict(launch, cwd=os.getcwd()))
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
    return sid, directory, rt.read_info(directory) or info


def held_from_launch(directory: Path) -> HeldSession:
    """What a keeper holds: the session ``launch.json`` in ``directory`` describes."""
    with open(directory / LAUNCH_FILE, encoding="utf-8") as fh:
        launch = json.load(fh)
    os.chdir(launch["cwd"])
    options = ProfilerOptions.from_json(launch["options"])
    store_kwargs = dict(launch.get("store") or {})
    opts = HoldOptions(**launch["hold"])
    if launch["kind"] == "program":
        prog = launch["program"]
        spec = parse_program(list(prog["argv"]))
        main = program_control(spec, launch["stem"], options, store_kwargs, opts.export_dir,
                               prog.get("options") or {}, prog.get("proxy"), prog.get("meta"))
        name = spec.name
    else:
        main = model_control(options, store_kwargs, opts.export_dir)
        name = options.engine.model
    from types import SimpleNamespace  # noqa: PLC0415

    from ..export.feeds import Feeds, check_feeds  # noqa: PLC0415
    feeds = Feeds(check_feeds(SimpleNamespace(**{f"feed_{k}": v for k, v in
                                                 (launch.get("feeds") or {}).items()})))
    held = hold(main, opts, name=name, kind=launch["kind"], stem=launch["stem"], feeds=feeds,
                detached=True, directory=directory, sid=directory.name)
    held.info["started"] = (rt.read_info(directory) or {}).get("started", held.info["started"])
    return held


__all__ = ["HoldOptions", "hold", "model_control", "program_control", "prepare_native",
           "start_keeper", "held_from_launch", "DETACH_WAIT_S", "LAUNCH_FILE"]
