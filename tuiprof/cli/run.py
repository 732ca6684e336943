"""``tuiprof [run] --model NAME``: the built-in engine, live or headless, on one GPU or as
tensor-parallel ranks (``--tp N``); ``tuiprof record``. A program of one's own
(``tuiprof run -- …``) goes to :mod:`tuiprof.cli.program`."""
from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import time
from pathlib import Path

from ..errors import TuiprofError
from ..phases import EAGER, MODES
from ..text import printable
from .common import (Interrupted, end_at_once, exit_if_busy, output_path, print_summary, say,
                     stop_on_signals, write_or_fallback, write_outputs)
from .sessions import add_run_arguments as add_session_arguments
from .sessions import hold, start_detached


# Options of the built-in engine: a program loads and runs its own model.
ENGINE_OPTIONS = ("model", "weights", "trust_remote_code", "device", "dtype", "mode",
                  "compile_mode", "prompt", "prompt_len", "max_new_tokens", "max_len", "no_loop",
                  "temperature", "top_k", "seed", "record", "measure_peaks", "tp")


def check_options(args: argparse.Namespace, defaults: dict) -> None:
    """Refuse engine options with a program, and program options without one."""
    from ..program.registry import OPTIONS  # noqa: PLC0415

    if args.program is None:
        given = [o.flag for o in OPTIONS if getattr(args, o.dest) != defaults[o.dest]]
        if getattr(args, "proxy", None):
            given.append("--proxy")
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
    check_proxy(getattr(args, "proxy", None))


def check_proxy(spec: str | None) -> None:
    """``--proxy LISTEN=UPSTREAM``: its syntax, loopback addresses, and LISTEN free now (one
    line each, before anything starts)."""
    if not spec:
        return
    from ..collect.http_proxy import check_listen, parse_spec  # noqa: PLC0415

    try:
        listen, _ = parse_spec(spec)
    except ValueError as exc:
        raise TuiprofError(f"--proxy {printable(exc, 200)}") from None
    why = check_listen(listen)
    if why:
        raise TuiprofError(f"--proxy: {why}; give a free LISTEN port")


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    """``run`` and ``record`` take the same options."""
    add_run_arguments(p)


def run(name: str, args: argparse.Namespace) -> int:
    if name == "record":
        args.headless = True
        if not args.record:
            args.record = f"tuiprof-{Path(args.model).name}.json.gz"
    return _cmd_run(args)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default="qwen3-0.6b",
                   help="registry name, a local directory with config.json, or a cached HF repo id")
    p.add_argument("--weights", help="safetensors file or directory to load instead of random weights")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow model code from a local HF directory (off by default)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when present)")
    p.add_argument("--dtype", help="bfloat16 (GPU default), float16, float32 (CPU default)")
    p.add_argument("--mode", choices=MODES, default=EAGER)
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
    p.add_argument("--nvml-hz", type=float, default=None,
                   help="NVML samples a second (default 10; 2 in a session left on, --detach)")
    p.add_argument("--sample-every", default="auto",
                   help="trace device activity for 1 token in N on average (bursts of 4 tokens "
                        "every 4N; a prefill at most once as often, the first always); auto: "
                        "bursts of 4 in every 256 in eager mode, 4 in every 4096 in compiled "
                        "mode, in the live app and --headless alike (measured overhead, "
                        "docs/performance.md), a quarter as often with --detach; live: the "
                        "live app's; leave: a quarter of it; 1: every token (a "
                        "traced step runs slower: its time is marked traced). A native "
                        "binary is sampled by time: kernels traced 250 ms in every N x 250 ms "
                        "(auto: every 8 s; docs/native.md)")
    p.add_argument("--cuda-graph-trace", choices=("node", "graph"), default="node",
                   help="a native binary's CUDA graphs: node (default), every kernel of every "
                        "graph launch, which CUPTI pays for at each launch (~0.7 µs a node on "
                        "an H200); graph, one record per launch with its GPU time and none of "
                        "its kernels, for the program's whole run (CUPTI cannot switch back)")
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
    add_session_arguments(p)
    g = p.add_argument_group("a program of your own (tuiprof run [options] -- python SCRIPT.py "
                             "[ARGS...]; see docs/programs.md)")
    from ..program.registry import OPTIONS  # noqa: PLC0415 - the step sources' options
    for opt in OPTIONS:
        opt.add_to(g)
    g.add_argument("--proxy", metavar="LISTEN=UPSTREAM",
                   help="a transparent streaming HTTP proxy: clients talk to LISTEN, every byte "
                        "goes on unchanged to the program's server at UPSTREAM (each PORT or "
                        "HOST:PORT, loopback), and the requests that pass become the session's "
                        "requests, seen from outside the engine (docs/serving.md, \"Proxy\")")


