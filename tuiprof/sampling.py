"""Which steps a session traces and what that costs: the automatic sampling periods, the
words a snapshot and the header use for the policy and for what the overhead figure counts,
and the measured costs they quote (H100; docs/performance.md); the session's own overhead report
(:class:`OwnCostReport`)."""
from __future__ import annotations

import time

from .collect.cupti_collector import BURST


# "auto" sampling, measured on the H100 (docs/performance.md): tracing every token costs compiled
# decode about 60% (539 CUDA-graph kernels every 3 ms; CUPTI's own tracing is most of it) and
# eager decode about 50% (~1,850 kernel and as many launch records every 36 ms, parsed and
# folded in Python), so both trace bursts of 4 tokens (API records included): eager in every
# 256, compiled in every 4,096 (a compiled burst costs ~20-85 ms of decode time, 2.5% at one in
# 1,024; a CUDA graph's kernels do not change between bursts). Eager's period is 256, not 128:
# at 128 its bursts cost ~2.5 % of the mean step by themselves (a burst's attached
# and traced steps, the switch, the parsing; docs/performance.md), too much of a 5 % budget on
# a host whose run-to-run spread is wider; at 256 a burst comes about every 8 s of qwen3-0.6b
# eager decode, as compiled's every ~12 s. A prefill is traced unless one was in the last
# period (a program's short generate() calls), and a mode switch starts a period 8 tokens
# later, so the new mode's kernels are traced at once.
AUTO_SAMPLE_EVERY = {"eager": 64, "compiled": 1024}
# A session left on (``tuiprof run --detach``, "leave"): a quarter as often, bursts of 4 in every
# 1,024 eager steps and 16,384 compiled: its budget is 1 % of a server's time, and the live
# app's bursts alone were ~1 % of a transformers server's busy time on an H200
# (docs/performance.md#the-profiler-you-leave-on).
LEAVE_SAMPLE_EVERY = {"eager": 256, "compiled": 4096}
# torch.cuda.memory_stats() builds a dict of ~150 entries; its counters are cumulative, so
# reading them every Nth token loses no allocation, only per-token resolution.
AUTO_ALLOC_EVERY = {"eager": 1, "compiled": 64}
# What an attached CUPTI cost compiled qwen3-0.6b decode against no tuiprof (whole processes,
# H100, docs/results.md#overhead): the engine 1.08-1.15 in three runs (1.117 over 8
# rounds), an HF generate() program 1.10-1.23 (its parts without CUPTI: 1.01).
COMPILED_CUPTI_COST = "+8-23 %"
# What tracing every step costs a step against an untraced one (H100, qwen3-0.6b,
# docs/results.md, "Every step traced"); a transformers server's throughput under it, against
# the bare server, on an H200 (bench/overhead/serve_external.py: 0.77 and 0.80 at a quarter and
# 0.8 of its capacity, ratio of totals; 0.85 in an earlier run at 8 req/s)
EVERY_STEP_COST = ("a traced step ran x1.62 eager, x1.29 compiled against an untraced one on an "
                   "H100; a transformers server's throughput 0.77-0.82 of bare on an H200")
# Where each per-step device figure comes from (a snapshot's meta says so; docs/snapshot.md).
STEP_TIME_SOURCES = {
    "gpu_ms": "CUDA events recorded before and after every step (every step, any mode; a "
              "program's steps: read a step or two later, never waited for)",
    "span_ns": "CUPTI kernel records: first kernel start to last kernel end (traced steps)",
    "graph_span_ns": "CUPTI GRAPH_TRACE records, one per CUDA-graph launch (untraced compiled "
                     "steps; only with graph records on, which is not the default)",
}


def tracing_policy(asked: int | str, every: int) -> str:
    """Which steps' kernels are traced, in words (a snapshot's ``meta.tracing``, the headless
    summary): a traced step runs slower than an untraced one (its time is marked so)."""
    if every <= 1:
        return f"every step traced ({EVERY_STEP_COST})"
    why = ("the default, as the live app" if asked in ("auto", "live") else
           "a session left on: a quarter of the live app's" if asked == "leave" else
           f"--sample-every {asked}")
    return f"bursts of {BURST} steps in every {BURST * every} traced ({why})"


