"""``tuiprof serve --model NAME``: a registry model (or a local Hugging Face directory) served
by transformers' continuous batching in the session process, under load generated there
(:mod:`tuiprof.engine.serve_load`), in the live app or ``--headless --json OUT``.

It is ``tuiprof run -- python -m tuiprof.engine.serve_load …`` with the load's options checked
first: the same panes, the same snapshot, every request recorded by the transformers request
source (docs/serving.md)."""
from __future__ import annotations

import argparse
import math
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


def positive_number(flag: str, value: float | None, what: str) -> None:
    """A rate or a time: a finite number above 0 (nan, inf and negatives are one line)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise TuiprofError(f"{flag} {value:g}: must be a positive number ({what})")


def at_least(flag: str, value: int | None, least: int, what: str = "") -> None:
    if value is not None and value < least:
        raise TuiprofError(f"{flag} {value}: must be at least {least}" + (f" ({what})" if what
                                                                            else ""))


MAX_SEED = 2**32 - 1    # numpy's and most generators' seeds


def check_load(args: argparse.Namespace) -> None:
    """Every number of the load, checked before anything starts (the model is not loaded yet):
    one line each."""
    from ..engine.lengths import parse_lengths  # noqa: PLC0415 - no torch there

    if args.rate is not None and args.concurrency is not None:
        raise TuiprofError("--rate (open loop) and --concurrency (closed loop): give one")
    positive_number("--rate", args.rate, "requests per second")
    positive_number("--duration", args.duration, "seconds")
    at_least("--concurrency", args.concurrency, 1)
    at_least("--requests", args.requests, 1)
    at_least("--max-batch-tokens", args.max_batch_tokens, 1, "tokens a step")
    at_least("--num-blocks", args.num_blocks, 1, "KV-cache blocks")
    at_least("--warmup", args.warmup, 0, "requests; 0: none")
    seed = getattr(args, "seed", None)
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise TuiprofError(f"--seed {seed}: must be 0 to {MAX_SEED}")
    for flag in ("prompt_len", "output_len"):
        try:
            parse_lengths(getattr(args, flag))
        except ValueError as exc:
            raise TuiprofError(f"--{flag.replace('_', '-')} {exc}") from None


def model_config(model: str) -> dict:
    """The model's config.json (a registry model's, or a directory's), read, not built."""
    import json  # noqa: PLC0415

    from ..engine.source import resolve_model  # noqa: PLC0415

    p = Path(model).expanduser() / "config.json"
    if p.is_file():
        try:
            config = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            return {}
        return config if isinstance(config, dict) else {}
    return resolve_model(model).model_def.config or {}


def check_context(model: str, prompt: str, output: str) -> None:
    """A request of the load must fit the model's positions (``max_position_embeddings``): a
    prompt of 10,000,000 tokens ran for minutes before anything said so."""
    from ..engine.lengths import parse_lengths  # noqa: PLC0415

    config = model_config(model)
    limit = config.get("max_position_embeddings") or config.get("n_positions")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 2:
        return          # a config without it: the engine's own check stands
    p, o = parse_lengths(prompt), parse_lengths(output)
    if p.most() + o.most() > limit:
        raise TuiprofError(
            f"--prompt-len {prompt} with --output-len {output}: a request of up to "
            f"{p.most():,} + {o.most():,} tokens does not fit the model's {limit:,} positions "
            "(max_position_embeddings); use shorter requests")


def load_argv(args: argparse.Namespace, model: str) -> list[str]:
    """The load program's command line (after ``python``), from checked options."""
    check_load(args)
    check_context(model, args.prompt_len, args.output_len)
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

    at_least("--ring-tokens", args.ring_tokens, 1)
    value = args.sample_every
    if value not in ("auto", "live") and not (str(value).isdigit() and int(value) >= 1):
        raise TuiprofError(f"--sample-every {value}: give auto or live, or a whole number of "
                           "at least 1")
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
