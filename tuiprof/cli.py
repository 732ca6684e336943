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
from .errors import TuiprofError

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
    p.add_argument("--no-nvml", action="store_true")
    p.add_argument("--nvml-hz", type=float, default=10.0)
    p.add_argument("--sample-every", default="auto",
                   help="trace device activity for 1 token in N on average (bursts of 4 tokens "
                        "every 4N; a prefill is always traced); auto: bursts of 4 in every 128 "
                        "in eager mode, 4 in every 4096 in compiled mode (measured overhead, "
                        "docs/performance.md; a --headless run traces every token); 1: every token")
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


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]
    args = build_parser().parse_args(argv)
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
            print(f"{name:<24} (unreadable: {str(exc)[:60]})")
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
                           engine_kwargs=_engine_kwargs(args))
    return opts, {"ring_tokens": ring}


def _make_profiler(args: argparse.Namespace):
    from .profiler import Profiler  # noqa: PLC0415
    from .store import SessionStore  # noqa: PLC0415

    opts, store_kwargs = _make_options(args)
    store = SessionStore(**store_kwargs)
    return Profiler(store, opts), store


def _cmd_run(args: argparse.Namespace) -> int:
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
    stopping: list[int] = []

    def on_signal(signum, frame):  # first signal: stop cleanly and keep the data
        stopping.append(signum)
        if signum == signal.SIGHUP:
            _detach_terminal()
        if len(stopping) > 1:
            raise Interrupted(signum)
        _say(f"tuiprof: {signal.Signals(signum).name}: stopping, writing {out} "
             f"(again to quit at once)")
        prof.done.set()

    old = _handle_signals(on_signal, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    try:
        _say_start(store, prof)
        prof.start()
        said = set()
        while not prof.wait(0.5):
            state = prof.status.state
            if state in ("compiling", "decode") and state not in said:
                said.add(state)
                _say("tuiprof: compiling the decode step (torch.compile) ..." if state == "compiling"
                     else "tuiprof: generating; Ctrl-C stops and writes the snapshot")
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
    """The live app, with the model, collectors and store in a session process of their own."""
    from .remote import RemoteControl  # noqa: PLC0415
    from .ui.app import run_app  # noqa: PLC0415

    opts, store_kwargs = _make_options(args)
    ctl = RemoteControl(opts, store_kwargs, orphan_snapshot_dir=args.export_dir)
    ctl.start()
    return run_app(ctl, title=f"tuiprof {args.model}", export_dir=Path(args.export_dir),
                   auto_snapshot=True)


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


def _write_outputs(view, out: Path, record: str | None) -> None:
    from .export.snapshot import write_snapshot  # noqa: PLC0415

    write_snapshot(view, out)
    _say(f"tuiprof: snapshot written to {out}")
    if record:
        from .collect.recording import write_recording  # noqa: PLC0415
        write_recording(view, record)
        _say(f"tuiprof: recording written to {record}")


def _print_summary(view, prof=None) -> None:
    meta = view.meta
    if meta.get("weights"):
        print(f"model {meta.get('model')} on {meta.get('device')} ({meta.get('dtype')}), "
              f"weights: {meta.get('weights')}")
    for c, st in sorted(view.collectors.items()):
        if not st.get("ok"):
            print(st.get("message"))
    for key in view.config_keys:
        sub = view.select(key)
        dec = [t for t in sub.tokens if t.phase == "decode" and t.done and not t.compiling]
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
            print(f"{mode:>9} batch {key}: {len(ts)} decode steps, {seqs * steps_s:.1f} tokens/s"
                  f"{per}, median {med:.2f} ms/step, {k} kernels/step"
                  + (f" ({ntraced} traced steps)" if ntraced < len(ts) else ""))
    if prof is not None and prof.status.state == "error":
        print(f"tuiprof: {prof.status.message}", file=sys.stderr)
    if view.counters.get("dropped"):
        print(f"warning: {view.counters['dropped']} CUPTI records dropped", file=sys.stderr)


def _cmd_view(args: argparse.Namespace) -> int:
    from .export.snapshot import read_snapshot  # noqa: PLC0415
    from .ui.app import run_app, view_control  # noqa: PLC0415

    view = read_snapshot(args.snapshot)
    return run_app(view_control(view), title=f"tuiprof view {Path(args.snapshot).name}",
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
    from .export.snapshot import read_snapshot  # noqa: PLC0415

    view = read_snapshot(args.snapshot)
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
