"""``tuiprof run [options] -- python SCRIPT.py [ARGS...]`` (or ``-- ./binary [ARGS...]``): a
program of one's own, headless or live (the program's side is :mod:`tuiprof.program`)."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import signal
import threading
import time
from pathlib import Path

from ..errors import TuiprofError
from ..terminal import detach_terminal
from ..text import printable
from ..program.launch import ProgramResult, ProgramSpec, parse_program
from .common import (Interrupted, handle_signals, output_path, print_summary,
                     say, write_outputs)
from ..sessions.launch import prepare_native
from .options import nvml_hz, sample_every, source_options
from .run import check_options, run_defaults
from .sessions import hold, start_detached

def run(args: argparse.Namespace) -> int:
    """``tuiprof run … -- PROGRAM``."""
    from ..export.feeds import check_feeds  # noqa: PLC0415

    check_options(args, run_defaults())
    args.feeds_parsed = check_feeds(args)
    if args.detach:
        spec = parse_program(args.program)   # a bad command fails here, in the terminal
        _check_native(spec, args)
        return start_detached(args, spec.name, program_launch(args, spec))
    if args.headless:
        return run_headless(args, say, print_summary, write_outputs)
    return run_live(args)


def stem(spec: ProgramSpec) -> str:
    """A file-name stem for the program's snapshot and log."""
    base = (Path(spec.target).stem if spec.kind in ("path", "native")
            else spec.target.split(".")[-1])
    if spec.kind == "code":
        base = "code"
    if spec.label:   # torchrun SCRIPT.py: the script's name
        base = Path(spec.label.split()[-1]).stem
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-")[:40] or "program"


def program_options(args: argparse.Namespace, headless: bool):
    from ..spec import ProfilerOptions  # noqa: PLC0415

    se = sample_every(args, headless)
    # a program's own ops around its CUDA graphs make hundreds of API calls a step: CUPTI's API
    # kinds go off between compiled bursts too (ProfilerOptions.compiled_api_kinds_stay_on)
    return ProfilerOptions(cupti=not args.no_cupti, nvml=not args.no_nvml, nvml_hz=nvml_hz(args),
                           sample_every=se, alloc_every=args.alloc_every
                           if args.alloc_every == "auto" else int(args.alloc_every),
                           compiled_api_kinds_stay_on=False,
                           detach_between_bursts=not args.cupti_attached,
                           cuda_graph_trace=getattr(args, "cuda_graph_trace", "node"))


def _check_native(spec: ProgramSpec, args: argparse.Namespace) -> None:
    """A native program: refuse the options of step sources that only see Python programs."""
    if spec.kind != "native":
        if getattr(args, "cuda_graph_trace", "node") != "node":
            raise TuiprofError("--cuda-graph-trace applies to native binaries; a Python "
                               "program's CUDA graphs are traced in sampling bursts")
        return
    from ..program.registry import STEP_SOURCES  # noqa: PLC0415

    for src in STEP_SOURCES:
        for o in src.options:
            # --window-ms also sizes the windows a native program falls back to
            if "native" not in src.programs and o.dest != "window_ms" \
                    and getattr(args, o.dest) != o.default:
                raise TuiprofError(f"{o.flag} applies to Python programs; a native program's "
                                   "steps come from --step-range or its kernel stream "
                                   "(docs/native.md)")


STOP_GRACE_S = 10.0    # after a stop, how long the program has to end (a native binary gets
                       # SIGTERM, then SIGKILL 3 s later, and its records are then folded)
PULL_S = 0.5           # how often a headless run copies the session (the most a crash loses)


