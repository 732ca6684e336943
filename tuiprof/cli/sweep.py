"""``tuiprof sweep``: argument parsing, a single updating progress line, and the output files
(the sweeps themselves are :mod:`tuiprof.sweep`).

``add_arguments`` imports no torch (cheap for the main CLI); ``run`` does.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Sequence, TextIO

from tuiprof.sweep.results import MODES, PASSES

if TYPE_CHECKING:
    from tuiprof.sweep.runner import Progress


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _choices(allowed: Sequence[str]):
    def parse(text: str) -> list[str]:
        items = _csv(text)
        bad = [i for i in items if i not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{','.join(bad) or text!r}: choose from {','.join(allowed)}")
        return items

    return parse


def _floats(text: str) -> list[float]:
    try:
        return [float(t) for t in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _weights(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError("expected MODEL=PATH")
    return name, path


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Add the sweep's options to ``parser`` (the ``tuiprof sweep`` subcommand)."""
    parser.add_argument("--models", type=_csv, default=None,
                        help="comma-separated registry names (--serve: one model, or a local "
                             "Hugging Face directory)")
    parser.add_argument("--ui", action="store_true",
                        help="show the sweep screen (cells fill in as they finish; Escape closes)")
    parser.add_argument("--seq-lens", type=_ints, default=None,
                        help="comma-separated sequence lengths (the study sweep)")
    parser.add_argument("--tp", type=_ints, default=None, metavar="N,M",
                        help="instead of sequence lengths: decode at these tensor-parallel "
                             "degrees (e.g. 1,2), one session of ranks each, and the scaling")
    parser.add_argument("--tp-tokens", type=int, default=256,
                        help="decode tokens per mode in each --tp session (default 256)")
    parser.add_argument("--batches", type=_ints, default=None,
                        help="comma-separated batch sizes: a decode sweep of tokens/s, ms/step, MBU, "
                             "MFU and the bottleneck per (model, mode, batch), with the batch knee")
    parser.add_argument("--prompt-len", type=int, default=16,
                        help="prompt tokens per sequence of a --batches sweep (default 16)")
    parser.add_argument("--batch", type=int, default=1, help="batch size of the full-sequence passes (default 1)")
    parser.add_argument("--passes", type=_choices(PASSES), default=["inference"],
                        help=f"comma-separated, of {','.join(PASSES)} (default inference)")
    parser.add_argument("--mode", type=_choices(MODES), default=["eager"], dest="modes",
                        help="eager, compiled or eager,compiled (default eager)")
    parser.add_argument("--attention", type=_choices(("plain", "sdpa")), default=None,
                        help="attention path(s) of families with the switch: plain, sdpa or plain,sdpa")
    parser.add_argument("--memory-limit", type=float, default=None, metavar="GiB",
                        help="cap usable GPU memory (torch.cuda.set_per_process_memory_fraction)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="warm-up iterations (decode steps) per cell (default 2; --batches: 8)")
    parser.add_argument("--iters", type=int, default=None,
                        help="measured iterations (decode steps) per cell (default 5; --batches: 24)")
    parser.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    parser.add_argument("--dtype", default=None, help="override every model's dtype (e.g. float32)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    parser.add_argument("--weights", type=_weights, action="append", default=[], metavar="MODEL=PATH",
                        help="safetensors weights (file or directory) for a model; repeatable")
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode, e.g. reduce-overhead")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled iteration per cell")
    parser.add_argument("--out", default="out/sweep", help="output directory (default out/sweep)")
    g = parser.add_argument_group("a server under load (--serve): one tuiprof serve run per cell")
    g.add_argument("--serve", action="store_true",
                   help="sweep request rates (--rates) or concurrencies (--concurrency) of the "
                        "model served by transformers' continuous batching")
    g.add_argument("--engine", choices=("transformers", "vllm"), default="transformers",
                   help="--serve: the server (as tuiprof serve --engine)")
    g.add_argument("--rates", type=_floats, default=None, metavar="R,R,...",
                   help="open-loop Poisson arrival rates, requests/s")
    g.add_argument("--concurrency", type=_ints, default=None, metavar="C,C,...",
                   help="closed-loop concurrencies (requests in flight)")
    g.add_argument("--requests", type=int, default=None, help="requests per cell (default 32)")
    g.add_argument("--duration", type=float, default=None, help="seconds of load per cell")
    g.add_argument("--output-len", default="64", help="output tokens: N, A:B or N~S (default 64)")
    g.add_argument("--serve-prompt-len", default=None,
                   help="prompt tokens of --serve: N, A:B or N~S (default: --prompt-len)")
    g.add_argument("--max-batch-tokens", type=int, default=None)
    g.add_argument("--num-blocks", type=int, default=None)
    g.add_argument("--slo-ttft-ms", type=float, default=None, help="SLO: TTFT at most this")
    g.add_argument("--slo-itl-ms", type=float, default=None,
                   help="SLO: a request's mean inter-token latency at most this")
    g.add_argument("--slo-attainment", type=float, default=0.9,
                   help="share of requests within the SLO for a cell to meet it (default 0.9)")
    g.add_argument("--no-cupti", action="store_true", help="--serve cells: no kernel records")