def engine_spec(args: argparse.Namespace):
    """The command line's engine run, ``--model`` resolved: the one place it is (a bad
    ``--model`` fails here, in one line, before anything starts)."""
    from ..spec import EngineSpec  # noqa: PLC0415 - the engine's modules: not at start-up

    spec = EngineSpec.resolve(args.model, trust_remote_code=args.trust_remote_code)
    return dataclasses.replace(
        spec, device=args.device, dtype=args.dtype, seed=args.seed, prompt=args.prompt,
        prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens, loop=not args.no_loop,
        mode=args.mode, compile_mode=args.compile_mode, weights=args.weights,
        max_len=args.max_len or None, temperature=args.temperature, top_k=args.top_k,
        batch=args.batch, max_batch=args.max_batch)


def _make_options(args: argparse.Namespace, engine=None):
    """(ProfilerOptions, SessionStore keyword arguments) from the command line; ``engine``:
    its :func:`engine_spec` made already."""
    from ..spec import ProfilerOptions  # noqa: PLC0415
    from ..startup import command_start  # noqa: PLC0415

    engine = engine or engine_spec(args)
    if args.batch < 1 or (args.max_batch is not None and args.max_batch < 1):
        raise TuiprofError("--batch and --max-batch must be at least 1")
    capped = cap_new_tokens(args, engine.source.model_def.config)
    engine = dataclasses.replace(engine, max_new_tokens=capped)
    ring = args.ring_tokens
    if args.record:
        ring = max(ring, args.max_new_tokens + 1)
    from .options import nvml_hz, sample_every  # noqa: PLC0415

    opts = ProfilerOptions(cupti=not args.no_cupti, nvml=not args.no_nvml, nvml_hz=nvml_hz(args),
                           sample_every=sample_every(args, bool(args.headless)),
                           measure_peaks=args.measure_peaks,
                           alloc_every=args.alloc_every if args.alloc_every == "auto"
                           else int(args.alloc_every),
                           detach_between_bursts=not getattr(args, "cupti_attached", False),
                           engine=engine, started_at=command_start())
    return opts, {"ring_tokens": ring}


DEFAULT_MAX_LEN = 4096   # the static cache without --max-len (engine.hf_adapter.resolve_max_len)


def cap_new_tokens(args: argparse.Namespace, config: dict) -> int:
    """A ``--max-new-tokens`` that the KV cache cannot hold is capped, and the user is told
    (the cache holds the prompt plus the new tokens, up to the model's positions or
    ``--max-len``). The capped count is what the engine runs and the snapshot says."""
    if args.prompt is not None:   # a text prompt's length is known only once tokenized
        return args.max_new_tokens
    limit = int(config.get("max_position_embeddings") or config.get("n_positions")
                or DEFAULT_MAX_LEN)
    want = args.max_len or (max(args.prompt_len, 64) + args.max_new_tokens)
    positions = min(int(want), limit)
    most = positions - args.prompt_len + 1   # the prefill's token, then one per decode step
    if most < 1:
        raise TuiprofError(f"--prompt-len {args.prompt_len} leaves no room in a KV cache of "
                           f"{positions} positions; use a shorter prompt"
                           + ("" if args.max_len is None else " or a larger --max-len"))
    if args.max_new_tokens <= most:
        return args.max_new_tokens
    why = (f"--max-len {args.max_len}" if args.max_len and args.max_len <= limit
           else f"the model's {limit} positions")
    say(f"tuiprof: --max-new-tokens {args.max_new_tokens}: capped at {most} ({most - 1} decode "
        f"steps): the KV cache holds {positions} positions ({why}) and the prompt takes "
        f"{args.prompt_len}")
    args.max_new_tokens = most
    return most


def _make_profiler(args: argparse.Namespace):
    from ..profiler import Profiler  # noqa: PLC0415
    from ..store import SessionStore  # noqa: PLC0415

    opts, store_kwargs = _make_options(args)
    store = SessionStore(**store_kwargs)
    return Profiler(store, opts), store


