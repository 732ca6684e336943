"""``tuiprof serve --model NAME``: a registry model (or a local Hugging Face directory) served
by transformers' continuous batching in the session process, under load generated there
(:mod:`tuiprof.engine.serve_load`), in the live app or ``--headless --json OUT``.

It is ``tuiprof run -- python -m tuiprof.engine.serve_load …`` with the load's options checked
first: the same panes, the same snapshot, every request recorded by the transformers request
source (docs/serving.md)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import TuiprofError

LOAD_MODULE = "tuiprof.engine.serve_load"
VLLM_LOAD_MODULE = "tuiprof.engine.vllm_load"
ENGINES = ("transformers", "vllm")
VLLM_PYTHON_ENV = "TUIPROF_VLLM_PYTHON"


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", required=True,
                   help="registry name (a transformers family: qwen3, hf) or a local Hugging "
                        "Face directory (--engine vllm: a directory)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when present)")
    p.add_argument("--dtype", help="bfloat16 (GPU default), float32 (CPU default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, prompts and arrivals")
    add_load_arguments(p)
    p.add_argument("--headless", action="store_true", help="no UI: run, then write --json")
    p.add_argument("--json", help="snapshot path (headless), default tuiprof-serve-<model>.json")
    p.add_argument("--export-dir", default=".", help="where e/n exports and auto snapshots go")
    p.add_argument("--no-cupti", action="store_true", help="no kernel records")
    p.add_argument("--no-nvml", action="store_true")
    p.add_argument("--cupti-attached", action="store_true",
                   help="keep CUPTI attached between sampling bursts")
    p.add_argument("--sample-every", default="auto",
                   help="trace device activity for 1 step in N (as tuiprof run: auto samples "
                        "bursts, headless too; 1: every step)")
    p.add_argument("--ring-tokens", type=int, default=64,
                   help="raw records kept for the last N steps")
    from ..export.feeds import add_feed_arguments  # noqa: PLC0415
    add_feed_arguments(p)


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    """The load's options (also ``tuiprof sweep --serve``'s)."""
    p.add_argument("--engine", choices=ENGINES, default="transformers",
                   help="transformers: continuous batching in the session process; vllm: "
                        "vLLM's OpenAI server (its Python: $TUIPROF_VLLM_PYTHON, else this "
                        "one when it has vllm) driven over HTTP (docs/serving.md)")
    p.add_argument("--port", type=int, default=None,
                   help="--engine vllm: the server's port on 127.0.0.1 (default: a free one)")
    p.add_argument("--rate", type=float, default=None,
                   help="open loop: Poisson arrivals at this many requests/s")
    p.add_argument("--concurrency", type=int, default=None,
                   help="closed loop: this many requests in flight (default 4 without --rate)")
    p.add_argument("--requests", type=int, default=None,
                   help="requests to send (default 32 without --duration)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds to send requests for (those in flight then finish)")
    p.add_argument("--prompt-len", default="64",
                   help="prompt tokens: N, A:B (uniform) or N~S (normal) (default 64)")
    p.add_argument("--output-len", default="64",
                   help="output tokens: N, A:B or N~S (default 64)")
    p.add_argument("--max-batch-tokens", type=int, default=None,
                   help="continuous batching: tokens per step (default: transformers')")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="continuous batching: KV-cache blocks (default: a share of memory)")
    p.add_argument("--warmup", type=int, default=1,
                   help="requests served before the load starts (default 1)")


def load_argv(args: argparse.Namespace, model: str) -> list[str]:
    """The load program's command line (after ``python``), from checked options."""
    from ..engine.lengths import parse_lengths  # noqa: PLC0415 - no torch there

    if args.rate is not None and args.concurrency is not None:
        raise TuiprofError("--rate (open loop) and --concurrency (closed loop): give one")
    if args.rate is not None and args.rate <= 0:
        raise TuiprofError("--rate must be positive (requests per second)")
    if args.concurrency is not None and args.concurrency < 1:
        raise TuiprofError("--concurrency must be at least 1")
    if args.requests is not None and args.requests < 1:
        raise TuiprofError("--requests must be at least 1")
    if args.duration is not None and args.duration <= 0:
        raise TuiprofError("--duration must be positive (seconds)")
    for flag in ("prompt_len", "output_len"):
        try:
            parse_lengths(getattr(args, flag))
        except ValueError as exc:
            raise TuiprofError(f"--{flag.replace('_', '-')} {exc}") from None
    vllm = getattr(args, "engine", "transformers") == "vllm"
    argv = ["-m", VLLM_LOAD_MODULE if vllm else LOAD_MODULE, "--model", model,
            "--seed", str(args.seed), "--prompt-len", str(args.prompt_len),
            "--output-len", str(args.output_len), "--warmup", str(args.warmup)]
    if vllm:
        argv += ["--port", str(args.port or _free_port()), "--python", vllm_python()]
    for flag in (("dtype",) if vllm else ("device", "dtype")) + (
            "rate", "concurrency", "requests", "duration", "max_batch_tokens", "num_blocks"):
        v = getattr(args, flag, None)
        if v is not None:
            argv += [f"--{flag.replace('_', '-')}", str(v)]
    return argv