def overhead_method(cupti: bool, mode: str, left_out: int = 0, every_step: bool = False,
                    attached: int = 0, windows: int = 0) -> str:
    """What the overhead figure counts and what it does not, short enough for the header: the
    session's threads' CPU, its hooks on the program's threads, CUPTI's switches and the steps'
    excess over untraced ones of their size are counted; the GIL's handoffs never are (no
    counter in the interpreter: an external client's figures are the measure,
    bench/overhead/serve_external.py); neither is CUPTI's work inside CUDA calls in the
    ``left_out`` of ``attached`` steps run attached with no untraced step of their size to
    compare them with (all of them with every step traced, or CUPTI attached throughout): then
    what such a step was measured to cost elsewhere is named; nor is it in the ``windows`` a
    program's time windows ran attached (CUPTI is switched at steps only: a program's start,
    before its first step)."""
    counted = "threads' CPU + hooks / wall"
    missing = ["GIL handoffs"]
    if cupti and every_step:
        counted = "threads' CPU + hooks + switches / wall"
        missing.append("tracing (every step: x1.62 eager, x1.29 compiled)")
    elif cupti and left_out and left_out < attached:
        counted = "threads' CPU + hooks + switches + traced steps / wall"
        missing.append(f"CUPTI in {left_out:,} of {attached:,} attached steps (no untraced peer)")
    elif cupti and left_out:
        counted = "threads' CPU + hooks + switches / wall"
        missing.append(f"CUPTI in CUDA calls ({COMPILED_CUPTI_COST} compiled, H100)"
                       if mode == "compiled" else "CUPTI in CUDA calls (no untraced step)")
    elif cupti:
        counted = "threads' CPU + hooks + switches + traced steps / wall"
    if cupti and windows:
        missing.append(f"CUPTI in {windows:,} time windows")
    return f"{counted}; not counted: {', '.join(missing)}"


class OwnCostReport:
    """The overhead self-report of a :class:`~tuiprof.profiler.Profiler` (a base of it): what
    the session costs the process it profiles, from the costs the profiler counts."""

    def _update_overhead(self, now: float | None = None, final: bool = False) -> None:
        """What the session costs the process it profiles, as a share of wall time (the header's
        and the snapshot's ``overhead``), every part measured in this process
        (:mod:`tuiprof.collect.own_cost`):

        * ``threads_s``: CPU time of the session's own threads (CUPTI's consumer, NVML, the host
          sampler, output capture, serving a UI process), from their kernel thread clocks;
          CUPTI's buffer callbacks (on CUPTI's or the program's threads, ``callback_s``) and a
          ``--proxy`` process's CPU (``proxy_s``) beside them;
        * ``hooks_s``: wall time in tuiprof's code on the threads that run the steps and the
          requests (a GIL wait inside a hook included);
        * ``switch_s``: CUPTI's attaches and finalizes;
        * ``tracing_s`` and ``rerecord_s``: steps measured with CUPTI attached, and steps that
          recorded their CUDA graphs again after tuiprof dropped them, over the mean untraced
          step of their phase and mode.

        ``method`` names the parts and what is not counted: GIL handoffs (a program thread
        waiting for the GIL while a session thread is woken), and tracing's cost inside CUDA
        calls where no untraced step gives a reference (every step traced, or CUPTI attached
        throughout). The per-collector figures (``cupti_s``, ``nvml_s``, ``serve_s``) stay as
        the host pane's breakdown of ``threads_s``.
        """
        now = time.perf_counter() if now is None else now
        self._overhead_at = now
        wall = now - self._t_start
        if wall <= 0:
            return
        c = self.cupti
        costs = {f"{name}_s": round(col.cost_s, 3) for name, col in self.collectors.items()}
        costs.setdefault("cupti_s", 0.0)
        costs.setdefault("nvml_s", 0.0)
        serve, switch, hooks = self.serve_s, self.switch_s, self.hooks_s
        callback = getattr(c, "callback_s", 0.0) if c is not None else 0.0
        elsewhere = sum(col.cost_s for col in self.collectors.values()
                        if getattr(col, "own_process", False))
        if self._threads.available:
            threads = max(0.0, self._threads.cpu_s() - self._threads_base)
        else:  # no thread clocks (not Linux): the collectors' and the UI's own counts
            threads = sum(col.cost_s for col in self.collectors.values()
                          if not getattr(col, "own_process", False)) + serve - callback
        tracing, rerecord, left_out = self._excess.seconds()
        total = threads + callback + elsewhere + hooks + switch + tracing + rerecord
        every = c is not None and c.sample_every <= 1
        series = self._overhead_series
        series.append((round(time.time(), 3), round(total, 5)))
        if final:  # the whole series once, not with every pull of a mirror
            # list() copies in one step: a program's thread may still append meanwhile
            self.store.set_overhead(series=[list(x) for x in list(series)])
        self.store.set_overhead(pct=round(100.0 * total / wall, 2),
                                **costs, serve_s=round(serve, 3), switch_s=round(switch, 3),
                                hooks_s=round(hooks, 6), threads_s=round(threads, 4),
                                callback_s=round(callback, 4), tracing_s=round(tracing, 4),
                                rerecord_s=round(rerecord, 4), untraced_reference_missing=left_out,
                                windows_attached=self._excess.windows_attached(),
                                detaches=c.detaches if c is not None else 0,
                                wall_s=round(wall, 3),
                                method=overhead_method(c is not None, self.status.mode,
                                                       left_out, every,
                                                       self._excess.attached_steps(),
                                                       self._excess.windows_attached()))