def run_defaults() -> dict:
    p = argparse.ArgumentParser(add_help=False)
    add_run_arguments(p)
    return vars(p.parse_args([]))


def _cmd_run(args: argparse.Namespace) -> int:
    from ..export.feeds import check_feeds  # noqa: PLC0415

    check_options(args, run_defaults())
    check_arguments(args)
    check_outputs(args)
    args.feeds_parsed = check_feeds(args)
    if args.detach:
        opts, store_kwargs = _make_options(args)   # a bad --model fails here, in the terminal
        return start_detached(args, args.model, {
            "kind": "model", "stem": Path(args.model).name, "options": opts.to_json(),
            "store": store_kwargs})
    if args.tp != 1:
        return _cmd_run_tp(args)
    if not args.headless and not args.in_process:
        return _cmd_run_ui(args)
    from ..export.feeds import start_feeds  # noqa: PLC0415

    if args.headless:
        args.no_loop = True  # headless runs end after --max-new-tokens
    prof, store = _make_profiler(args)
    if not args.headless:
        from ..ui.app import run_app  # noqa: PLC0415
        prof.start()
        feeds = start_feeds(args, store)
        try:
            code = run_app(prof, title=f"tuiprof {args.model}",
                           export_dir=Path(args.export_dir), auto_snapshot=True)
        finally:
            feeds.close()
        return exit_if_busy(prof, code)
    out = snapshot_path(args)
    stopping, old = stop_on_signals(out, prof.done.set)
    feeds = start_feeds(args, store)
    try:
        _say_start(store, prof)
        prof.start()
        said: set = set()
        while not prof.wait(0.5):
            _say_progress(prof, said)
        _say_progress(prof, said)
    finally:
        prof.stop()
        feeds.close()
        for s, h in old.items():
            signal.signal(s, h)
    view = feeds.annotate(store.view())
    write_outputs(view, out, args.record)
    print_summary(view, prof)
    for line in feeds.summary():
        say(f"tuiprof: {line}")
    end_at_once()   # the built-in engine's headless run: written, nothing left to wait for
    if stopping:
        return exit_if_busy(prof, 128 + stopping[0])
    return exit_if_busy(prof, 1 if prof.status.state == "error" else 0)


def snapshot_path(args: argparse.Namespace) -> Path:
    """A headless engine run's snapshot: ``--json``, or ``tuiprof-<model>[-tp<N>].json``."""
    if args.json:
        return output_path(args.json)
    tp = f"-tp{args.tp}" if args.tp != 1 else ""
    return output_path(f"tuiprof-{Path(args.model).name}{tp}.json")


def check_outputs(args: argparse.Namespace) -> None:
    """Every file a run writes at its end, checked before it starts (a path that cannot be
    written is found in well under a second, not after the run)."""
    from ..export._atomic import check_output, check_output_dir  # noqa: PLC0415

    if args.headless:
        check_output(snapshot_path(args), "--json" if args.json else "the snapshot")
    else:
        check_output_dir(args.export_dir, "--export-dir")
    if args.record:
        args.record = str(output_path(args.record))   # absolute before the run
        check_output(args.record, "--record")


def check_arguments(args: argparse.Namespace) -> None:
    """Counts and rates that make no sense are refused before anything starts."""
    for flag, value, least in (("--max-new-tokens", args.max_new_tokens, 1),
                               ("--prompt-len", args.prompt_len, 1),
                               ("--batch", args.batch, 1), ("--max-batch", args.max_batch, 1),
                               ("--max-len", args.max_len, 2), ("--ring-tokens", args.ring_tokens, 1),
                               ("--top-k", args.top_k, 0)):
        if value is not None and value < least:
            what = "positive" if least == 1 else f"at least {least}"
            raise TuiprofError(f"{flag} {value}: must be {what}"
                               + (" (0: no top-k)" if flag == "--top-k" else ""))
    if args.nvml_hz is not None and not args.nvml_hz > 0:
        raise TuiprofError(f"--nvml-hz {args.nvml_hz:g}: must be positive")
    if args.temperature < 0:
        raise TuiprofError(f"--temperature {args.temperature:g}: must be 0 (greedy) or more")
    for flag, value, words in (("--sample-every", args.sample_every, ("auto", "live", "leave")),
                               ("--alloc-every", args.alloc_every, ("auto",))):
        if value in words:
            continue
        try:
            n = int(value)
        except ValueError:
            n = None
        least = 1 if flag == "--sample-every" else 0
        if n is None or n < least:
            raise TuiprofError(f"{flag} {value}: give {' or '.join(words)}, or a whole number "
                               f"of at least {least}")


