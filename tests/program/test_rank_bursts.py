"""The ranks of one torch.distributed job trace the same steps. The TP analysis compares ranks
over the steps traced on every rank (matched by cycle and step), so each rank's sampling bursts
must fall on the same steps, however many time windows a rank recorded before its program
marked its first step (its start-up, which differs from rank to rank). CUPTI is the stand-in
of ``tests/cupti_standin.py``; the real job runs on the GPUs (bench/verify/gpu_processes_multi.sh)."""
from __future__ import annotations

import argparse

from cupti_standin import attached_collector

from tuiprof.cli.program import program_options
from tuiprof.cli.run import run_defaults
from tuiprof.profiler import Profiler
from tuiprof.program.steps import DECODE, PREFILL, WINDOW, StepRecorder
from tuiprof.store import SessionStore


def _rank(windows: int, cycles: int = 2, decode: int = 40) -> set:
    """(cycle, step) of the decode steps a rank traced, after ``windows`` start-up windows."""
    args = argparse.Namespace(**run_defaults())
    args.sample_every = "live"
    store = SessionStore(ring_tokens=512)
    prof = Profiler(store, program_options(args, headless=True))
    collector, _ = attached_collector(store, sample_every=4)
    collector.bursts_only = False      # attached throughout: the sampling alone is under test
    prof.cupti = collector
    rec = StepRecorder(prof, time_ns_clock(), ("transformers", "windows"))
    for _ in range(windows):
        rec.begin("windows", WINDOW)
    rec.end("windows")
    for _ in range(cycles):
        rec.enter_scope("transformers")
        rec.begin("transformers", PREFILL, positions=16)
        for _ in range(decode):
            rec.begin("transformers", DECODE)
        rec.exit_scope("transformers")
    view = store.view()
    return {(t.cycle, t.step) for t in view.tokens
            if t.done and t.phase == "decode" and t.sampled}


def time_ns_clock():
    n = iter(range(10**6))
    return lambda: 1_000_000 * next(n)


def test_ranks_with_different_startups_trace_the_same_steps():
    early, late = _rank(windows=3), _rank(windows=9)
    assert early, "no decode step traced"
    assert early == late
