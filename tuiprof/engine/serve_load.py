"""A model served by transformers' continuous batching, with load generated in this process:
what ``tuiprof serve`` runs as its program (in the session process, so the transformers request
source records every request, step and token exactly as for a server of one's own).

Load: open-loop Poisson arrivals at ``--rate`` requests/s, or closed-loop ``--concurrency`` C
(a new request as soon as one finishes), bounded by ``--requests`` N or ``--duration`` S (no
new request after S; those in flight finish). Prompt and output lengths: ``N`` (fixed),
``A:B`` (uniform integers), ``N~S`` (normal, mean N, standard deviation S, at least 1).
Prompts are random token ids (seeded); the output is exactly the length asked for (no
end-of-sequence stop). Requests are named ``r0``, ``r1``, …

    python -m tuiprof.engine.serve_load --model qwen3-tiny --rate 4 --requests 32
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time

from ..errors import TuiprofError
from ..marks import request_warmup
from .lengths import Lengths, default_load, parse_lengths  # noqa: F401  (the options' type)

READY = "tuiprof-serve: serving"   # printed once the engine takes requests
WARMUP = "warmup"                  # the warm-up requests' id prefix


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tuiprof.engine.serve_load",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--seed", type=int, default=0)
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, default=None, help="Poisson arrivals, requests/s")
    load.add_argument("--concurrency", type=int, default=None,
                      help="closed loop: this many requests in flight")
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--duration", type=float, default=None)
    p.add_argument("--prompt-len", type=parse_lengths, default=parse_lengths("64"))
    p.add_argument("--output-len", type=parse_lengths, default=parse_lengths("64"))
    p.add_argument("--max-batch-tokens", type=int, default=None)
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--warmup", type=int, default=1,
                   help="requests served (and finished) before the load starts (default 1)")
    return p


class Load:
    """Submits requests to a continuous-batching manager and collects their results."""

    def __init__(self, manager, vocab: int, args: argparse.Namespace) -> None:
        self.manager = manager
        self.vocab = vocab
        self.args = args
        self.rng = random.Random(args.seed)
        self.n = 0
        self.sent: dict[str, int] = {}   # requests sent per id prefix (warmup, r)
        self.done = 0
        self.failed = 0
        self.lock = threading.Lock()

    def submit(self, prefix: str = "r") -> str:
        a = self.args
        plen, olen = a.prompt_len.draw(self.rng), a.output_len.draw(self.rng)
        ids = [self.rng.randrange(4, self.vocab) for _ in range(plen)]
        with self.lock:
            k = self.sent.get(prefix, 0)
            self.sent[prefix] = k + 1
            self.n += 1
            rid = f"{prefix}{k}"
        if prefix == WARMUP:   # kept apart from the load's requests in every count
            request_warmup(rid)
        self.manager.add_request(ids, request_id=rid, max_new_tokens=olen)
        return rid

    def collect(self, want: int, deadline: float | None = None) -> int:
        """Wait until ``want`` results have come back (or ``deadline``); returns how many."""
        got = 0
        while got < want:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            res = self.manager.get_result(timeout=min(1.0, left) if left is not None else 1.0)
            if res is None:
                if not self.manager.is_running():
                    raise TuiprofError("the continuous-batching loop stopped (see the log)")
                continue
            if res.is_finished():
                got += 1
                self.failed += res.error is not None
        return got


def run(args: argparse.Namespace) -> dict:
    """Build the model, start continuous batching, run the load; returns a summary."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    from .load import load_model

    loaded = load_model(args.model, device=args.device, dtype=args.dtype, seed=args.seed)
    model = getattr(loaded.adapter, "model", None)
    if model is None or not hasattr(model, "init_continuous_batching"):
        raise TuiprofError(f"{args.model} ({loaded.source.family}) is not a transformers model "
                           "with continuous batching; serve a registry model of the qwen3 or "
                           "hf family, or a local Hugging Face directory")
    cb_kwargs = {k: v for k, v in (("max_batch_tokens", args.max_batch_tokens),
                                   ("num_blocks", args.num_blocks),
                                   ("block_size", args.block_size)) if v is not None}
    gen = transformers.GenerationConfig(max_new_tokens=int(args.output_len.mean()),
                                        do_sample=False, eos_token_id=None, pad_token_id=0)
    cfg_cls = getattr(transformers, "ContinuousBatchingConfig", None)
    cb = cfg_cls(**cb_kwargs) if cfg_cls is not None else None
    vocab = int(model.config.vocab_size)
    with torch.inference_mode():
        manager = model.init_continuous_batching(generation_config=gen,
                                                 continuous_batching_config=cb)
    manager.start()
    load = Load(manager, vocab, args)
    try:
        for _ in range(max(0, args.warmup)):
            load.submit(WARMUP)
        load.collect(max(0, args.warmup))
        print(READY, flush=True)
        t0 = time.monotonic()
        limit = args.requests if args.requests else None
        end = t0 + args.duration if args.duration else None
        if args.rate:
            sent = _open_loop(load, args.rate, limit, end)
            load.collect(sent)
        else:
            _closed_loop(load, args.concurrency or 1, limit, end)
        wall = time.monotonic() - t0
    finally:
        manager.stop(block=True, timeout=30)
    n = load.n - max(0, args.warmup)
    return {"requests": n, "failed": load.failed, "wall_s": wall,
            "requests_per_s": n / wall if wall else 0.0}


def _open_loop(load: Load, rate: float, limit: int | None, end: float | None) -> int:
    """Poisson arrivals at ``rate`` until ``limit`` requests or time ``end``."""
    sent = 0
    nxt = time.monotonic()
    while (limit is None or sent < limit) and (end is None or nxt < end):
        delay = nxt - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        load.submit()
        sent += 1
        nxt += load.rng.expovariate(rate)
    return sent


def _closed_loop(load: Load, c: int, limit: int | None, end: float | None) -> None:
    """``c`` requests in flight, a new one as each finishes, until ``limit`` or ``end``."""
    sent = 0
    in_flight = 0
    while in_flight < c and (limit is None or sent < limit):
        load.submit()
        sent += 1
        in_flight += 1
    while in_flight:
        in_flight -= load.collect(1)
        if (limit is None or sent < limit) and (end is None or time.monotonic() < end):
            load.submit()
            sent += 1
            in_flight += 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    default_load(args)
    try:
        summary = run(args)
    except TuiprofError as exc:
        print(f"tuiprof serve: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C is how a user ends the load early: one line, as python's 130, no traceback
        # (what was measured is in the session already; the engine was stopped above)
        print("tuiprof serve: interrupted (Ctrl-C): the load stopped", file=sys.stderr,
              flush=True)
        return 130
    print("tuiprof-serve: done " + json.dumps(summary), flush=True)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