def _cmd_run_ui(args: argparse.Namespace) -> int:
    """The live app, with the model, collectors and store in a session process of their own.

    The session process starts first: it imports torch and loads the model while this process
    imports Textual and draws the first frame.
    """
    main, name, stem = model_control(args)
    ctl = hold(args, main, name=name, kind="model", stem=stem)
    ctl.start()
    try:
        from ..ui.app import run_app  # noqa: PLC0415
    except BaseException:
        ctl.close()
        raise
    return run_app(ctl, title=f"tuiprof {args.model}", export_dir=Path(args.export_dir),
                   auto_snapshot=True)


def model_control(args: argparse.Namespace):
    """(the session process of ``--model``, not started; its name; a file-name stem)."""
    from ..sessions.launch import model_control as control  # noqa: PLC0415

    opts, store_kwargs = _make_options(args)
    return control(opts, store_kwargs, args.export_dir), args.model, Path(args.model).name


def _check_tp(args: argparse.Namespace, engine) -> None:
    """Fail fast (one line) on a --tp the machine cannot run."""
    if args.tp < 1:
        raise TuiprofError(f"--tp {args.tp}: give the number of ranks (2 or more)")
    if args.in_process:
        raise TuiprofError("--tp runs one process per rank; drop --in-process")
    if args.record:
        raise TuiprofError("--record writes one rank's recording; drop it with --tp")
    if args.weights:
        raise TuiprofError("--tp builds random weights only for now; drop --weights")
    from ..engine.load import pick_device, tp_families  # noqa: PLC0415

    source = engine.source
    config = source.model_def.config
    heads = int(config.get("num_attention_heads") or 0)
    kv = int(config.get("num_key_value_heads") or heads)
    if heads and kv and args.tp > kv:   # before any process starts (each rank would refuse)
        raise TuiprofError(f"--tp {args.tp} needs at least {args.tp} KV heads; {source.name} "
                           f"has {kv}: use --tp {kv} or fewer")
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
    engine = engine_spec(args)
    _check_tp(args, engine)   # before what starts ranks is imported: a refusal takes a moment
    from ..sessions.rank_launcher import RankSetControl  # noqa: PLC0415

    if args.headless:
        args.no_loop = True
    opts, store_kwargs = _make_options(args, dataclasses.replace(
        engine, device=args.device, loop=not args.no_loop))
    from ..export.feeds import Feeds, start_feeds  # noqa: PLC0415

    ctl = RankSetControl(opts, store_kwargs, args.tp, orphan_snapshot_dir=args.export_dir)
    if not args.headless:
        from ..ui.app import run_app  # noqa: PLC0415
        ctl.start()
        feeds = start_feeds(args, ctl)
        try:
            return run_app(ctl, title=f"tuiprof {args.model} TP={args.tp}",
                           export_dir=Path(args.export_dir), auto_snapshot=True)
        finally:
            feeds.close()
    out = snapshot_path(args)
    stopping, old = stop_on_signals(out)
    feeds = Feeds({})
    try:
        say(f"tuiprof: loading {args.model} on {args.tp} ranks ({args.device}) ...")
        ctl.start()
        feeds = start_feeds(args, ctl)
        said = set()
        while not stopping and ctl.failure is None:
            states = [c.status.state for c in ctl.ranks]
            if all(st in ("done", "stopped", "error") for st in states):
                break
            for st in ("compiling", "decode"):
                if st in states and st not in said:
                    said.add(st)
                    say("tuiprof: compiling the decode step on every rank (torch.compile) ..."
                         if st == "compiling" else
                         "tuiprof: generating; Ctrl-C stops and writes the snapshot")
            time.sleep(0.2)
        ctl.stop()
        feeds.close()
        rv = feeds.annotate(ctl.views(raw=True))
        from ..export.snapshot import write_snapshot  # noqa: PLC0415
        written = write_or_fallback(write_snapshot, rv, out, "snapshot")
        say(f"tuiprof: snapshot of {args.tp} ranks written to {written}")
        _print_ranks_summary(rv)
    finally:
        feeds.close()
        ctl.close()
        for s_, h in old.items():
            signal.signal(s_, h)
    failure = ctl.failure or next((f"rank {r}: {c.status.message}" for r, c in
                                   enumerate(ctl.ranks) if c.status.state == "error"), None)
    if failure:
        say(f"tuiprof: {failure}")
        return 1
    return 128 + stopping[0] if stopping else 0


