"""Why a traced kernel does or does not find its CUPTI launch record (the model/loop split).

Runs the built-in engine under a real Profiler on the GPU (eager, then compiled) with every
token's raw records kept, then for the traced decode steps: which API records came, how many
kernels have a launch record with their correlation id anywhere in the session, what the
unmatched ones are, and the compiled steps' kernel spans by position in their burst against
the untraced steps' CUDA-event times. On the H100::

    python bench/split_probe.py --eager-tokens 40 --compiled-tokens 1024 --sample-every 16
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuiprof.profiler import Profiler, ProfilerOptions  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402


def session(mode: str, tokens: int, sample_every, attached: bool = False) -> tuple:
    store = SessionStore(ring_tokens=tokens + 8, series_len=tokens + 64)
    prof = Profiler(store, ProfilerOptions(sample_every=sample_every,
                                           detach_between_bursts=not attached,
                                           engine_kwargs=dict(
        model_spec="qwen3-0.6b", mode=mode, max_new_tokens=tokens + 1, loop=False)))
    t0 = time.perf_counter()
    prof.start()
    prof.wait(400)
    prof.stop()
    return store.view(), time.perf_counter() - t0


def report(mode: str, view, wall: float) -> None:
    raw = dict(view.raw)
    apis = {}
    names = collections.Counter()
    for recs in raw.values():
        for r in recs:
            if r[0] == "R":
                apis[r[4]] = r
    rows = [t for t in view.tokens if t.done and t.phase == "decode" and t.sampled and t.kernels]
    print(f"== {mode}: {len(view.tokens)} steps, {len(rows)} traced decode steps, {wall:.0f} s; "
          f"counters {dict(view.counters)}")
    matched = unmatched = 0
    miss = collections.Counter()
    per_row = []
    for t in rows:
        recs = raw.get(t.seq, [])
        ks = [r for r in recs if r[0] == "K"]
        for r in recs:
            if r[0] == "R":
                names[r[1]] += 1
        m = sum(1 for r in ks if r[13] in apis)
        matched += m
        unmatched += len(ks) - m
        for r in ks:
            if r[13] not in apis:
                miss[(r[1][:50], "graph" if r[14] else "plain")] += 1
        per_row.append((t.seq, t.step, len(ks), m, t.model_kernels, t.loop_kernels,
                        t.api_calls))
    print(f"kernels with a launch record anywhere: {matched} of {matched + unmatched}")
    print("API records in traced steps:", names.most_common(12))
    print("unmatched kernels (name, graph?):", miss.most_common(8))
    print("rows (seq, step, kernels in raw, with launch record, model, loop, api calls):")
    for x in per_row[:12]:
        print("  ", x)
    if mode == "compiled":
        by_phase = collections.defaultdict(list)
        run = 0
        last = None
        for t in rows:
            run = run + 1 if last is not None and t.seq == last + 1 else 1
            last = t.seq
            by_phase[run].append((t.last_kernel_end_ns - t.first_kernel_ns) / 1e6)
        ev = [t.gpu_ms for t in view.tokens if t.done and t.phase == "decode" and not t.sampled
              and not t.apart and t.gpu_ms is not None]
        print(f"untraced steps' CUDA-event ms: median {statistics.median(ev):.4f} "
              f"({len(ev)} steps)")
        for k in sorted(by_phase):
            v = by_phase[k]
            print(f"traced step {k} of its burst: kernel span median {statistics.median(v):.4f} "
                  f"ms, min {min(v):.4f}, max {max(v):.4f} ({len(v)} steps)")
        ev_t = [t.gpu_ms for t in rows if t.gpu_ms is not None]
        print(f"traced steps' CUDA-event ms: median {statistics.median(ev_t):.4f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eager-tokens", type=int, default=40)
    p.add_argument("--compiled-tokens", type=int, default=1024)
    p.add_argument("--sample-every", type=int, default=16)
    p.add_argument("--attached", action="store_true",
                   help="CUPTI attached throughout (--cupti-attached), not only for bursts")
    a = p.parse_args()
    if a.eager_tokens:
        report("eager", *session("eager", a.eager_tokens, 1))
    if a.compiled_tokens:
        report("compiled", *session("compiled", a.compiled_tokens, a.sample_every, a.attached))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
