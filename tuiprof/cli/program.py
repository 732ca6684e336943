"""``tuiprof run [options] -- python SCRIPT.py [ARGS...]`` (or ``-- ./binary [ARGS...]``): a
program of one's own, headless or live (the program's side is :mod:`tuiprof.program`)."""
from __future__ import annotations

import argparse
import datetime as _dt
import re
import signal
from pathlib import Path

from ..errors import TuiprofError
from ..program.launch import ProgramSpec, SessionStop, parse_program
from .common import print_summary, say, write_outputs
from .run import run_defaults

# Options of the built-in engine: a program loads and runs its own model.
ENGINE_OPTIONS = ("model", "weights", "trust_remote_code", "device", "dtype", "mode",
                  "compile_mode", "prompt", "prompt_len", "max_new_tokens", "max_len", "no_loop",
                  "temperature", "top_k", "seed", "record", "measure_peaks", "tp")


def run(args: argparse.Namespace) -> int:
    """``tuiprof run … -- PROGRAM``."""
    check_options(args, run_defaults())
    if args.detach:
        from .sessions import start_detached  # noqa: PLC0415
        spec = parse_program(args.program)   # a bad command fails here, in the terminal
        return start_detached(args, spec.name)
    if args.headless:
        return run_headless(args, say, print_summary, write_outputs)
    return run_live(args)


def check_options(args: argparse.Namespace, defaults: dict) -> None:
    """Refuse engine options with a program, and program options without one."""
    from ..program.sources import OPTIONS  # noqa: PLC0415

    if args.program is None:
        given = [o.flag for o in OPTIONS if getattr(args, o.dest) != defaults[o.dest]]
        if given:
            raise TuiprofError(f"{given[0]} applies to a program of your own: "
                               f"tuiprof run {given[0]} ... -- python SCRIPT.py")
        return
    given = [o for o in ENGINE_OPTIONS if getattr(args, o, None) != defaults.get(o)]
    if given:
        flags = ", ".join("--" + o.replace("_", "-") for o in given)
        raise TuiprofError(f"{flags}: options of tuiprof's own engine; a program loads and runs "
                           f"its own model (drop them, or pass them to the program after its "
                           f"script name)")
    if args.in_process:
        raise TuiprofError("--in-process: a program runs on the session process's main thread "
                           "(its signals behave as usual there); drop --in-process")
    for o in OPTIONS:
        why = o.problem(getattr(args, o.dest))
        if why:
            raise TuiprofError(f"{o.flag} {why}")


def source_options(args: argparse.Namespace) -> dict:
    """The step sources' options as given (``ProgramSession(options=...)``)."""
    from ..program.sources import OPTIONS  # noqa: PLC0415

    return {o.dest: getattr(args, o.dest) for o in OPTIONS}


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
    from ..profiler import ProfilerOptions  # noqa: PLC0415

    se = args.sample_every
    if se == "auto" and (headless or args.step_range):
        # Headless: every step traced, as for the engine. NVTX steps are known only after the
        # fact, so a burst cannot be switched on at a step's start: trace everything.
        se = 1
    # a program's own ops around its CUDA graphs make hundreds of API calls a step: CUPTI's API
    # kinds go off between compiled bursts too (ProfilerOptions.compiled_api_kinds_stay_on)
    return ProfilerOptions(cupti=not args.no_cupti, nvml=not args.no_nvml, nvml_hz=args.nvml_hz,
                           sample_every=se, alloc_every=args.alloc_every
                           if args.alloc_every == "auto" else int(args.alloc_every),
                           compiled_api_kinds_stay_on=False,
                           detach_between_bursts=not args.cupti_attached)


def _prepare_native(spec: ProgramSpec, args: argparse.Namespace) -> None:
    """A native program: refuse the options of step sources that only see Python programs,
    and build its injection library now (cached after the first time): a missing compiler or
    missing headers is one line before anything starts."""
    if spec.kind != "native":
        return
    from ..program.sources import STEP_SOURCES  # noqa: PLC0415

    for src in STEP_SOURCES:
        for o in src.options:
            # --window-ms also sizes the windows a native program falls back to
            if "native" not in src.programs and o.dest != "window_ms" \
                    and getattr(args, o.dest) != o.default:
                raise TuiprofError(f"{o.flag} applies to Python programs; a native program's "
                                   "steps come from --step-range or its kernel stream "
                                   "(docs/native.md)")
    if not args.no_cupti:
        from ..native.build import build  # noqa: PLC0415

        build()