def _print_ranks_summary(rv) -> None:
    """Per-rank lines (the all-ranks screen's figures, same words), the late rank, the skew
    and the cross-rank findings."""
    from ..analysis.cross_rank import HELP_LINE, find_ranks, ranks_summary  # noqa: PLC0415

    s = ranks_summary(rv)
    first = rv[0].meta
    if first.get("model"):
        print(printable(f"model {first.get('model')} on {rv.world_size} ranks "
                        f"({first.get('backend')}, {first.get('device')}, {first.get('dtype')}), "
                        f"weights: {first.get('weights')}"))
    for v in rv.views:
        delay = v.meta.get("test_tp_delay")
        if isinstance(delay, dict) and delay.get("us"):
            print(f"test delay: {delay['us']:.0f} µs injected before each collective on rank "
                  f"{delay.get('rank')} (TUIPROF_TEST_TP_DELAY_US)")
    if s.mode is None:
        print(f"no decode steps on {rv.world_size} ranks")
        return
    ms = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    if s.steps:
        print(f"per step: means over {s.steps} {s.mode} decode steps traced on every rank, "
              f"{s.calls:,} collective calls matched"
              + (f" ({s.incomplete_calls:,} not on every rank, left out)"
                 if s.incomplete_calls else ""))
    for r in s.ranks:
        split = ", no kernel records of steps traced on every rank"
        if r.comm_share is not None:
            split = (f"; step {ms(r.wall_ms)} = compute {ms(r.compute_ms)} + comm "
                     f"{ms(r.comm_ms)} (transfer {ms(r.transfer_ms)} + wait {ms(r.wait_ms)}) "
                     f"+ idle {ms(r.idle_ms)} - overlap {ms(r.overlap_ms)} ms; NCCL share "
                     f"{r.comm_share:.0%}, overlap {(r.overlap_fraction or 0):.0%}; last at "
                     f"{(r.late_share or 0):.0%} of the calls")
            if r.late_by_ms is not None:
                split += f" ({r.late_by_ms:.3f} ms late on median)"
            if r.host_ms is not None:
                split += (f"; launching a step: {r.host_ms:.3f} ms, "
                          f"{r.launches_per_step:,.0f} launches")
        mark = " *late*" if s.late_rank == r.rank and rv.world_size > 1 else ""
        print(f"rank {r.rank} {s.mode}: {r.decode_tokens} decode tokens, {r.tokens_per_s:.1f} "
              f"tokens/s, median {r.step_ms:.2f} ms/step{split}{mark}")
    if rv.world_size > 1:
        print(f"late rank: {'–' if s.late_rank is None else s.late_rank} ({s.late_basis})")
    if s.skew is not None:
        print(f"step-end skew across ranks: median {s.skew.end_median_us:.0f} µs, p90 "
              f"{s.skew.end_p90_us:.0f} µs over {s.skew.steps} steps; clock residual "
              f"{s.clock.get('residual_ns')} ns")
    for f in find_ranks(rv, s):
        print(f"finding: {printable(f.title)}")
        print(f"  {printable(f.evidence)}")
    if s.steps:
        print(f"({HELP_LINE})")
    for r, v in enumerate(rv.views):
        if v.counters.get("dropped"):
            print(f"warning: rank {r}: {v.counters['dropped']} CUPTI records dropped",
                  file=sys.stderr)


def _say_start(store, prof) -> None:
    say(f"tuiprof: loading {prof.options.engine.model} ...")


def _say_progress(prof, said: set) -> None:
    """Headless progress lines: start-up breakdown at the first token, compiling, generating."""
    if "startup" not in said and prof.tracker.progress.first_token_s is not None:
        said.add("startup")
        say(f"tuiprof: {prof.tracker.progress.summary()}")
    state = prof.status.state
    if state in ("compiling", "decode") and state not in said and not prof.done.is_set():
        said.add(state)
        say("tuiprof: compiling the decode step (torch.compile) ..." if state == "compiling"
             else "tuiprof: generating; Ctrl-C stops and writes the snapshot")