def run_headless(args: argparse.Namespace, say, print_summary, write_outputs) -> int:
    """Run the program in a session process of its own and write the snapshot here, whatever
    happens to that process (``os._exit``, a kill, a crash): this process keeps a complete
    copy of the session (pulled every ``PULL_S``) and reads the program's output itself, so
    the log has every byte the program wrote. Returns the program's exit status, or 128 + N
    after signal N."""
    from ..export._atomic import FILE, check_output, output_kind  # noqa: PLC0415
    from ..sessions import RemoteControl  # noqa: PLC0415

    spec = parse_program(args.program)
    _check_native(spec, args)
    prepare_native(spec, not args.no_cupti)
    # absolute before the program starts: it may change or remove its working directory
    out = output_path(args.json or f"tuiprof-{stem(spec)}.json")
    kind = check_output(out, "--json" if args.json else "the snapshot") and output_kind(out)
    # beside the snapshot; a snapshot written to a device or a FIFO: where tuiprof started
    log = out.with_suffix(".log") if kind == FILE else output_path(f"tuiprof-{stem(spec)}.log")
    check_output(log, "the program's log")
    program = {"spec": spec, "log_path": str(log), "options": source_options(args),
               "proxy": getattr(args, "proxy", None), "own_group": True, "stop_on_term": True,
               "tee": True,
               "stdin": None if os.isatty(0) else 0,   # a terminal stays here (Ctrl-C)
               "meta": getattr(args, "meta", None)}
    ctl = RemoteControl(program_options(args, True), {"ring_tokens": args.ring_tokens},
                        program=program, poll=False)
    if spec.note:
        say(f"tuiprof: {spec.note}")
    say(f"tuiprof: running {spec.name} (its output is also kept in {log}); Ctrl-C goes to "
        f"the program, a second one stops it")
    seen: list[int] = []
    stop = threading.Event()

    def on_signal(signum, frame):
        seen.append(signum)
        if signum == signal.SIGHUP:
            detach_terminal()
        if signum == signal.SIGINT and seen == [signal.SIGINT]:
            if ctl.pid:
                with contextlib.suppress(OSError):
                    os.kill(ctl.pid, signal.SIGINT)   # KeyboardInterrupt in the program
            return
        if stop.is_set():
            raise Interrupted(signum)
        stop.set()
        say(f"tuiprof: {signal.Signals(signum).name}: stopping the session: writing {out}, "
            f"then ending the program (again to quit at once)")

    from ..export.feeds import Feeds, start_feeds  # noqa: PLC0415

    old = handle_signals(on_signal, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    feeds = Feeds({})
    try:
        held = _hold_here(args, ctl, spec)   # its processes, followed (None: --no-follow)
        others = None
        try:
            try:
                (held or ctl).start()
            except OSError as exc:
                raise TuiprofError(f"cannot capture the program's output in {log}: "
                                   f"{exc.strerror or exc}") from None
            # the held session runs its feeds itself; a lone process gets them here
            feeds = held.feeds if held is not None else start_feeds(args, ctl)
            _follow(ctl, stop)
            if stop.is_set() and _program_running(ctl):
                # the snapshot first, from the copy, whatever the program does when asked to
                # end or whatever state its process is in (stopped, stuck); rewritten whole
                # once it has ended (its last step closed)
                _write_now(ctl, held, out, _stop_signal(seen))
                _end_program(ctl, held)     # it ends (its last step closed), or is stopped
            if not ctl._gone:
                _pull(ctl, LAST_PULL_S)     # the last copy
            if held is not None:            # and of every process it started
                held.check_end()
                held.stop()
                others = held.views(raw=True)
        finally:
            feeds.close()  # a last poll of what finished, then what is queued is sent
            ctl.close()    # ends the session process (and the program); the log is complete
            if held is not None:
                held.close()
        main_view, line = _final_view(ctl, _stop_signal(seen) if stop.is_set() else None)
        view = feeds.annotate(_with_processes(main_view, others))
        write_outputs(view, out, None)
        print_summary(main_view, None)
        if held is not None:
            print_processes(held)
        say(f"tuiprof: {line}")
        for feed_line in feeds.summary():
            say(f"tuiprof: {feed_line}")
        for note in (ctl.status.extra or {}).get("notes") or ():
            say(f"tuiprof: {note}")
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if stop.is_set():
        return 128 + _stop_signal(seen)
    return int(main_view.meta["program"]["exit_status"])


def _write_now(ctl, held, out: Path, sig: int) -> None:
    """The snapshot as the session stands (the last copy held here: no process is asked, so
    a stopped or stuck one cannot delay it), before the program is asked to end; a failure
    here is left to the final write, which reports it."""
    from ..export.snapshot import write_snapshot  # noqa: PLC0415

    try:
        others = held.views(raw=True, pull=False) if held is not None else None
        write_snapshot(_with_processes(_final_view(ctl, sig)[0], others), out)
    except Exception:  # noqa: BLE001 - the final write says what went wrong
        return
    say(f"tuiprof: snapshot written to {out} (tuiprof's copy); ending the program")


def _stop_signal(seen: list[int]) -> int:
    """The signal that stopped the session: the first that was not the forwarded Ctrl-C."""
    return next((s for i, s in enumerate(seen) if s != signal.SIGINT or i > 0), seen[-1])


def _program_running(ctl) -> bool:
    """Until the program has ended: ``running`` is None while the session process has not
    started it yet (a copy can come first on a loaded machine), and the session's state is
    "error" when it could not start it."""
    prog = (ctl.status.extra or {}).get("program") or {}
    return (not ctl._gone and prog.get("running") is not False
            and ctl.status.state != "error")


def _follow(ctl, stop: threading.Event) -> None:
    """Copy the session every ``PULL_S`` until the program ends, its process goes or a stop
    (which ends the wait at once, even while a copy is on its way)."""
    while not stop.is_set():
        if not _pull(ctl, None, stop):
            return
        if not _program_running(ctl):
            return
        stop.wait(PULL_S)


def _pull(ctl, limit: float | None, stop: threading.Event | None = None) -> bool:
    """One copy of the session, on a thread of its own: this (main) thread waits for it at
    most ``limit`` seconds (None: as long as it takes) and not past ``stop``, so that a
    process that does not answer (stopped by SIGSTOP, stuck) never holds the run. Returns
    whether the copy came."""
    done = threading.Event()

    def pull() -> None:
        try:
            ctl.view(raw=True)
        except Exception:  # noqa: BLE001 - a copy that fails leaves the last one
            pass
        finally:
            done.set()

    threading.Thread(target=pull, name="tuiprof-copy", daemon=True).start()
    end = None if limit is None else time.monotonic() + limit
    while not done.wait(0.1):
        if (stop is not None and stop.is_set()) or (end is not None and time.monotonic() > end):
            return False
    return True


def process_state(pid: int | None) -> str:
    """A process's state letter from /proc (``T``: stopped by a signal, ``t``: stopped by a
    tracer, ``Z``: ended, not reaped); "" when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
        return stat[stat.rindex(")") + 2:].split(" ", 1)[0]
    except (OSError, ValueError, TypeError):
        return ""


def _continue_stopped(ctl, held) -> None:
    """Continue (SIGCONT) the program's processes that are stopped (a program that sent
    itself SIGSTOP, a Ctrl-Z of its own), so that they can take the SIGTERM and end; said."""
    procs = [("the program's process", ctl.pid)]
    if held is not None:
        procs += [(f"its process {printable(e.name, 40)}", e.pid) for e in held.entries[1:]
                  if e.state == "running"]
    for what, pid in procs:
        if pid and process_state(pid) in ("T", "t"):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
                say(f"tuiprof: {what} (pid {pid}) was stopped (SIGSTOP or the like): "
                    f"continued it (SIGCONT) so that it can end")


def _end_program(ctl, held=None) -> None:
    """End a stopped program: a process of it stopped by a signal is continued first; then
    SIGTERM to its process (a ``SessionStop`` on the program's main thread; a native binary
    gets SIGTERM, then SIGKILL) and ``STOP_GRACE_S`` to end, so that its last step is closed
    and a native binary's kernel stream is cut into its steps. A process that has stopped
    again by then is killed (SIGKILL), said; one that does not end (stuck in native code, or
    catching everything) has its collection stopped where it is; the session process is
    closed after the snapshot's copy."""
    _continue_stopped(ctl, held)
    with contextlib.suppress(OSError, TypeError):
        os.kill(ctl.pid, signal.SIGTERM)
    end = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < end and not ctl._gone:
        _pull(ctl, max(0.0, end - time.monotonic()))
        if not _program_running(ctl):
            return
        time.sleep(0.1)
    if ctl._gone:
        return
    if process_state(ctl.pid) in ("T", "t"):
        with contextlib.suppress(OSError, TypeError):
            os.kill(ctl.pid, signal.SIGKILL)
            say(f"tuiprof: the program's process (pid {ctl.pid}) stopped again instead of "
                f"ending: killed it (SIGKILL); the snapshot holds tuiprof's last copy")
        return
    ctl.stop()


