"""The engine with its HF step's masks made before the forward (as ``generate()`` does) against
the forward making its own (before session 15), interleaved in one process.

Each round runs the :class:`Engine` for ``--tokens`` steps (prefill included) in each of the
four cases (eager/compiled × masks before/inside); a round's figure is the median host ms of
its decode steps, and the table prints the medians over rounds and new/old. Both compiled cases
are compiled and their graphs captured before the first round.

    python bench/masks_ab.py --model qwen3-0.6b --tokens 256 --rounds 7
    python bench/masks_ab.py --model qwen3-tiny --tokens 32 --rounds 3 --device cpu
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tuiprof.engine.generate import Engine  # noqa: E402
from tuiprof.engine.load import load_model, prompt_ids  # noqa: E402


class InsideMasks:
    """The real adapter without ``decode_masks`` (the forward makes its masks), with compiled
    steps of its own."""

    decode_masks = None

    def __init__(self, real) -> None:
        self._real = real
        self.vocab_size, self.max_len = real.vocab_size, real.max_len
        self.compiled_steps: dict = {}

    def __getattr__(self, name):
        return getattr(self._real, name)

    def decode(self, token, pos, cache=None):
        return self._real.decode(token, pos, cache)


class Steps:
    """Host ms of every decode step (the engine's listener)."""

    def __init__(self) -> None:
        self.ms: list[float] = []

    def token_finished(self, ev) -> None:
        if ev.phase == "decode":
            self.ms.append(ev.host_ms)

    def __getattr__(self, name):  # every other listener call: nothing to do
        return lambda *a, **k: None


def run(adapter, prompt, tokens: int, mode: str, compile_mode: str) -> tuple[float, float]:
    """(median host ms of the decode steps, whole-run ms per step)."""
    steps = Steps()
    engine = Engine(adapter, prompt, max_new_tokens=tokens, mode=mode, compile_mode=compile_mode,
                    listener=steps)
    t0 = time.perf_counter()
    engine.run()
    wall = (time.perf_counter() - t0) * 1e3 / tokens
    if engine.error:
        raise SystemExit(f"engine failed: {engine.error}")
    return statistics.median(steps.ms), wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--modes", default="eager,compiled")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")

    loaded = load_model(args.model, device=args.device, max_len=args.prompt_len + args.tokens + 1)
    new = loaded.adapter
    old = InsideMasks(new)
    prompt, _ = prompt_ids(loaded, None, args.prompt_len, seed=0)
    cuda = loaded.device.startswith("cuda")
    compile_mode = "reduce-overhead" if cuda else "default"
    torch.set_grad_enabled(False)
    cases = [(m, name, a) for m in modes for name, a in (("inside", old),
                                                                            ("before", new))]
    t0 = time.perf_counter()
    for mode, _, adapter in cases:  # compile and capture first
        run(adapter, prompt, min(args.tokens, 8), mode, compile_mode)
    print(f"{args.model} on {loaded.device} ({loaded.dtype}), {args.tokens} steps a run, "
          f"{args.rounds} rounds interleaved; warm-up {time.perf_counter() - t0:.0f} s")
    step_ms = {(m, n): [] for m, n, _ in cases}
    wall_ms = {(m, n): [] for m, n, _ in cases}
    for r in range(args.rounds):
        order = cases if r % 2 == 0 else cases[::-1]
        for mode, name, adapter in order:
            s, w = run(adapter, prompt, args.tokens, mode, compile_mode)
            step_ms[(mode, name)].append(s)
            wall_ms[(mode, name)].append(w)
        print(f"round {r}: " + "  ".join(f"{m} {n} {step_ms[(m, n)][-1]:.3f}"
                                         for m, n, _ in cases), flush=True)
    print(f"{'mode':<9} {'masks':<7} {'step ms (median)':>17} {'run ms/step':>12} "
          f"{'new/old step':>13} {'new/old run':>12}")
    for mode in modes:
        base_s = statistics.median(step_ms[(mode, "inside")])
        base_w = statistics.median(wall_ms[(mode, "inside")])
        for name in ("inside", "before"):
            s = statistics.median(step_ms[(mode, name)])
            w = statistics.median(wall_ms[(mode, name)])
            print(f"{mode:<9} {name:<7} {s:>17.3f} {w:>12.3f} {s / base_s:>13.3f} "
                  f"{w / base_w:>12.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