def load_meta(args: argparse.Namespace) -> dict:
    kind = "rate" if args.rate is not None else "concurrency"
    value = args.rate if args.rate is not None else (args.concurrency or 4)
    return {"kind": kind, "value": value, "requests": args.requests or (
        None if args.duration else 32), "duration_s": args.duration,
        "prompt_len": str(args.prompt_len), "output_len": str(args.output_len),
        "generator": VLLM_LOAD_MODULE if getattr(args, "engine", "") == "vllm"
        else LOAD_MODULE}


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_python() -> str:
    """The Python that runs vLLM: ``$TUIPROF_VLLM_PYTHON``, else this one when it has vllm."""
    import importlib.util  # noqa: PLC0415
    import os  # noqa: PLC0415

    py = os.environ.get(VLLM_PYTHON_ENV)
    if py:
        if not os.path.isfile(py):
            raise TuiprofError(f"{VLLM_PYTHON_ENV}={py}: no such file (bench/vllm_cpu_setup.sh "
                               "makes a Python with vLLM in .vllm-venv)")
        return py
    if importlib.util.find_spec("vllm") is None:
        raise TuiprofError(f"--engine vllm: this Python has no vllm; set {VLLM_PYTHON_ENV} to "
                           "one that has (bench/vllm_cpu_setup.sh makes .vllm-venv)")
    return sys.executable


def check_model(spec: str) -> str:
    """The model as the load program gets it (a directory made absolute), checked now."""
    from ..engine.source import resolve_model  # noqa: PLC0415

    resolve_model(spec)   # a one-line TuiprofError for an unknown model or a bad directory
    p = Path(spec).expanduser()
    return str(p.resolve()) if p.is_dir() else spec


def program_args(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """``tuiprof run``'s options for the load program."""
    from .run import run_defaults  # noqa: PLC0415

    if getattr(args, "engine", "transformers") == "vllm":
        p = Path(args.model).expanduser()
        if not (p / "config.json").is_file():
            raise TuiprofError(f"--engine vllm serves a local model directory; {args.model} is "
                               "none (python -m tuiprof.engine.model_dir DIR writes one)")
        model = str(p.resolve())
        vllm_python()   # a one-line error now when there is none
    else:
        model = check_model(args.model)
    ns = argparse.Namespace(**run_defaults())
    for key in ("headless", "json", "export_dir", "no_cupti", "no_nvml", "cupti_attached",
                "sample_every", "ring_tokens", "feed_metrics", "feed_otlp"):
        setattr(ns, key, getattr(args, key))
    ns.program = [sys.executable, *load_argv(args, model)]
    if ns.json:
        parent = Path(ns.json).expanduser().resolve().parent
        if not parent.is_dir():
            raise TuiprofError(f"--json {ns.json}: no such directory {parent}")
    else:
        ns.json = f"tuiprof-serve-{Path(model).name}.json"
    ns.meta = {"load": load_meta(args)}
    return ns


def run(name: str, args: argparse.Namespace) -> int:
    from .common import print_summary, say, write_outputs  # noqa: PLC0415
    from .program import run_headless, run_live  # noqa: PLC0415

    from ..export.feeds import check_feeds  # noqa: PLC0415

    ns = program_args(args, name)
    ns.feeds_parsed = check_feeds(ns)
    if ns.headless:
        return run_headless(ns, say, print_summary, write_outputs)
    return run_live(ns)