LAST_PULL_S = 30.0     # the most the last copy may take once the program has ended or is stopped


def _final_view(ctl, stop_sig: int | None):
    """The last complete copy of the session, with how the program ended filled in where its
    process could not say (it ended the process itself, was killed, crashed or was stopped),
    and the program's output as this process read it. Returns (view, the line to say)."""
    view = ctl.mirror.view(raw=True)
    meta = dict(view.meta)
    info = dict(meta.get("program") or {})
    result = ProgramResult(int(info.get("exit_status") or 0), str(info.get("ended") or "exited"),
                           str(info.get("error") or ""))
    line = result.line()
    if info.get("running", True) or "exit_status" not in info:   # it never got to say
        code = ctl._proc.exitcode if ctl._proc is not None else None
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            info.update(exit_status=128 - code, ended="killed")
            line = (f"the program's process was killed by {name} (exit status {128 - code}); "
                    f"the snapshot holds what was collected until then")
        elif stop_sig is None:
            info.update(exit_status=code if code is not None else 1, ended="exited")
            line = (f"the program ended its process itself (os._exit or a crash, exit status "
                    f"{code}); the snapshot holds what was collected until then")
    if stop_sig is not None:
        info.update(exit_status=128 + stop_sig, ended="stopped")
        line = (f"the program was stopped by tuiprof ({signal.Signals(stop_sig).name}, exit "
                f"status {128 + stop_sig})")
    info["running"] = False
    meta["program"] = info
    if "step_source" not in meta:   # the process never finished: its last word on steps
        meta.update((ctl.status.extra or {}).get("steps") or {"step_source": "none"})
    return ctl.with_output(dataclasses.replace(view, meta=meta)), line