def run_headless(args: argparse.Namespace, say, print_summary, write_outputs) -> int:
    """Run the program here, write the snapshot whatever happened, return its exit status."""
    from ..profiler import Profiler  # noqa: PLC0415
    from ..store import SessionStore  # noqa: PLC0415
    from ..program.program_session import ProgramSession  # noqa: PLC0415

    spec = parse_program(args.program)
    _prepare_native(spec, args)
    out = Path(args.json or f"tuiprof-{stem(spec)}.json")
    log = out.with_suffix(".log")
    prof = Profiler(SessionStore(ring_tokens=args.ring_tokens), program_options(args, True))
    session = ProgramSession(prof, spec, log, options=source_options(args), tee=True)
    if spec.note:
        say(f"tuiprof: {spec.note}")
    say(f"tuiprof: running {spec.name} (its output is also kept in {log}); Ctrl-C goes to "
        f"the program, a second one stops it")
    seen: list[int] = []

    def on_signal(signum, frame):  # in the program's thread, between its bytecodes
        seen.append(signum)
        if signum == signal.SIGINT and seen.count(signal.SIGINT) == 1:
            raise KeyboardInterrupt
        raise SessionStop(signum)

    try:
        session.start()
    except OSError as exc:
        prof.stop()
        raise TuiprofError(f"cannot capture the program's output in {log}: "
                           f"{exc.strerror or exc}") from None
    held = _follow_here(args, prof, session) if spec.kind != "native" else None
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            old[sig] = signal.signal(sig, on_signal)
        except (ValueError, OSError):
            pass
    try:
        result = session.run()
        if held is not None:   # its processes end as they would at the interpreter's end
            from ..remote.session_process import program_exit  # noqa: PLC0415
            try:
                program_exit()
            except (KeyboardInterrupt, SessionStop):   # Ctrl-C while they are joined
                pass
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    session.finish(result)
    view = prof.store.view()
    if held is not None:   # the program's processes: every one in the snapshot
        try:
            held.check_end()
            held.stop()
            view = held.export_view()
        finally:
            held.close()
    write_outputs(view, out, None)
    print_summary(view.views[0] if hasattr(view, "views") else view, None)
    if held is not None:
        print_processes(held)
    say(f"tuiprof: {result.line()}")
    for note in session.notes():
        say(f"tuiprof: {note}")
    return result.status


def _follow_here(args: argparse.Namespace, prof, session):
    """A headless run holds its session itself: the program's processes register with this
    process and are mirrored here (None with --no-follow)."""
    if getattr(args, "no_follow", False):
        return None
    from ..remote import follow  # noqa: PLC0415
    from ..remote.holder import LocalMain  # noqa: PLC0415
    from .sessions import hold  # noqa: PLC0415

    main = LocalMain(prof, session)
    held = hold(args, main, name=session.spec.name, kind="program", stem=stem(session.spec))
    held.start()
    follow.follow_from_main(main.follow_env, session, held.server)
    return held


def print_processes(held) -> None:
    """One line per process the program started, and how each ended."""
    from ..errors import safe_text  # noqa: PLC0415

    entries = held.entries[1:]
    if not entries:
        return
    print(f"{len(entries)} processes of the program:")
    for e in entries:
        v = e.ctl.view(raw=False) if e.ctl is not None else None
        steps = int(v.counters.get("tokens", 0) or 0) if v is not None else 0
        rank = v.meta.get("rank") if v is not None else None
        print(f"  pid {e.pid} {safe_text(e.name, 40)}: {steps} steps"
              + (f", rank {rank}" if isinstance(rank, int) else "")
              + (f"; {safe_text(e.line, 200)}" if e.line else f"; {e.state}"))


def run_live(args: argparse.Namespace) -> int:
    """The live app; the program runs in the session process, its processes are followed."""
    from ..ui.app import run_app  # noqa: PLC0415
    from .sessions import hold  # noqa: PLC0415

    main, name, stem_ = live_control(args)
    ctl = hold(args, main, name=name, kind="program", stem=stem_)
    ctl.start()
    return run_app(ctl, title=f"tuiprof {name}", export_dir=Path(args.export_dir),
                   auto_snapshot=True)


def live_control(args: argparse.Namespace):
    """(the session process that runs the program, not started; its name; a stem)."""
    from ..remote import RemoteControl  # noqa: PLC0415

    spec = parse_program(args.program)
    _prepare_native(spec, args)
    export = Path(args.export_dir)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log = export / f"tuiprof-{stem(spec)}-{stamp}.log"
    try:
        export.mkdir(parents=True, exist_ok=True)
        log.touch()
    except OSError as exc:
        raise TuiprofError(f"cannot write the program's log in {export}: "
                           f"{exc.strerror or exc}") from None
    program = {"spec": spec, "log_path": str(log), "options": source_options(args)}
    ctl = RemoteControl(program_options(args, False), {"ring_tokens": args.ring_tokens},
                        orphan_snapshot_dir=args.export_dir, program=program)
    return ctl, spec.name, stem(spec)