class ProgressLine:
    """Prints each ``Progress`` over the previous one (``\\r``) on a terminal, one line each otherwise."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.width = 0

    def __call__(self, p: "Progress") -> None:
        text = p.line()
        if self.tty:
            pad = max(0, self.width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self.width = len(text)
        elif p.phase == "done":
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()


def run_batches(args: argparse.Namespace) -> int:
    """The ``--batches`` decode sweep: table, chart and files; 0 when no cell failed."""
    from tuiprof.sweep.batch_sweep import run_batch_sweep  # imports torch

    if args.seq_lens:
        raise ValueError("--batches and --seq-lens are two sweeps: run them separately")
    if getattr(args, "ui", False):
        raise ValueError("--ui shows the sequence-length sweep; a --batches sweep prints its "
                         "table and chart")
    sweep = run_batch_sweep(args.models, args.batches, args.modes, device=args.device,
                            dtype=args.dtype, seed=args.seed, prompt_len=args.prompt_len,
                            warmup=8 if args.warmup is None else args.warmup,
                            iters=24 if args.iters is None else args.iters,
                            compile_mode=args.compile_mode, memory_limit_gib=args.memory_limit,
                            profile=not args.no_profile,
                            progress=lambda text: print(text, file=sys.stderr, flush=True))
    paths = sweep.write(args.out)
    print(sweep.table())
    print(sweep.chart())
    bad = [r for r in sweep.cells if r.status in ("oom", "error")]
    print(f"{len(sweep.cells)} cells, {len(bad)} failed or out of memory; wrote "
          f"{', '.join(str(p) for p in paths.values())}")
    return 1 if bad else 0


def run_serve(args: argparse.Namespace) -> int:
    """``--serve``: one ``tuiprof serve --headless`` per rate or concurrency; 0 when no cell
    failed."""
    from tuiprof.cli.serve import at_least, check_context, check_model, positive_number  # noqa: PLC0415
    from tuiprof.engine.lengths import parse_lengths  # noqa: PLC0415
    from tuiprof.errors import TuiprofError  # noqa: PLC0415
    from tuiprof.sweep.serve_sweep import run_serve_sweep  # noqa: PLC0415

    if not args.models or len(args.models) != 1:
        raise TuiprofError("--serve sweeps one model: --models NAME (or a directory)")
    if bool(args.rates) == bool(args.concurrency):
        raise TuiprofError("--serve needs --rates R,R,... or --concurrency C,C,... (one of them)")
    kind, values = ("rate", args.rates) if args.rates else ("concurrency", args.concurrency)
    if any(not (math.isfinite(v) and v > 0) for v in values):
        raise TuiprofError(f"--{'rates' if kind == 'rate' else 'concurrency'}: every value "
                           "must be a positive number")
    positive_number("--duration", args.duration, "seconds")
    at_least("--requests", args.requests, 1)
    at_least("--max-batch-tokens", args.max_batch_tokens, 1, "tokens a step")
    at_least("--num-blocks", args.num_blocks, 1, "KV-cache blocks")
    at_least("--warmup", args.warmup, 0, "requests; 0: none")
    prompt = args.serve_prompt_len or str(args.prompt_len)
    for flag, text in (("--serve-prompt-len", prompt), ("--output-len", args.output_len)):
        try:
            parse_lengths(text)
        except ValueError as exc:
            raise TuiprofError(f"{flag} {exc}") from None
    engine = getattr(args, "engine", "transformers")
    if engine == "vllm":
        from pathlib import Path  # noqa: PLC0415

        from tuiprof.cli.serve import vllm_python  # noqa: PLC0415

        if not (Path(args.models[0]).expanduser() / "config.json").is_file():
            raise TuiprofError(f"--engine vllm serves a local model directory; "
                               f"{args.models[0]} is none")
        model = str(Path(args.models[0]).expanduser().resolve())
        vllm_python()
    else:
        model = check_model(args.models[0])
    check_context(model, prompt, args.output_len)
    load = ["--prompt-len", prompt, "--output-len", args.output_len, "--seed", str(args.seed),
            "--no-nvml", "--engine", engine]
    if args.requests is None and args.duration is None:
        args.requests = 32
    for flag in ("requests", "duration", "max_batch_tokens", "num_blocks", "device", "dtype"):
        if engine == "vllm" and flag == "device":
            continue
        v = getattr(args, flag, None)
        if v is not None:
            load += [f"--{flag.replace('_', '-')}", str(v)]
    if args.warmup is not None:
        load += ["--warmup", str(args.warmup)]
    if args.no_cupti:
        load.append("--no-cupti")
    sweep = run_serve_sweep(model, kind, values, load, args.out, slo_ttft_ms=args.slo_ttft_ms,
                            slo_itl_ms=args.slo_itl_ms, attainment=args.slo_attainment,
                            progress=lambda text: print(text, file=sys.stderr, flush=True))
    paths = sweep.write(args.out)
    print(sweep.table())
    fnd = sweep.finding
    if fnd is not None:
        print(f"\n{fnd.title}\n  {fnd.evidence}")
    bad = [c for c in sweep.cells if c.status != "ok"]
    print(f"{len(sweep.cells)} cells, {len(bad)} failed; wrote "
          f"{', '.join(str(p) for p in paths.values())}")
    return 1 if bad else 0


def run(name: str, args: argparse.Namespace) -> int:
    """Run the sweep described by ``args``; write its files; 0 when no cell failed, 1 otherwise."""
    if getattr(args, "serve", False):
        return run_serve(args)
    if not args.models:
        from tuiprof.errors import TuiprofError  # noqa: PLC0415

        raise TuiprofError("tuiprof sweep needs --models (and --seq-lens, --batches or --tp), "
                           "or --serve with one model")
    if getattr(args, "tp", None):
        from tuiprof.sweep.tp import run as run_tp  # noqa: PLC0415

        return run_tp(args)
    if getattr(args, "batches", None):
        return run_batches(args)
    if not args.seq_lens:
        from tuiprof.errors import TuiprofError  # noqa: PLC0415

        raise TuiprofError("tuiprof sweep needs --seq-lens (the study sweep), --batches (the decode "
                           "batch sweep) or --tp (a tensor-parallel sweep)")
    from tuiprof.sweep.runner import run_sweep  # imports torch

    kwargs = dict(
        models=args.models, seq_lens=args.seq_lens, batch=args.batch, passes=args.passes,
        modes=args.modes, memory_limit_gib=args.memory_limit,
        warmup=2 if args.warmup is None else args.warmup, iters=5 if args.iters is None else args.iters,
        device=args.device, attention=args.attention, dtype=args.dtype, seed=args.seed,
        weights=dict(args.weights), compile_mode=args.compile_mode,
        compile_backend=args.compile_backend, profile=not args.no_profile,
    )
    if getattr(args, "ui", False):
        from tuiprof.ui.screens.sweep import SweepApp  # the sweep screen (Textual)

        result = SweepApp(kwargs).run()
        if result is None:
            print("sweep cancelled before any result", file=sys.stderr)
            return 1
    else:
        line = ProgressLine()
        try:
            result = run_sweep(**kwargs, progress=line)
        finally:
            line.close()
    paths = result.write(args.out)
    print(result.tables()["time"].markdown())
    bad = [r for r in result.cells if r.status in ("oom", "error")]
    print(f"{len(result.cells)} cells, {len(bad)} failed; wrote {', '.join(str(p) for p in paths.values())}")
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    """The sweep command alone (its own parser): ``main(["--models", ..., "--seq-lens", ...])``."""
    parser = argparse.ArgumentParser(prog="tuiprof sweep", description="Time and profile model workloads.")
    add_arguments("sweep", parser)
    args = parser.parse_args(argv)
    try:
        return run("sweep", args)
    except Exception as exc:  # a one-line message for user errors (unknown model, bad dtype)
        from tuiprof.errors import TuiprofError

        if isinstance(exc, (TuiprofError, ValueError)):
            print(f"tuiprof: {exc}", file=sys.stderr)
            return 2
        raise
