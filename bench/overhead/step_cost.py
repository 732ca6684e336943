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
    python bench/overhead/step_cost.py --clock cpu     # the thread's CPU time, not wall time

``--clock cpu`` times both loops by the thread's CPU clock (``time.thread_time``): on a shared
machine, time the thread spent waiting for a core no longer counts as the hooks' cost.

``--events`` (a GPU): CUDA initialised, the same hooked loop with each step's CUDA-event pair
(:mod:`tuiprof.program.step_gpu_time`: two records, a query, an elapsed time and the store's late
update a step) against the hooked loop without them, interleaved; the events' own µs a step.
``--check`` exits 1 when they cost more than ``EVENTS_TARGET_US``::

    python bench/overhead/step_cost.py --events --check
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# The events' share of the overhead budget: 0.5 % of a compiled qwen3-0.6b decode step on the
# H100 (2.74 ms by CUDA events), against the 3 % the whole of tuiprof may cost compiled decode
# (docs/performance.md).
EVENTS_TARGET_US = 14.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--events", action="store_true",
                   help="a GPU: the CUDA-event pair of every step against none")
    p.add_argument("--check", action="store_true",
                   help=f"with --events: exit 1 above {EVENTS_TARGET_US} µs a step")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: perf_counter; cpu: this thread's CPU time (a shared machine)")
    a = p.parse_args(argv)
    now = time.perf_counter if a.clock == "wall" else time.thread_time

    from tuiprof.cli.program import program_options
    from tuiprof.cli.run import run_defaults as _run_defaults
    from tuiprof.program.step_gpu_time import StepTimer
    from tuiprof.program.steps import DECODE, PREFILL, StepRecorder
    from tuiprof.profiler import Profiler
    from tuiprof.store import SessionStore

    if a.events:
        try:
            import torch
            torch.zeros(1, device="cuda")   # CUDA initialised: the events are recorded
        except Exception as exc:
            print(f"--events needs a CUDA GPU ({type(exc).__name__}: {str(exc)[:80]})")
            return 2

    class NoEvents(StepTimer):
        def start(self):  # what a step costs without its event pair
            return None

    args = argparse.Namespace(**_run_defaults())
    args.sample_every = "live"

    def profiler() -> Profiler:
        return Profiler(SessionStore(ring_tokens=256), program_options(args, headless=False))

    prof = profiler()
    without = StepRecorder(prof, prof.clock, ("transformers",), timer=NoEvents())
    prof_events = profiler()   # one recorder a session, as under tuiprof run
    with_events = StepRecorder(prof_events, prof_events.clock, ("transformers",))

    def hooked(n: int, rec: StepRecorder = without) -> float:
        t0 = now()
        rec.enter_scope("transformers")
        rec.begin("transformers", PREFILL, positions=16)
        rec.launched("transformers")
        for _ in range(n):
            rec.begin("transformers", DECODE)
            rec.launched("transformers")
        rec.exit_scope("transformers")
        return now() - t0

    def events(n: int) -> float:
        return hooked(n, with_events)

    def bare(n: int) -> float:
        t0 = now()
        for _ in range(n):
            pass
        return now() - t0

    if a.events:
        pair, name = (events, hooked), "events"
    else:
        pair, name = (hooked, bare), "hooked"
    pair[0](1000)  # warm-up: the store's rings, the first aggregates, the event pool
    per_step: list[float] = []
    for r in range(a.rounds):
        order = pair if r % 2 == 0 else pair[::-1]
        t = {f.__name__: f(a.steps) for f in order}
        per_step.append(1e6 * (t[pair[0].__name__] - t[pair[1].__name__]) / a.steps)
    view = (prof_events if a.events else prof).store.view()
    cost = statistics.median(per_step)
    if a.events:
        timer = with_events.timer
        with_events.close()
        print(f"the CUDA-event pair of a step (against the hooked step without it), "
              f"{timer.timed:,} steps timed, {timer.skipped:,} skipped (pool of {timer.pairs}):")
    print("| steps a round | rounds | µs a step: median (min–max) | tokens in the store |")
    print("|---|---|---|---|")
    print(f"| {a.steps} | {a.rounds} | {cost:.1f} "
          f"({min(per_step):.1f}–{max(per_step):.1f}) | {view.counters.get('tokens', '?')} |")
    if a.events and a.check and cost > EVENTS_TARGET_US:
        print(f"over the target: {cost:.1f} µs a step > {EVENTS_TARGET_US} µs ({name})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
