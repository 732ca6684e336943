"""What tuiprof's collection costs the decode loop: interleaved windows in one process.

One engine generates continuously (loop mode); every ``--window`` decode tokens the benchmark
switches configuration at a token boundary, cycling A B C … for ``--rounds`` rounds:

* ``bare``      — no device activity recorded (CUPTI kinds disabled, NVML sampler paused,
                  no allocator stats);
* ``full``      — everything tuiprof collects: CUPTI kernels/memcpy/memset/memory + API subset,
                  NVML sampler, allocator stats, attribution and aggregation;
* ``auto``      — tuiprof's defaults for the mode: every token in eager; in compiled mode bursts
                  of 4 traced tokens in every 256 (kinds switched off in between) and allocator
                  statistics every 16th token;
* ``torch.profiler`` — the peer: ``torch.profiler`` with CUDA activities only (run in a second
                  phase, after tuiprof's CUPTI subscriber is finalised, interleaved with ``bare``).

A window's cost is its whole wall time per token — from its first token's start to its last
token's end, plus the forced flush and folding of the window's records at its end — so stalls
from record handling are counted, not hidden in a timed region. Medians over rounds, ratios to
``bare`` of the same phase.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuiprof.profiler import AUTO_SAMPLE_EVERY, Profiler, ProfilerOptions  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402


class WindowRunner:
    """Drives configuration switches from the engine thread at token boundaries."""

    def __init__(self, prof: Profiler, configs: list[str], window: int, rounds: int,
                 warmup: int, mode: str = "eager") -> None:
        self.prof = prof
        self.mode = mode
        self.plan = [c for _ in range(rounds) for c in configs]
        self.window = window
        self.warmup = warmup
        self.results: dict[str, list[float]] = {c: [] for c in configs}
        self.i = -1
        self.n = 0
        self.t0 = 0.0
        self.done = threading.Event()
        self.torch_prof = None
        self._orig_started = prof.token_started
        self._orig_finished = prof.token_finished
        prof.token_started = self.token_started  # type: ignore[method-assign]
        prof.token_finished = self.token_finished  # type: ignore[method-assign]

    def apply(self, cfg: str) -> None:
        prof = self.prof
        on = cfg in ("full", "auto", "full@0.5ms")
        # full@0.5ms: tuiprof with a 0.5 ms GIL switch interval (measured worse; not the default)
        sys.setswitchinterval(0.0005 if cfg == "full@0.5ms" else 0.005)
        if prof.cupti is not None:
            c = prof.cupti
            c.sample_every = AUTO_SAMPLE_EVERY[self.mode] if cfg == "auto" else 1
            c.paused = not on
            c._set_device_kinds(on)
            c.set_api(on)
        if prof.nvml is not None:
            prof.nvml.paused = not on
        prof.options.alloc_every = (1 if cfg != "auto" else "auto") if on else 0
        if cfg == "torch.profiler":
            import torch  # noqa: PLC0415
            self.torch_prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CUDA])
            self.torch_prof.__enter__()

    def end_window(self, cfg: str) -> None:
        prof = self.prof
        if cfg == "torch.profiler" and self.torch_prof is not None:
            self.torch_prof.__exit__(None, None, None)
            self.torch_prof = None
        elif prof.cupti is not None and cfg != "bare":
            prof.cupti.flush()  # the window pays for handling its own records

    def token_started(self, phase, mode, step, cycle, start_ns):
        if phase == "decode":
            if self.i == -1 and self.n >= self.warmup:
                self.i, self.n = 0, 0
                self.apply(self.plan[0])
                self.t0 = time.perf_counter()
            elif self.i >= 0 and self.n == self.window:
                cfg = self.plan[self.i]
                self.end_window(cfg)
                self.results[cfg].append((time.perf_counter() - self.t0) * 1e3 / self.window)
                self.i += 1
                self.n = 0
                if self.i >= len(self.plan):
                    self.apply("bare")
                    self.done.set()
                    self.prof.engine.stop()
                else:
                    self.apply(self.plan[self.i])
                    self.t0 = time.perf_counter()
        self._orig_started(phase, mode, step, cycle, start_ns)

    def token_finished(self, ev):
        if ev.phase == "decode":
            self.n += 1
        self._orig_finished(ev)


def run_phase(args, mode: str, configs: list[str], cupti: bool) -> dict[str, list[float]]:
    store = SessionStore(ring_tokens=8)
    opts = ProfilerOptions(cupti=cupti, nvml=True, engine_kwargs=dict(
        model_spec=args.model, mode=mode, max_new_tokens=args.max_new_tokens, loop=True,
        prompt_len=16))
    prof = Profiler(store, opts)
    runner = WindowRunner(prof, configs, args.window, args.rounds, args.warmup, mode)
    prof.start()
    while not runner.done.wait(1.0):
        if prof.status.state == "error":
            raise SystemExit(f"engine error: {prof.status.message}")
    prof.stop()
    v = store.view()
    print(f"  [{mode}] tokens={v.counters['tokens']} records={v.counters['records']} "
          f"dropped={v.counters['dropped']} overhead-estimate={v.overhead.get('pct')}%", flush=True)
    return runner.results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--window", type=int, default=32, help="decode tokens per window")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=400)
    ap.add_argument("--peer", action="store_true", help="also measure torch.profiler")
    args = ap.parse_args()
    rows = []
    for mode in args.modes.split(","):
        window = args.window if mode == "eager" else args.window * 8
        args_mode = argparse.Namespace(**{**vars(args), "window": window})
        configs = ["bare", "full", "auto"] if mode == "eager" else ["bare", "full", "auto"]
        res = run_phase(args_mode, mode, configs, cupti=True)
        base = statistics.median(res["bare"])
        for cfg, vals in res.items():
            med = statistics.median(vals)
            rows.append((mode, "tuiprof", cfg, med, med / base, len(vals)))
        if args.peer:
            res = run_phase(args_mode, mode, ["bare", "torch.profiler"], cupti=False)
            base = statistics.median(res["bare"])
            for cfg, vals in res.items():
                med = statistics.median(vals)
                rows.append((mode, "peer", cfg, med, med / base, len(vals)))
    print("\n| mode | phase | configuration | ms/token (median of rounds) | ratio to bare | rounds |")
    print("|---|---|---|---|---|---|")
    for mode, phase, cfg, med, ratio, n in rows:
        print(f"| {mode} | {phase} | {cfg} | {med:.3f} | {ratio:.3f} | {n} |")


if __name__ == "__main__":
    main()
