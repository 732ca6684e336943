"""What one program step costs tuiprof's own bookkeeping, on the thread that marks it.

A ``generate()`` step under ``tuiprof run`` passes three hooks on the program's thread
(``StepRecorder.begin`` at ``prepare_inputs_for_generation``, ``launched`` at the logits
processors, the next ``begin`` ending it), which reach the real :class:`~tuiprof.profiler.Profiler`
(``token_started`` / ``token_launched`` / ``token_finished``) and its :class:`SessionStore`.
This times that path with no model behind it, in a tight loop, against the same loop with the
hooks absent, interleaved in rounds; the figure is µs a step (median of rounds). With no model
and no collectors started (no CUPTI, NVML or allocator statistics: CUDA is never initialised),
it is the host bookkeeping alone, on a CPU or a GPU machine alike::

    python bench/overhead/step_cost.py                 # 8 rounds of 20,000 steps
    python bench/overhead/step_cost.py --steps 5000 --rounds 4
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=8)
    a = p.parse_args(argv)

    from tuiprof.cli.run import run_defaults as _run_defaults
    from tuiprof.cli.program import program_options
    from tuiprof.program.steps import DECODE, PREFILL, StepRecorder
    from tuiprof.profiler import Profiler
    from tuiprof.store import SessionStore

    args = argparse.Namespace(**_run_defaults())
    args.sample_every = "live"
    prof = Profiler(SessionStore(ring_tokens=256), program_options(args, headless=False))
    rec = StepRecorder(prof, prof.clock, ("transformers",))

    def hooked(n: int) -> float:
        t0 = time.perf_counter()
        rec.enter_scope("transformers")
        rec.begin("transformers", PREFILL, positions=16)
        rec.launched("transformers")
        for _ in range(n):
            rec.begin("transformers", DECODE)
            rec.launched("transformers")
        rec.exit_scope("transformers")
        return time.perf_counter() - t0

    def bare(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            pass
        return time.perf_counter() - t0

    hooked(1000)  # warm-up: the store's rings and the first aggregates
    per_step: list[float] = []
    for r in range(a.rounds):
        pair = (hooked, bare) if r % 2 == 0 else (bare, hooked)
        t = {f.__name__: f(a.steps) for f in pair}
        per_step.append(1e6 * (t["hooked"] - t["bare"]) / a.steps)
    view = prof.store.view()
    print("| steps a round | rounds | µs a step: median (min–max) | tokens in the store |")
    print("|---|---|---|---|")
    print(f"| {a.steps} | {a.rounds} | {statistics.median(per_step):.1f} "
          f"({min(per_step):.1f}–{max(per_step):.1f}) | {view.counters.get('tokens', '?')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
