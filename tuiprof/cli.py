"""Command line: ``tuiprof --model NAME`` opens the live app; subcommands do the rest.

Heavy modules (torch, textual) are imported only by the commands that need them, so
``tuiprof models`` and error messages are instant and never print a traceback.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from . import __version__
from .errors import TuiprofError, safe_text

SUBCOMMANDS = ("run", "models", "view", "replay", "record", "export", "diff", "sweep")


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default="qwen3-0.6b",
                   help="registry name, a local directory with config.json, or a cached HF repo id")
    p.add_argument("--weights", help="safetensors file or directory to load instead of random weights")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow model code from a local HF directory (off by default)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when present)")
    p.add_argument("--dtype", help="bfloat16 (GPU default), float16, float32 (CPU default)")
    p.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    p.add_argument("--compile-mode", help="torch.compile mode (default: reduce-overhead on CUDA)")
    p.add_argument("--prompt", help="prompt text (needs a tokenizer beside the weights)")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt length in tokens when no text")
    p.add_argument("--batch", type=int, default=1,
                   help="sequences decoded together, each with its own prompt (default 1; b/B "
                        "double or halve it in the app)")
    p.add_argument("--max-batch", type=int, default=None,
                   help="largest batch b may ask for (default 256, or fewer when their KV "
                        "caches would not fit the GPU)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-len", type=int, default=None, help="static KV-cache length")
    p.add_argument("--no-loop", action="store_true",
                   help="stop after --max-new-tokens instead of starting again from the prompt")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--headless", action="store_true", help="no UI: run, then write --json")
    p.add_argument("--json", help="snapshot path (headless), default tuiprof-<model>.json")
    p.add_argument("--record", help="also write a replayable recording (.json.gz)")
    p.add_argument("--no-cupti", action="store_true", help="no kernel records (timing and NVML only)")
    p.add_argument("--cupti-attached", action="store_true",
                   help="keep CUPTI attached between sampling bursts (default: attached only "
                        "around them; an attached CUPTI costs eager decode 15-30 %% on an H100, "
                        "detaching costs compiled mode two CUDA-graph re-recordings a burst)")
    p.add_argument("--no-nvml", action="store_true")
    p.add_argument("--nvml-hz", type=float, default=10.0)
    p.add_argument("--sample-every", default="auto",
                   help="trace device activity for 1 token in N on average (bursts of 4 tokens "
                        "every 4N; a prefill at most once as often, the first always); auto: "
                        "bursts of 4 in every 256 in eager mode, 4 in every 4096 in compiled "
                        "mode (measured overhead, docs/performance.md; a --headless run traces "
                        "every token); live: auto's bursts even in a --headless run (overhead "
                        "benchmarks); 1: every token")
    p.add_argument("--ring-tokens", type=int, default=64,
                   help="raw records kept for the last N tokens (aggregates keep the rest)")
    p.add_argument("--alloc-every", default="auto",
                   help="read caching-allocator stats every N tokens (0: never; auto: every token "
                        "in eager mode, every 64th in compiled mode; the counters are cumulative)")
    p.add_argument("--measure-peaks", action="store_true",
                   help="measure copy bandwidth and matmul FLOP/s at start-up for the roofline "
                        "(instead of the table of known GPUs)")
    p.add_argument("--export-dir", default=".", help="where e/n exports and auto snapshots go")
    p.add_argument("--in-process", action="store_true",
                   help="run the model in the UI's process (default: a session process of its "
                        "own, so drawing the UI never takes the GIL from generation)")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallelism: N ranks, one process per GPU (NCCL; gloo with "
                        "--device cpu), started with torch.distributed's launcher")
    g = p.add_argument_group("a program of your own (tuiprof run [options] -- python SCRIPT.py "
                             "[ARGS...]; see docs/programs.md)")
    g.add_argument("--step-range", action="append", metavar="NAME", default=[],
                   help="cut steps at the program's NVTX ranges named NAME (again for more "
                        "names; a name with 'prefill' in it marks prefill steps)")
    g.add_argument("--window-ms", type=float, default=100.0,
                   help="when the program marks no steps: windows of this many ms (default 100)")


def build_parser() -> argparse.ArgumentParser:
    """The full parser (subcommands); ``tuiprof --model X`` is ``tuiprof run --model X``."""
    p = argparse.ArgumentParser(prog="tuiprof", description="Live LLM inference profiler for the terminal.")
    p.add_argument("--version", action="version", version=f"tuiprof {__version__}")
    sub = p.add_subparsers(dest="command")
    _run_args(sub.add_parser("run", help="profile a model live (the default command)"))
    r = sub.add_parser("record", help="run headless and write a replayable recording")
    _run_args(r)
    sub.add_parser("models", help="list the model registry")
    v = sub.add_parser("view", help="open a JSON snapshot read-only (no GPU needed)")
    v.add_argument("snapshot")
    rp = sub.add_parser("replay", help="replay a recording through the live pipeline")
    rp.add_argument("file")
    rp.add_argument("--speed", type=float, default=1.0, help="1 = recorded speed, 0 = as fast as possible")
    rp.add_argument("--loop", action="store_true")
    rp.add_argument("--headless", action="store_true")
    rp.add_argument("--json", help="snapshot path (headless)")
    rp.add_argument("--ring-tokens", type=int, default=64)
    rp.add_argument("--export-dir", default=".")
    e = sub.add_parser("export", help="export a snapshot to nsys-style reports, SQLite, trace")
    e.add_argument("snapshot")
    e.add_argument("--nsys", metavar="DIR", help="write nsys stats CSVs and console tables")
    e.add_argument("--sqlite", metavar="FILE", help="write an Nsight Systems-schema .sqlite")
    e.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace JSON")
    d = sub.add_parser("diff", help="compare two snapshots side by side")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--markdown", action="store_true")
    s = sub.add_parser("sweep", help="sweep models × sequence lengths (the studies' tables)")
    try:
        from .sweep.cli import add_arguments  # noqa: PLC0415
        add_arguments(s)
    except ImportError:
        pass
    return p


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP before a command installs its own handler (e.g. while importing torch)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum, frame):
    raise Interrupted(signum)


def split_program(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """tuiprof's own arguments, and the program's command after the first ``--`` (or None)."""
    if "--" not in argv:
        return argv, None
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    argv, program = split_program(list(sys.argv[1:] if argv is None else argv))
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]
    args = build_parser().parse_args(argv)
    args.program = program
    # SIGTERM and SIGHUP end the command like Ctrl-C (one line, no traceback; exports are
    # atomic, so nothing is left half-written); a live or headless run handles them itself.
    old = _handle_signals(_interrupt, (signal.SIGTERM, signal.SIGHUP))
    try:
        return _dispatch(args)
    except TuiprofError as exc:
        _say("tuiprof: " + " ".join(str(exc).split()))  # always one line
        return exc.exit_code
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        _say(f"tuiprof: {signal.Signals(signum).name}: interrupted")
        return 128 + signum
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _handle_signals(handler, signals) -> dict:
    """Install ``handler`` for ``signals``; returns the previous handlers to restore.

    A SIGHUP that is ignored (``nohup tuiprof ...``) stays ignored.
    """
    old = {}
    for s in signals:
        try:
            if s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN:
                continue
            old[s] = signal.signal(s, handler)
        except (ValueError, AttributeError):  # not the main thread, or no such signal
            pass
    return old


def _stop_on_signals(out: Path, on_first=None) -> tuple[list[int], dict]:
    """A headless run's signals: the first SIGINT/SIGTERM/SIGHUP stops it cleanly and keeps the
    data (``on_first``), a second one quits at once. Returns (signals seen, old handlers)."""
    stopping: list[int] = []

    def on_signal(signum, frame):
        stopping.append(signum)
        if signum == signal.SIGHUP:
            _detach_terminal()
        if len(stopping) > 1:
            raise Interrupted(signum)
        _say(f"tuiprof: {signal.Signals(signum).name}: stopping, writing {out} "
             f"(again to quit at once)")
        if on_first is not None:
            on_first()

    return stopping, _handle_signals(on_signal, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


def _detach_terminal() -> None:
    """After SIGHUP the terminal is gone: point stdin/stdout/stderr at /dev/null so that the
    rest of the shutdown (snapshot, summary) does not fail on a dead terminal."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    except OSError:
        pass


