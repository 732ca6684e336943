"""Does every compiled decode step carry a device time, at the live app's sampling?

A compiled session of ``--tokens`` decode steps with the live app's defaults (bursts of 4 traced
steps in every 4,096; CUPTI graph records in between), its store wide enough to keep every
step. Per step three device figures, each from its own source:

* ``graph span``: CUPTI GRAPH_TRACE, first graph start to last graph end (untraced steps);
* ``kernel span``: CUPTI kernel records, first kernel start to last kernel end (traced steps);
* ``events``: the CUDA-event pair the engine records around every step.

The check: the untraced steps' graph spans against the burst-traced steps' kernel spans (median
within 2 %), and how many decode steps have no device span at all. On the H100::

    python bench/verify/verify_step_gpu.py --tokens 10000 --json $OUT/step_gpu.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuiprof.profiler import Profiler  # noqa: E402
from tuiprof.spec import EngineSpec, ProfilerOptions  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402


def quantiles(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return {"n": len(xs), "p10": pick(0.1), "median": statistics.median(xs), "p90": pick(0.9),
            "mean": statistics.fmean(xs)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--device", default=None)
    p.add_argument("--tokens", type=int, default=10_000)
    p.add_argument("--sample-every", default="auto")
    p.add_argument("--json", default=None)
    p.add_argument("--graph-records", action="store_true",
                   help="CUPTI GRAPH_TRACE between bursts (segfaulted on the H100: docs/performance.md#cupti-and-cuda-graphs)")
    p.add_argument("--deadline", type=float, default=0,
                   help="seconds after which every thread's stack is printed and the run ends")
    a = p.parse_args()
    import faulthandler

    faulthandler.enable()  # a crash inside CUPTI prints every thread's Python stack
    if a.deadline:
        faulthandler.dump_traceback_later(a.deadline, exit=True)
    t0 = time.perf_counter()
    store = SessionStore(series_len=a.tokens + 256)
    se = a.sample_every if a.sample_every in ("auto", "live") else int(a.sample_every)
    engine = EngineSpec.resolve(a.model, device=a.device, mode="compiled",
                                max_new_tokens=a.tokens + 1)
    prof = Profiler(store, ProfilerOptions(sample_every=se, graphs=a.graph_records,
                                           engine=engine))
    prof.start()
    while not prof.wait(15):
        st = prof.status
        print(f"[{time.perf_counter() - t0:5.0f} s] {st.state} {st.mode} steps "
              f"{store.next_seq()} {st.message[:80]}", flush=True)
    graph_error = prof.cupti.graph_error if prof.cupti is not None else "no CUPTI"
    prof.stop()
    view = store.view()
    if prof.status.state == "error":
        print(f"session failed: {prof.status.message}")
        return 1
    rows = [r for r in view.tokens if r.phase == "decode" and r.mode == "compiled" and r.done
            and not r.compiling]
    no_gpu_time = [r.seq for r in rows if r.gpu_ms is None]
    rerecord = [r for r in rows if r.rerecord]   # recorded graphs again: timed apart
    rows = [r for r in rows if not r.rerecord]
    untraced = [r for r in rows if not r.sampled]
    graphed = [r for r in untraced if r.graphs]
    traced = [r for r in rows if r.sampled and r.kernels]
    graph_ms = [(r.graph_last_end_ns - r.graph_first_ns) / 1e6 for r in graphed]
    kspan_ms = [(r.last_kernel_end_ns - r.first_kernel_ns) / 1e6 for r in traced]
    ev_untraced = [r.gpu_ms for r in untraced if r.gpu_ms is not None]
    ev_traced = [r.gpu_ms for r in traced if r.gpu_ms is not None]
    host = [r.host_ms for r in untraced]
    res = {
        "model": a.model, "tokens": a.tokens, "sample_every": store.meta.get("sample_every"),
        "decode_steps": len(rows), "traced_steps": len(traced), "untraced_steps": len(untraced),
        "untraced_with_graph_records": len(graphed),
        "untraced_without": [r.seq for r in untraced if not r.graphs][:20],
        "graphs_per_step": quantiles([float(r.graphs) for r in graphed]),
        "graph_span_ms": quantiles(graph_ms), "kernel_span_ms": quantiles(kspan_ms),
        "events_ms_untraced": quantiles(ev_untraced), "events_ms_traced": quantiles(ev_traced),
        "host_ms_untraced": quantiles(host), "graph_error": graph_error,
        "graph_records": view.counters.get("graphs"), "wall_s": time.perf_counter() - t0,
        "step_time_sources": view.meta.get("step_time_sources"),
        "steps_without_gpu_time": len(no_gpu_time), "rerecord_steps": len(rerecord),
    }
    if graph_ms and kspan_ms:
        res["graph_over_kernel_span"] = statistics.median(graph_ms) / statistics.median(kspan_ms)
    if ev_untraced and kspan_ms:  # every step's time against the spans
        res["events_untraced_over_kernel_span"] = {
            "median": statistics.median(ev_untraced) / statistics.median(kspan_ms),
            "mean": statistics.fmean(ev_untraced) / statistics.fmean(kspan_ms)}
    if ev_traced and kspan_ms:
        res["events_over_kernel_span"] = statistics.median(ev_traced) / statistics.median(kspan_ms)
    print(f"# {a.model} compiled, {len(rows)} decode steps ({len(traced)} traced, "
          f"{len(untraced)} untraced, {len(graphed)} of them with graph records); "
          f"graph error: {graph_error or 'none'}; {res['wall_s']:.0f} s")
    print("| figure | steps | p10 | median | p90 | mean |")
    print("|---|---|---|---|---|---|")
    for name in ("graph_span_ms", "kernel_span_ms", "events_ms_untraced", "events_ms_traced",
                 "host_ms_untraced", "graphs_per_step"):
        q = res[name]
        if q["n"]:
            print(f"| {name} | {q['n']} | {q['p10']:.4f} | {q['median']:.4f} | {q['p90']:.4f} "
                  f"| {q['mean']:.4f} |")
        else:
            print(f"| {name} | 0 | – | – | – | – |")
    for k in ("graph_over_kernel_span", "events_over_kernel_span"):
        if k in res:
            print(f"{k}: {res[k]:.4f}")
    r = res.get("events_untraced_over_kernel_span")
    if r:
        ok = all(abs(v - 1) <= 0.02 for v in r.values())
        print(f"untraced steps' CUDA-event time over the traced steps' kernel span: median "
              f"{r['median']:.4f}, mean {r['mean']:.4f} ({'within' if ok else 'NOT within'} 2 %)")
    print(f"decode steps without a GPU time: {len(no_gpu_time)} of {len(rows) + len(rerecord)}; "
          f"{len(rerecord)} steps recording graphs again (timed apart)")
    print(f"untraced decode steps without graph records: "
          f"{len(untraced) - len(graphed)} (first: {res['untraced_without'][:8]})")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
