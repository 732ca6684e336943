"""What the Engine costs on top of a bare decode loop.

A: the bare loop, ``torch.compile(adapter.decode)`` (mode ``reduce-overhead`` on CUDA) or the
eager ``adapter.decode``, greedy, static cache, one ``.item()`` per token. B: the :class:`Engine`
in the same mode on the same adapter. Rounds run interleaved A B A B ...; each round's figure
is whole-run tokens / wall clock; the table prints medians and B/A.

    python bench/overhead/engine_overhead.py --model qwen3-0.6b --tokens 256 --rounds 5
    python bench/overhead/engine_overhead.py --model qwen3-tiny --tokens 32 --rounds 5 --device cpu
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from tuiprof.engine.generate import Engine  # noqa: E402
from tuiprof.engine.load import load_model, prompt_ids  # noqa: E402


def bare_loop(adapter, step, prompt: torch.Tensor, tokens: int, cudagraphs: bool) -> float:
    """Prefill + ``tokens - 1`` decode steps with nothing around them; returns tokens/s."""
    dev = prompt.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    adapter.reset_cache()
    nxt = adapter.prefill(prompt).argmax(-1)
    tok = nxt.view(1, 1).clone()
    pos = torch.full((1,), prompt.shape[1], dtype=torch.long, device=dev)
    nxt.item()
    for _ in range(tokens - 1):
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        nxt = step(tok, pos).argmax(-1)
        tok.copy_(nxt.view(1, 1))
        pos.add_(1)
        nxt.item()
    sync()
    return tokens / (time.perf_counter() - t0)


def engine_run(adapter, prompt: torch.Tensor, tokens: int, mode: str, compile_mode: str) -> float:
    engine = Engine(adapter, prompt, max_new_tokens=tokens, mode=mode, compile_mode=compile_mode)
    t0 = time.perf_counter()
    engine.run()
    if engine.error:
        raise SystemExit(f"engine failed: {engine.error}")
    return tokens / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--prompt-len", type=int, default=16)
    args = ap.parse_args(argv)

    loaded = load_model(args.model, device=args.device, dtype=args.dtype,
                        max_len=args.prompt_len + args.tokens + 1)
    adapter = loaded.adapter
    prompt, _ = prompt_ids(loaded, None, args.prompt_len, seed=0)
    cuda = loaded.device.startswith("cuda")
    compile_mode = "reduce-overhead" if cuda else "default"
    torch.set_grad_enabled(False)

    # One compiled step shared by both sides, warmed up before timing (the engine finds it in
    # adapter.compiled_steps and does not compile again).
    engine_run(adapter, prompt, min(args.tokens, 8), "compiled", compile_mode)
    compiled = adapter.compiled_steps[compile_mode]
    cases = {"eager": adapter.decode, "compiled": compiled}
    print(f"{args.model} on {loaded.device} ({loaded.dtype}), {args.tokens} tokens, "
          f"{args.rounds} rounds A B interleaved")
    print(f"{'mode':<9} {'bare tok/s':>11} {'engine tok/s':>13} {'engine/bare':>12}")
    for mode, step in cases.items():
        cg = cuda and mode == "compiled"
        bare_loop(adapter, step, prompt, min(args.tokens, 8), cg)  # warm-up
        a, b = [], []
        for _ in range(args.rounds):
            a.append(bare_loop(adapter, step, prompt, args.tokens, cg))
            b.append(engine_run(adapter, prompt, args.tokens, mode, compile_mode))
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{mode:<9} {ma:>11.1f} {mb:>13.1f} {mb / ma:>12.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