def _say(line: str) -> None:
    """One line on stderr; a closed terminal (SIGHUP) must not turn it into a traceback."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _dispatch(args: argparse.Namespace) -> int:
    cmd = args.command
    if args.program is not None:
        if cmd != "run":
            raise TuiprofError(f"'tuiprof {cmd}' takes no program; profile one with "
                               f"tuiprof run [--headless --json OUT] -- python SCRIPT.py [ARGS...]")
        return _cmd_run_program(args)
    if cmd == "models":
        return _cmd_models()
    if cmd in ("run", "record"):
        if cmd == "record":
            args.headless = True
            if not args.record:
                args.record = f"tuiprof-{Path(args.model).name}.json.gz"
        return _cmd_run(args)
    if cmd == "view":
        return _cmd_view(args)
    if cmd == "replay":
        return _cmd_replay(args)
    if cmd == "export":
        return _cmd_export(args)
    if cmd == "diff":
        return _cmd_diff(args)
    if cmd == "sweep":
        from .sweep.cli import run  # noqa: PLC0415
        return run(args)
    raise TuiprofError(f"unknown command {cmd}")


def _cmd_models() -> int:
    from .engine.registry import get_model_def, list_models, param_count, weight_bytes  # noqa: PLC0415

    print(f"{'model':<24} {'family':<12} {'params':>15} {'bf16 weights':>13}  description")
    for name in list_models():
        try:
            d = get_model_def(name)
            params, wbytes = param_count(d), weight_bytes(d, "bfloat16")
        except Exception as exc:  # a broken definition file is listed, not fatal
            print(f"{name:<24} (unreadable: {safe_text(exc)})")
            continue
        desc = (d.description or "")[:60]
        print(f"{name:<24} {d.family:<12} {params:>15,} {wbytes / 1e9:>10.2f} GB  {desc}")
    return 0


def _engine_kwargs(args: argparse.Namespace) -> dict:
    kw = dict(model_spec=args.model, device=args.device, dtype=args.dtype, seed=args.seed,
              prompt=args.prompt, prompt_len=args.prompt_len,
              max_new_tokens=args.max_new_tokens, loop=not args.no_loop, mode=args.mode,
              compile_mode=args.compile_mode, trust_remote_code=args.trust_remote_code,
              weights=args.weights, temperature=args.temperature, top_k=args.top_k,
              batch=args.batch, max_batch=args.max_batch)
    if args.max_len:
        kw["max_len"] = args.max_len
    return kw


def _make_options(args: argparse.Namespace):
    """(ProfilerOptions, SessionStore keyword arguments) from the command line."""
    from .engine import resolve_model  # noqa: PLC0415  (fail fast on a bad --model, before threads)
    from .profiler import ProfilerOptions  # noqa: PLC0415
    from .startup import command_start  # noqa: PLC0415

    resolve_model(args.model, trust_remote_code=args.trust_remote_code)
    if args.batch < 1 or (args.max_batch is not None and args.max_batch < 1):
        raise TuiprofError("--batch and --max-batch must be at least 1")
    ring = args.ring_tokens
    if args.record:
        ring = max(ring, args.max_new_tokens + 1)
    opts = ProfilerOptions(cupti=not args.no_cupti, nvml=not args.no_nvml, nvml_hz=args.nvml_hz,
                           sample_every=args.sample_every, measure_peaks=args.measure_peaks,
                           alloc_every=args.alloc_every if args.alloc_every == "auto"
                           else int(args.alloc_every),
                           detach_between_bursts=not getattr(args, "cupti_attached", False),
                           engine_kwargs=_engine_kwargs(args), started_at=command_start())
    return opts, {"ring_tokens": ring}


def _make_profiler(args: argparse.Namespace):
    from .profiler import Profiler  # noqa: PLC0415
    from .store import SessionStore  # noqa: PLC0415

    opts, store_kwargs = _make_options(args)
    store = SessionStore(**store_kwargs)
    return Profiler(store, opts), store


def _run_defaults() -> dict:
    p = argparse.ArgumentParser(add_help=False)
    _run_args(p)
    return vars(p.parse_args([]))


def _cmd_run_program(args: argparse.Namespace) -> int:
    from .program.command import check_options, run_headless, run_live  # noqa: PLC0415

    check_options(args, _run_defaults())
    if args.headless:
        return run_headless(args, _say, _print_summary, _write_outputs)
    return run_live(args)


def _cmd_run(args: argparse.Namespace) -> int:
    from .program.command import check_options  # noqa: PLC0415

    check_options(args, _run_defaults())
    if args.tp != 1:
        return _cmd_run_tp(args)
    if not args.headless and not args.in_process:
        return _cmd_run_ui(args)
    prof, store = _make_profiler(args)
    if not args.headless:
        from .ui.app import run_app  # noqa: PLC0415
        prof.start()
        code = run_app(prof, title=f"tuiprof {args.model}", export_dir=Path(args.export_dir),
                       auto_snapshot=True)
        return _exit_if_busy(prof, code)
    if args.no_loop is False:
        args.no_loop = True  # headless runs end after --max-new-tokens
        prof.options.engine_kwargs["loop"] = False
    if prof.options.sample_every == "auto":
        # A headless run is a bounded measurement for its snapshot, not a live display that
        # must stay out of the way: every token is traced.
        prof.options.sample_every = 1
    out = Path(args.json or f"tuiprof-{Path(args.model).name}.json")
    stopping, old = _stop_on_signals(out, prof.done.set)
    try:
        _say_start(store, prof)
        prof.start()
        said: set = set()
        while not prof.wait(0.5):
            _say_progress(prof, said)
        _say_progress(prof, said)
    finally:
        prof.stop()
        for s, h in old.items():
            signal.signal(s, h)
    view = store.view()
    _write_outputs(view, out, args.record)
    _print_summary(view, prof)
    if stopping:
        return _exit_if_busy(prof, 128 + stopping[0])
    return _exit_if_busy(prof, 1 if prof.status.state == "error" else 0)


def _cmd_run_ui(args: argparse.Namespace) -> int:
    """The live app, with the model, collectors and store in a session process of their own.

    The session process starts first: it imports torch and loads the model while this process
    imports Textual and draws the first frame.
    """
    from .remote import RemoteControl  # noqa: PLC0415

    opts, store_kwargs = _make_options(args)
    ctl = RemoteControl(opts, store_kwargs, orphan_snapshot_dir=args.export_dir)
    ctl.start()
    try:
        from .ui.app import run_app  # noqa: PLC0415
    except BaseException:
        ctl.close()
        raise
    return run_app(ctl, title=f"tuiprof {args.model}", export_dir=Path(args.export_dir),
                   auto_snapshot=True)


def _check_tp(args: argparse.Namespace) -> None:
    """Fail fast (one line) on a --tp the machine cannot run."""
    if args.tp < 1:
        raise TuiprofError(f"--tp {args.tp}: give the number of ranks (2 or more)")
    if args.in_process:
        raise TuiprofError("--tp runs one process per rank; drop --in-process")
    if args.record:
        raise TuiprofError("--record writes one rank's recording; drop it with --tp")
    if args.weights:
        raise TuiprofError("--tp builds random weights only for now; drop --weights")
    from .engine import resolve_model  # noqa: PLC0415
    from .engine.load import pick_device, tp_families  # noqa: PLC0415

    source = resolve_model(args.model, trust_remote_code=args.trust_remote_code)
    if args.tp > 1 and source.family not in tp_families():
        raise TuiprofError(f"--tp: the {source.family} family ({source.name}) has no "
                           f"tensor-parallel build; supported: {', '.join(tp_families())}")
    device = pick_device(args.device)
    if device.startswith("cuda"):
        import torch  # noqa: PLC0415
        n = torch.cuda.device_count()
        if args.tp > n:
            raise TuiprofError(f"--tp {args.tp} needs {args.tp} GPUs, one per rank; {n} "
                               f"visible: use --tp {n} or fewer, or --device cpu (gloo)")
    args.device = device


def _cmd_run_tp(args: argparse.Namespace) -> int:
    """N tensor-parallel ranks, each a session process; the live app or a headless run."""
    from .remote.ranks import RankSetControl  # noqa: PLC0415

    _check_tp(args)
    if args.headless:
        args.no_loop = True
    opts, store_kwargs = _make_options(args)
    if args.headless and opts.sample_every == "auto":
        opts.sample_every = 1   # a bounded measurement: every token traced (as without --tp)
    ctl = RankSetControl(opts, store_kwargs, args.tp, orphan_snapshot_dir=args.export_dir)
    if not args.headless:
        from .ui.app import run_app  # noqa: PLC0415
        ctl.start()
        return run_app(ctl, title=f"tuiprof {args.model} TP={args.tp}",
                       export_dir=Path(args.export_dir), auto_snapshot=True)
    out = Path(args.json or f"tuiprof-{Path(args.model).name}-tp{args.tp}.json")
    stopping, old = _stop_on_signals(out)
    try:
        _say(f"tuiprof: loading {args.model} on {args.tp} ranks ({args.device}) ...")
        ctl.start()
        said = set()
        while not stopping and ctl.failure is None:
            states = [c.status.state for c in ctl.ranks]
            if all(st in ("done", "stopped", "error") for st in states):
                break
            for st in ("compiling", "decode"):
                if st in states and st not in said:
                    said.add(st)
                    _say("tuiprof: compiling the decode step on every rank (torch.compile) ..."
                         if st == "compiling" else
                         "tuiprof: generating; Ctrl-C stops and writes the snapshot")
            time.sleep(0.2)
        ctl.stop()
        rv = ctl.views(raw=True)
        from .export.snapshot import write_snapshot  # noqa: PLC0415
        write_snapshot(rv, out)
        _say(f"tuiprof: snapshot of {args.tp} ranks written to {out}")
        _print_ranks_summary(rv)
    finally:
        ctl.close()
        for s_, h in old.items():
            signal.signal(s_, h)
    failure = ctl.failure or next((f"rank {r}: {c.status.message}" for r, c in
                                   enumerate(ctl.ranks) if c.status.state == "error"), None)
    if failure:
        _say(f"tuiprof: {failure}")
        return 1
    return 128 + stopping[0] if stopping else 0


def _print_ranks_summary(rv) -> None:
    """Per-rank lines (tokens/s, step time, compute/communication/idle) and the skew."""
    from .analysis.ranks import find_ranks, ranks_summary  # noqa: PLC0415

    s = ranks_summary(rv)
    first = rv[0].meta
    if first.get("model"):
        print(f"model {first.get('model')} on {rv.world_size} ranks ({first.get('backend')}, "
              f"{first.get('device')}, {first.get('dtype')}), weights: {first.get('weights')}")
    if s.mode is None:
        print(f"no decode steps on {rv.world_size} ranks")
        return
    ms = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    for r in s.ranks:
        split = (f", compute {ms(r.compute_ms)} / communication {ms(r.comm_ms)} / idle "
                 f"{ms(r.idle_ms)} ms per step (NCCL {r.comm_share:.0%}, overlap "
                 f"{(r.overlap_fraction or 0):.0%}, {r.traced_steps} traced steps)"
                 if r.comm_share is not None else ", no kernel records")
        mark = " *slowest*" if s.slowest == r.rank and rv.world_size > 1 else ""
        print(f"rank {r.rank} {s.mode}: {r.decode_tokens} decode tokens, {r.tokens_per_s:.1f} "
              f"tokens/s, median {r.step_ms:.2f} ms/step{split}{mark}")
    if s.skew is not None:
        print(f"step-end skew across ranks: median {s.skew.end_median_us:.0f} µs, p90 "
              f"{s.skew.end_p90_us:.0f} µs over {s.skew.steps} steps; clock residual "
              f"{s.clock.get('residual_ns')} ns")
    for f in find_ranks(rv, s):
        print(f"finding: {f.title}")
    for r, v in enumerate(rv.views):
        if v.counters.get("dropped"):
            print(f"warning: rank {r}: {v.counters['dropped']} CUPTI records dropped",
                  file=sys.stderr)


def _exit_if_busy(prof, code: int) -> int:
    """A model load or a torch.compile still running after the session stopped cannot be
    interrupted, and ending the interpreter under it aborts the process ("terminate called
    without an active exception"). The data is written by now, so end the process at once."""
    if not prof.busy:
        return code
    _say("tuiprof: a model load or torch.compile was still running; exiting without waiting for it")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _say_start(store, prof) -> None:
    _say(f"tuiprof: loading {prof.options.engine_kwargs.get('model_spec')} ...")


def _say_progress(prof, said: set) -> None:
    """Headless progress lines: start-up breakdown at the first token, compiling, generating."""
    if "startup" not in said and prof.tracker.progress.first_token_s is not None:
        said.add("startup")
        _say(f"tuiprof: {prof.tracker.progress.summary()}")
    state = prof.status.state
    if state in ("compiling", "decode") and state not in said and not prof.done.is_set():
        said.add(state)
        _say("tuiprof: compiling the decode step (torch.compile) ..." if state == "compiling"
             else "tuiprof: generating; Ctrl-C stops and writes the snapshot")


def _write_outputs(view, out: Path, record: str | None) -> None:
    from .export.snapshot import write_snapshot  # noqa: PLC0415

    write_snapshot(view, out)
    _say(f"tuiprof: snapshot written to {out}")
    if record:
        from .collect.recording import write_recording  # noqa: PLC0415
        write_recording(view, record)
        _say(f"tuiprof: recording written to {record}")


def _print_summary(view, prof=None) -> None:
    from .store import PROGRAM_CONFIG  # noqa: PLC0415

    meta = view.meta
    if meta.get("weights") and meta.get("source") != "program":
        print(f"model {meta.get('model')} on {meta.get('device')} ({meta.get('dtype')}), "
              f"weights: {meta.get('weights')}")
    for c, st in sorted(view.collectors.items()):
        if not st.get("ok"):
            print(st.get("message"))
    if meta.get("source") == "program":
        _print_steps(view)
    for key in view.config_keys:
        sub = view.select(key)
        dec = [t for t in sub.tokens if t.phase == "decode" and t.done and not t.apart]
        for mode in ("eager", "compiled"):
            ts = [t for t in dec if t.mode == mode]
            if not ts:
                continue
            wall = sorted(t.host_ms for t in ts)
            med = wall[len(wall) // 2]
            steps_s = len(ts) / (sum(wall) / 1e3)
            seqs = sum(t.batch for t in ts) / len(ts)
            traced = sorted(t.kernels for t in ts if t.sampled) or [0]
            k = traced[len(traced) // 2]
            ntraced = sum(1 for t in ts if t.sampled)
            per = f" ({seqs:g} seq × {steps_s:.1f} steps/s)" if seqs != 1 else ""
            batches = sorted({t.batch for t in ts})
            spread = (f" (batch {batches[0]}-{batches[-1]}, {seqs:.1f} on average)"
                      if len(batches) > 1 else "")
            where = "program" if key == PROGRAM_CONFIG else f"batch {key}"
            print(f"{mode:>9} {where}: {len(ts)} decode steps{spread}, "
                  f"{seqs * steps_s:.1f} tokens/s{per}, median {med:.2f} ms/step, {k} kernels/step"
                  + (f" ({ntraced} traced steps)" if ntraced < len(ts) else ""))
    if prof is not None and prof.status.state == "error":
        print(f"tuiprof: {prof.status.message}", file=sys.stderr)
    if view.counters.get("dropped"):
        print(f"warning: {view.counters['dropped']} CUPTI records dropped", file=sys.stderr)


def _print_steps(view) -> None:
    """Where a program's steps came from."""
    meta = view.meta
    src = meta.get("step_source") or "none"
    counts = meta.get("step_sources") or {}
    phases: dict[str, int] = {}  # over the whole run (the token stats), not the rows kept
    for (ph, _mode), ts in (view.token_stats or {}).items():
        n = sum(ts[k].count for k in ("host_ms", "compiling_ms", "rerecord_ms") if k in ts)
        phases[ph] = phases.get(ph, 0) + n
    windows = phases.pop("window", 0)
    split = ", ".join(f"{n} {p}" for p, n in sorted(phases.items()))
    if src == "windows":
        print(f"steps: none marked by the program: {counts.get('windows', 0)} windows of "
              f"{meta.get('window_ms', 100):g} ms (see the no-step-boundaries finding)")
    elif src == "none":
        print("steps: none (the program ended before any step)")
    else:
        auto = meta.get("auto_steps") or {}
        if src == "auto" and auto.get("found"):  # a native program's loop, from its kernels
            print(f"steps: a decode loop of {auto.get('kernels_per_step')} kernels found in the "
                  f"kernel stream (confidence {auto.get('confidence')} "
                  f"{auto.get('confidence_label')}; boundary: {auto.get('boundary')}; "
                  f"{auto.get('identical_steps')} steps identical)")
        print(f"steps from {src}: {counts.get(src, 0)}" + (f" ({split})" if split else "")
              + (f"; {counts['ignored_nested']} nested marks ignored"
                 if counts.get("ignored_nested") else "")
              + (f"; before and between them {windows} windows of {meta.get('window_ms', 100):g}"
                 " ms (phase window)" if windows else ""))


def _cmd_view(args: argparse.Namespace) -> int:
    from .export.snapshot import read_any_snapshot  # noqa: PLC0415
    from .ui.app import run_app, view_control  # noqa: PLC0415

    view = read_any_snapshot(args.snapshot)
    name = safe_text(Path(args.snapshot).name)
    return run_app(view_control(view, name), title=f"tuiprof view {name}",
                   export_dir=Path("."), auto_snapshot=False)


def _cmd_replay(args: argparse.Namespace) -> int:
    from .collect.replay import ReplayControl, load_recording  # noqa: PLC0415
    from .store import SessionStore  # noqa: PLC0415

    rec = load_recording(args.file)
    store = SessionStore(ring_tokens=args.ring_tokens)
    if args.headless:
        from .collect.replay import replay_into  # noqa: PLC0415
        replay_into(rec, store, speed=0.0)
        out = Path(args.json or Path(args.file).name.split(".")[0] + ".snapshot.json")
        _write_outputs(store.view(), out, None)
        _print_summary(store.view())
        return 0
    from .ui.app import run_app  # noqa: PLC0415
    ctl = ReplayControl(rec, store, speed=args.speed, loop=args.loop)
    ctl.start()
    return run_app(ctl, title=f"tuiprof replay {Path(args.file).name}",
                   export_dir=Path(args.export_dir), auto_snapshot=False)


def _cmd_export(args: argparse.Namespace) -> int:
    from .export.snapshot import read_any_snapshot  # noqa: PLC0415

    view = read_any_snapshot(args.snapshot)  # all ranks of a multi-rank snapshot
    if not (args.nsys or args.sqlite or args.trace):
        raise TuiprofError("nothing to export: give --nsys DIR, --sqlite FILE and/or --trace FILE")
    if args.nsys:
        from .export.nsys_reports import write_nsys_reports  # noqa: PLC0415
        for path in write_nsys_reports(view, Path(args.nsys)):
            print(path)
    if args.sqlite:
        from .export.nsys_sqlite import write_nsys_sqlite  # noqa: PLC0415
        print(write_nsys_sqlite(view, Path(args.sqlite)))
    if args.trace:
        from .export.trace import write_trace  # noqa: PLC0415
        print(write_trace(view, Path(args.trace)))
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    from .export.diff import diff, render_text  # noqa: PLC0415
    from .export.snapshot import read_snapshot  # noqa: PLC0415

    result = diff(read_snapshot(args.a), read_snapshot(args.b))
    print(render_text(result, markdown=args.markdown))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