def _hold_here(args: argparse.Namespace, ctl, spec):
    """A headless run holds its session itself: the program's processes register with this
    process and are mirrored here (None with --no-follow, or for a native program)."""
    if getattr(args, "no_follow", False) or spec.kind == "native":
        return None
    return hold(args, ctl, name=spec.name, kind="program", stem=stem(spec))


def _with_processes(view, others):
    """The snapshot of a run whose program started processes: every process (the main one's
    final view first), else the main one's view as it is."""
    if others is None or others.world_size < 2:
        return view
    meta = dict(view.meta, process=others.views[0].meta.get("process"))
    return dataclasses.replace(others, views=(dataclasses.replace(view, meta=meta),
                                              *others.views[1:]))


def print_processes(held) -> None:
    """One line per process the program started, and how each ended."""
    entries = held.entries[1:]
    if not entries:
        return
    print(f"{len(entries)} processes of the program:")
    for e in entries:
        v = e.ctl.view(raw=False) if e.ctl is not None else None
        steps = int(v.counters.get("tokens", 0) or 0) if v is not None else 0
        rank = v.meta.get("rank") if v is not None else None
        print(f"  pid {e.pid} {printable(e.name, 40)}: {steps} steps"
              + (f", rank {rank}" if isinstance(rank, int) else "")
              + (f"; {printable(e.line, 200)}" if e.line else f"; {e.state}"))


def run_live(args: argparse.Namespace) -> int:
    """The live app; the program runs in the session process, its processes are followed."""
    from ..ui.app import run_app  # noqa: PLC0415
    main, name, stem_ = live_control(args)
    ctl = hold(args, main, name=name, kind="program", stem=stem_)
    ctl.start()
    return run_app(ctl, title=f"tuiprof {name}", export_dir=Path(args.export_dir),
                   auto_snapshot=True)


def live_control(args: argparse.Namespace):
    """(the session process that runs the program, not started; its name; a stem)."""
    from ..sessions.launch import program_control  # noqa: PLC0415

    spec = parse_program(args.program)
    _check_native(spec, args)
    ctl = program_control(spec, stem(spec), program_options(args, False),
                          {"ring_tokens": args.ring_tokens}, args.export_dir,
                          source_options(args), getattr(args, "proxy", None),
                          getattr(args, "meta", None))
    return ctl, spec.name, stem(spec)


def program_launch(args: argparse.Namespace, spec: ProgramSpec) -> dict:
    """What a detached session's keeper starts, as plain data (``launch.json``)."""
    return {"kind": "program", "stem": stem(spec),
            "options": program_options(args, False).to_json(),
            "store": {"ring_tokens": args.ring_tokens},
            "program": {"argv": list(args.program), "options": source_options(args),
                        "proxy": getattr(args, "proxy", None),
                        "meta": getattr(args, "meta", None)}}
