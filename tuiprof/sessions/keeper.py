"""A detached session's keeper: ``python -m tuiprof.sessions.keeper DIR`` (``tuiprof run
--detach`` starts it in a new session, so no terminal's SIGHUP reaches it).

It holds the session like the live app does (:class:`~tuiprof.sessions.holder.HeldSession`),
without a screen: it starts the session process, mirrors every process (one light pull every
two seconds: the cost to the session while nobody is attached), serves ``s.sock`` (processes
register, UIs attach, ``tuiprof stop`` asks it to end), writes the session's snapshot every
``--snapshot-every`` minutes and at the end (each write atomic: a failed write leaves the
previous snapshot whole), and keeps ``info.json`` up to date for ``tuiprof ls``.

It ends when the program's main process ends (or the built-in engine stops), on ``tuiprof
stop``, or on SIGTERM; each time after the final snapshot, leaving the exit status and the
snapshot's path in ``info.json``.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from ..errors import one_line
from .launch import held_from_launch
from .runtime import read_info, write_info

TICK_S = 0.5


def snapshot_path(held: Any) -> Path:
    stem = str(held.info.get("stem") or "session")
    return Path(held.info["export_dir"]) / f"tuiprof-{stem}-{held.sid}.json"


def write_snapshot(held: Any, reason: str) -> str | None:
    """The session's snapshot now (atomic: the previous one stays if this write fails)."""
    path = snapshot_path(held)
    try:
        out = held.write_snapshot(path)
    except Exception as exc:
        line = f"{reason} snapshot failed: {one_line(exc)}; the previous one is kept"
        held.notice(line)
        held.save_info(snapshot_error=line)
        return None
    held.save_info(snapshot=out, snapshot_at=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                   snapshot_error=None)
    return out


def program_over(held: Any) -> str | None:
    """Why the session is over by itself (None while it runs)."""
    main = held.main
    if held.program_ended:
        return "ended"
    if main._gone:
        return "died"
    if main.program is None and main.status.state in ("done", "error") and main.pulls:
        return "ended"
    return None


STOP_GRACE_S = 10.0   # a stopped program gets this long to end after its Ctrl-C


def end_program(held: Any) -> None:
    """Ctrl-C for a program still running (KeyboardInterrupt, as in the live app), and a
    moment to end by itself: a server shuts down cleanly, its exit status is kept."""
    main = held.main
    prog = (main.status.extra or {}).get("program") or {}
    if main.program is None or not prog.get("running") or main._gone:
        return
    try:
        main.call("interrupt", timeout=5)
    except Exception:
        return
    t_end = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < t_end and not held.program_ended:
        time.sleep(0.1)


def keep(held: Any, every_min: float) -> int:
    """Run the detached session until it ends; returns the keeper's exit status."""
    held.snapshot_now = lambda: write_snapshot(held, "asked")
    held.save_info(state="starting")
    held.start(running=False)
    held.main._connected.wait(120)   # "running" once the session process answers its owner
    held.save_info(state="running" if not held.main._gone else "error",
                   error=held.main.status.message if held.main._gone else None)
    every = every_min * 60.0
    next_at = time.monotonic() + every if every > 0 else None
    why = "stopped"
    while not held.stop_requested.wait(TICK_S):
        over = program_over(held)
        if over:
            why = over
            break
        if next_at is not None and time.monotonic() >= next_at:
            write_snapshot(held, "periodic")
            next_at += every
    held.save_info(state="stopping")
    if why == "stopped":
        end_program(held)
    held.stop()
    final = write_snapshot(held, "final")
    held.final_snapshot = final
    st = held.main.status
    prog = (st.extra or {}).get("program") or {}
    held.save_info(state="stopped" if why == "stopped" else "ended", end=why,
                   ended_at=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                   exit_status=prog.get("exit_status", held.info.get("exit_status")),
                   **held.totals())
    held.stopped.set()
    time.sleep(0.3)   # `tuiprof stop` gets its answer before the socket goes
    held.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    directory = Path(argv[0])
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)   # no terminal: these come from nobody it serves
    stop = threading.Event()
    try:
        held = held_from_launch(directory)
    except BaseException as exc:  # one line for `run --detach` to print
        traceback.print_exc()
        info = read_info(directory) or {}
        info.update(state="error", error=one_line(exc) if isinstance(exc, Exception) else str(exc))
        write_info(directory, info)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: held.stop_requested.set())
    del stop
    try:
        return keep(held, float(held.info.get("snapshot_every_min") or 0))
    except BaseException as exc:
        traceback.print_exc()
        held.save_info(state="error", error=f"the keeper failed: {one_line(exc)} (keeper.log)")
        held.close()
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
