"""What CUPTI tracing does to what it measures, with CUDA events (not CUPTI) as the reference.

The question (docs/performance.md, "What tracing changes"): a traced step runs slower than an
untraced one (compiled qwen3-0.6b on the H100: 2.742 ms by CUDA events with CUPTI finalized,
3.00-3.17 ms traced). How much of that stretch is inside the kernels' own durations, which
CUPTI's records report, and how much between them?

**Kernels** (``--parts kernels``): known kernels, each in its own block, launched from a stream
and from a CUDA graph, in rounds that alternate tracing off (CUPTI finalized, the state between
tuiprof's bursts) and on (tuiprof's own collector, :class:`CuptiCollector`, attached with its
burst's kinds: kernels, memcpy, memset, memory records, the API subset), each round's order
flipped. Kinds: ``tiny`` (elementwise add of 4,096 bf16), ``gemv`` (1x1024 @ 1024x3072 bf16, a
decode projection), ``lm_head`` (1x1024 @ 1024x151936), ``gemm`` (4096^3 bf16), ``sdpa``
(scaled_dot_product_attention of one query over 1,024 keys, 16 heads of 128, a decode step's
attention) and ``mixed`` (tiny, gemv, sdpa, gemv, tiny: a decode layer's shape). Per kind and
state, CUDA events time:

* ``queued``: R calls back to back behind a spin kernel (the host queues them all before the
  device starts): device time per call, launch latency hidden;
* ``launched``: R calls as the host launches them (an eager decode loop);
* ``pairs``: an event before and after each of M calls (queued), and M empty pairs: a call's
  device time is the pair's time less an empty pair's;
* ``graph``: the R calls captured in a CUDA graph (captured again after every switch: a
  finalized CUPTI must not see graphs recorded under it), one replay behind a spin kernel.

Per round, traced figures come from the same blocks' CUPTI records. Derived, per call (a call
may launch several kernels: ``kernels`` says how many):

* ``d_untraced`` = pairs untraced; ``d_traced_events`` = pairs traced; ``cupti`` = CUPTI's call
  span in the traced pairs block; ``bracket`` = d_traced_events - cupti (what an event pair
  adds around a call, assumed the same untraced); ``d_true`` = d_untraced - bracket;
* **duration inflation** (stream) = cupti - d_true = d_traced_events - d_untraced (events on
  both sides: CUPTI is not the reference), and the literal cupti - d_untraced; graph:
  cupti_graph - d_true;
* **gap inflation**: the gap per call (queued or graph block time per call less the call's
  duration) traced against untraced;
* **step inflation**: block time per call traced / untraced (queued, launched, graph).

**Model** (``--parts eager,compiled``): qwen3-0.6b under tuiprof's real :class:`Profiler`,
sampling bursts every ``--sample-every`` x 4 steps, CUPTI finalized between bursts (the
default): every step's CUDA-event time, untraced steps (CUPTI detached) against traced ones,
the traced steps' kernel figures (count, sum, busy, span, gaps = span - busy), the stretch and
how much of it the measured per-kernel duration inflation explains; the busy share and the
launch-bound class before (over the traced steps' own wall time) and after (over the untraced
steps' median).

Each part runs in its own process. On the H100 (about 4 minutes)::

    python bench/verify/tracing_perturbation.py --out $OUT

Results: ``$OUT/tracing_perturbation.json`` and the tables printed. The suggested constants
for ``tuiprof/analysis/tracing.py`` DURATION_INFLATION_NS are printed last.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SMALL = ("tiny", "gemv", "sdpa")   # the kinds whose per-kernel figures suggest the constants
KINDS = ("tiny", "gemv", "lm_head", "gemm", "sdpa", "mixed")


def med(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ------------------------------------------------------------------------------ kernels
def build_kinds(torch) -> dict:
    """name -> (call, R calls a block, M pairs)."""
    import torch.nn.functional as F  # noqa: PLC0415

    bf, dev = torch.bfloat16, "cuda"
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, device=dev, dtype=bf, generator=g)

    x, y = rnd(4096), rnd(4096)
    z = torch.empty_like(x)
    a, w, o = rnd(1, 1024), rnd(1024, 3072), torch.empty(1, 3072, device=dev, dtype=bf)
    wl, ol = rnd(1024, 151936), torch.empty(1, 151936, device=dev, dtype=bf)
    m1, m2, mo = rnd(4096, 4096), rnd(4096, 4096), torch.empty(4096, 4096, device=dev, dtype=bf)
    q, k, v = rnd(1, 16, 1, 128), rnd(1, 16, 1024, 128), rnd(1, 16, 1024, 128)
    wo, oo = rnd(3072, 1024), torch.empty(1, 1024, device=dev, dtype=bf)

    def tiny():
        torch.add(x, y, out=z)

    def gemv():
        torch.mm(a, w, out=o)

    def lm_head():
        torch.mm(a, wl, out=ol)

    def gemm():
        torch.mm(m1, m2, out=mo)

    def sdpa():
        F.scaled_dot_product_attention(q, k, v)

    def mixed():
        torch.add(x, y, out=z)
        torch.mm(a, w, out=o)
        F.scaled_dot_product_attention(q, k, v)
        torch.mm(o, wo, out=oo)
        torch.add(x, y, out=z)

    return {"tiny": (tiny, 400, 200), "gemv": (gemv, 300, 200), "lm_head": (lm_head, 20, 20),
            "gemm": (gemm, 8, 8), "sdpa": (sdpa, 200, 100), "mixed": (mixed, 80, 60)}


class Blocks:
    """The timed blocks of one kind in one state (events reused across rounds)."""

    def __init__(self, torch, name: str, call, reps: int, pairs: int, spin) -> None:
        self.torch, self.name, self.call, self.reps, self.pairs = torch, name, call, reps, pairs
        ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        self.e0, self.e1 = ev(), ev()
        self.pa = [ev() for _ in range(pairs)]
        self.pb = [ev() for _ in range(pairs)]
        self.graph = None
        self.spin = spin           # queue a spin kernel of ``ms`` device milliseconds

    def warm(self) -> None:
        for _ in range(3):
            self.call()
        self.torch.cuda.synchronize()

    def capture(self) -> None:
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                self.call()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(self.reps):
                self.call()
        g.replay()
        torch.cuda.synchronize()
        self.graph = g

    def drop(self) -> None:
        self.graph = None
        self.torch.cuda.synchronize()

    def queued(self, cover_ms: float) -> tuple[float, float]:
        """(device ms per call, host ms to queue the block)."""
        torch = self.torch
        torch.cuda.synchronize()
        self.spin(cover_ms)
        t0 = time.perf_counter()
        self.e0.record()
        for _ in range(self.reps):
            self.call()
        self.e1.record()
        host = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        return self.e0.elapsed_time(self.e1) / self.reps, host

    def launched(self) -> float:
        torch = self.torch
        torch.cuda.synchronize()
        self.e0.record()
        for _ in range(self.reps):
            self.call()
        self.e1.record()
        torch.cuda.synchronize()
        return self.e0.elapsed_time(self.e1) / self.reps

    def pair_times(self, cover_ms: float, empty: bool) -> list[float]:
        torch = self.torch
        torch.cuda.synchronize()
        self.spin(cover_ms)
        for a, b in zip(self.pa, self.pb):
            a.record()
            if not empty:
                self.call()
            b.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in zip(self.pa, self.pb)]

    def graph_block(self, cover_ms: float | None) -> float:
        torch = self.torch
        torch.cuda.synchronize()
        if cover_ms:
            self.spin(cover_ms)
        self.e0.record()
        self.graph.replay()
        self.e1.record()
        torch.cuda.synchronize()
        return self.e0.elapsed_time(self.e1) / self.reps


def kernel_records(records: list) -> list[tuple]:
    """(start, end) of the kernels of a block, the spin kernel left out, in start order."""
    ks = [(r[2], r[3]) for r in records if r[0] == "K" and "spin_kernel" not in r[1]]
    return sorted(ks)


def call_spans(ks: list[tuple], calls: int) -> tuple[list[float], int]:
    """Per call: last end - first start of its kernels (ms); kernels a call."""
    if not ks or calls <= 0 or len(ks) % calls:
        return [], (len(ks) // calls if calls else 0)
    per = len(ks) // calls
    return [(ks[i + per - 1][1] - ks[i][0]) / 1e6 for i in range(0, len(ks), per)], per


def kernels_part(a) -> dict:
    import torch  # noqa: PLC0415

    from tuiprof.collect.cupti_collector import CuptiCollector  # noqa: PLC0415
    from tuiprof.store import SessionStore  # noqa: PLC0415

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.init()
    # spin kernel calibration: cycles per device ms
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    torch.cuda.synchronize()
    e0.record()
    torch.cuda._sleep(20_000_000)
    e1.record()
    torch.cuda.synchronize()
    cycles_per_ms = 20_000_000 / e0.elapsed_time(e1)

    def spin(ms: float) -> None:
        torch.cuda._sleep(int(ms * cycles_per_ms))

    kinds = build_kinds(torch)
    blocks = {n: Blocks(torch, n, *kinds[n], spin) for n in a.kinds}
    store = SessionStore(ring_tokens=8192, series_len=8192)
    col = CuptiCollector(store, sample_every=1, api=True, memory=True)
    col.start()                       # attached with a burst's kinds on
    for b in blocks.values():
        b.warm()
    col.detach()
    cover = {}                        # ms of spin that hides the host's queueing, per kind
    for n, b in blocks.items():
        b.capture()
        _, host = b.queued(5.0)
        cover[n] = max(2.0, 4.0 * host)   # traced launches cost the host more: 4x
        b.drop()
    rounds = []
    state_order = []
    t_start = time.perf_counter()
    for r in range(a.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        rnd = {}
        for traced in order:
            for b in blocks.values():
                b.drop()             # graphs CUPTI saw must not outlive a finalize; and a
            if traced:               # burst's graphs are recorded under it
                if not col.attach():
                    raise SystemExit("CUPTI refused to attach: " +
                                     str(store.view(raw=False).collectors.get("cupti")))
            elif col.attached:
                col.detach()
            state_order.append(traced)
            rnd["traced" if traced else "untraced"] = measure_state(
                torch, blocks, cover, store, col, traced, a.reps)
        if col.attached:
            for b in blocks.values():
                b.drop()
            col.detach()
        rounds.append(rnd)
        print(f"[kernels] round {r + 1}/{a.rounds} in {time.perf_counter() - t_start:.0f} s",
              flush=True)
    col.stop()
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cycles_per_ms": cycles_per_ms, "cover_ms": cover, "rounds": rounds,
            "summary": summarize_kernels(rounds, list(blocks))}


def measure_state(torch, blocks: dict, cover: dict, store, col, traced: bool,
                  reps: int) -> dict:
    """Every block of every kind in one state; traced: each block is a store token whose
    CUPTI records are read once the state ends (the detach hands every record over)."""
    out = {}
    tokens = []               # (kind, block, seq, calls)

    def token(kind: str, what: str, calls: int, fn):
        if not traced:
            return fn()
        seq = store.begin_token("decode", "eager", col.clock(), len(tokens), attached=True)
        res = fn()
        store.end_token(seq, col.clock(), 0.0)
        tokens.append((kind, what, seq, calls))
        return res

    for n, b in blocks.items():
        b.warm()
        b.capture()
        res = {"queued": [], "host_queue_ms": [], "launched": [], "pairs": [], "empty": [],
               "graph": [], "graph_launched": []}
        for _ in range(reps):
            q, host = token(n, "queued", b.reps, lambda: b.queued(cover[n]))
            res["queued"].append(q)
            res["host_queue_ms"].append(host)
            res["launched"].append(token(n, "launched", b.reps, b.launched))
            p = token(n, "pairs", b.pairs, lambda: b.pair_times(cover[n], False))
            res["pairs"].append(statistics.fmean(p))
            res["empty"].append(statistics.fmean(b.pair_times(cover[n], True)))
            res["graph"].append(token(n, "graph", b.reps, lambda: b.graph_block(1.0)))
            res["graph_launched"].append(token(n, "graph_launched", b.reps,
                                               lambda: b.graph_block(None)))
        out[n] = {k: med(v) for k, v in res.items()}
        out[n]["queue_hidden"] = max(res["host_queue_ms"]) < cover[n]
    if traced:
        col.flush()
        for b in blocks.values():     # records are handed over at the detach; graphs first
            b.drop()
        col.detach()
        raw = dict(store.view(raw=True).raw)
        cupti: dict = {}
        for kind, what, seq, calls in tokens:
            spans, per = call_spans(kernel_records(raw.get(seq, [])), calls)
            ks = kernel_records(raw.get(seq, []))
            d = cupti.setdefault(kind, {}).setdefault(what, {"span": [], "kernels": [],
                                                            "dur": [], "block": []})
            if spans:
                d["span"].append(statistics.fmean(spans))
                d["kernels"].append(per)
                d["dur"].append(sum(e - s for s, e in ks) / 1e6 / calls)
                d["block"].append((ks[-1][1] - ks[0][0]) / 1e6 / calls)
        for kind, whats in cupti.items():
            for what, d in whats.items():
                out[kind][f"cupti_{what}"] = {k: med(v) for k, v in d.items()}
        store.reset()
    return out


def summarize_kernels(rounds: list, kinds: list) -> dict:
    """Per kind and path, medians over rounds of the per-round figures (module docstring)."""
    out = {}
    for n in kinds:
        per: dict[str, list] = {}

        def add(key, val):
            per.setdefault(key, []).append(val)

        for rnd in rounds:
            u, t = rnd["untraced"][n], rnd["traced"][n]
            cp = t.get("cupti_pairs") or {}
            cq = t.get("cupti_queued") or {}
            cg = t.get("cupti_graph") or {}
            d_u = u["pairs"] - u["empty"]
            d_t = t["pairs"] - t["empty"]
            if cp.get("span") is None:
                continue
            bracket = d_t - cp["span"]
            d_true = d_u - bracket
            k = cq.get("kernels") or cp.get("kernels") or 1
            add("kernels", k)
            add("d_untraced_events", d_u)
            add("d_traced_events", d_t)
            add("cupti_stream", cp["span"])
            add("bracket", bracket)
            add("d_true", d_true)
            add("dur_infl_stream", d_t - d_u)
            add("dur_infl_stream_literal", cp["span"] - d_u)
            add("gap_untraced_stream", u["queued"] - d_true)
            add("gap_traced_stream", t["queued"] - (cq.get("span") or cp["span"]))
            add("step_queued", t["queued"] / u["queued"])
            add("step_launched", t["launched"] / u["launched"])
            add("queued_untraced", u["queued"])
            add("queued_traced", t["queued"])
            add("launched_untraced", u["launched"])
            add("launched_traced", t["launched"])
            add("events_vs_cupti_block", t["queued"] / cq["block"] if cq.get("block") else None)
            if cg.get("span") is not None:
                add("cupti_graph", cg["span"])
                add("dur_infl_graph", cg["span"] - d_true)
                add("gap_untraced_graph", u["graph"] - d_true)
                add("gap_traced_graph", t["graph"] - cg["span"])
            add("step_graph", t["graph"] / u["graph"])
            add("step_graph_launched", t["graph_launched"] / u["graph_launched"])
            add("graph_untraced", u["graph"])
            add("graph_traced", t["graph"])
            add("queue_hidden", bool(u["queue_hidden"] and t["queue_hidden"]))
        s = {key: med(v) if key != "queue_hidden" else all(v) for key, v in per.items()}
        for path in ("stream", "graph"):
            gu, gt = s.get(f"gap_untraced_{path}"), s.get(f"gap_traced_{path}")
            s[f"gap_infl_{path}"] = None if gu is None or gt is None else gt - gu
        s["rounds"] = len(per.get("kernels", []))
        out[n] = s
    return out


def suggested_constants(summary: dict) -> dict:
    """ns per kernel, by path: the median over the small kinds of their duration inflation a
    kernel (the value for analysis.tracing.DURATION_INFLATION_NS; 0 when not positive)."""
    out = {}
    for path in ("stream", "graph"):
        vals = []
        for n in SMALL:
            s = summary.get(n) or {}
            d, k = s.get(f"dur_infl_{path}"), s.get("kernels") or 1
            if d is not None:
                vals.append(d * 1e6 / k)
        m = med(vals)
        out[path] = None if m is None else round(max(0.0, m), 1)
    return out


# ------------------------------------------------------------------------------ model
def model_part(a) -> dict:
    from tuiprof.profiler import Profiler  # noqa: PLC0415
    from tuiprof.spec import EngineSpec, ProfilerOptions  # noqa: PLC0415
    from tuiprof.store import SessionStore  # noqa: PLC0415

    mode = a.part
    tokens = a.eager_tokens if mode == "eager" else a.compiled_tokens
    store = SessionStore(ring_tokens=64, series_len=tokens + 64)
    prof = Profiler(store, ProfilerOptions(sample_every=a.sample_every, engine=EngineSpec.resolve(
        a.model, mode=mode, max_new_tokens=tokens + 1, loop=False)))
    t0 = time.perf_counter()
    prof.start()
    while not prof.wait(15):
        print(f"[{mode}] {time.perf_counter() - t0:4.0f} s {prof.status.state} "
              f"steps {store.next_seq()}", flush=True)
        if time.perf_counter() - t0 > a.part_timeout:
            break
    prof.stop()
    if prof.status.state == "error":
        return {"mode": mode, "error": prof.status.message}
    return model_figures(store.view(raw=False), mode, a.delta_stream, a.delta_graph)


def model_figures(view, mode: str, delta_stream: float | None = None,
                  delta_graph: float | None = None) -> dict:
    """The model part's figures from a session's view (medians over its decode steps)."""
    from tuiprof.analysis.batch import config_summaries  # noqa: PLC0415
    from tuiprof.analysis.tokens import mode_launch_path  # noqa: PLC0415

    rows = [t for t in view.tokens if t.done and t.phase == "decode" and t.mode == mode
            and not t.apart]
    untraced = [t for t in rows if t.attached is False]
    traced = [t for t in rows if t.attached and t.sampled and t.kernels]
    lead = [t for t in rows if t.attached and not t.sampled]

    def stat(ts, f):
        return med([f(t) for t in ts])

    def span(t):
        return (t.last_kernel_end_ns - t.first_kernel_ns) / 1e6

    out = {"mode": mode, "steps": len(rows), "untraced_steps": len(untraced),
           "traced_steps": len(traced), "attached_untraced_steps": len(lead),
           "untraced_gpu_ms": stat(untraced, lambda t: t.gpu_ms),
           "traced_gpu_ms": stat(traced, lambda t: t.gpu_ms),
           "attached_untraced_gpu_ms": stat(lead, lambda t: t.gpu_ms),
           "untraced_host_ms": stat(untraced, lambda t: t.host_ms),
           "traced_host_ms": stat(traced, lambda t: t.host_ms),
           "traced_kernels": stat(traced, lambda t: t.kernels),
           "traced_kernel_ms": stat(traced, lambda t: t.kernel_ns / 1e6),
           "traced_busy_ms": stat(traced, lambda t: t.busy_ns / 1e6),
           "traced_span_ms": stat(traced, span),
           "traced_gaps_ms": stat(traced, lambda t: span(t) - t.busy_ns / 1e6),
           "traced_head_ms": stat(traced, lambda t: (t.first_kernel_ns - t.start_ns) / 1e6),
           "path": mode_launch_path(view, "decode", mode)}
    u, tr = out["untraced_gpu_ms"], out["traced_gpu_ms"]
    if u and tr:
        out["step_inflation_events"] = tr / u
        out["stretch_ms"] = tr - u
        delta = delta_graph if out["path"] == "graph" else delta_stream
        if delta is not None and out["traced_kernels"]:
            inside = out["traced_kernels"] * delta / 1e6
            out["stretch_inside_durations_ms"] = inside
            out["stretch_elsewhere_ms"] = out["stretch_ms"] - inside
            out["delta_ns_used"] = delta
    if out["traced_span_ms"] and u:
        out["span_vs_untraced_events"] = out["traced_span_ms"] / u
    for name, basis in (("before", "traced"), ("after", "auto")):
        s = [c for c in config_summaries(view, basis=basis) if c.mode == mode]
        if s:
            c = s[0]
            out[name] = {"busy": c.busy, "basis": c.busy_basis, "class": c.klass, "why": c.why,
                         "ms_step": c.ms_step, "mbu": c.mbu}
    out["device"] = view.meta.get("device_name")
    return out


# ------------------------------------------------------------------------------ report
def fmt_us(ms):
    return "–" if ms is None else f"{ms * 1e3:.2f}"


def fmt_dus(ms):
    return "–" if ms is None else f"{ms * 1e3:+.2f}"


def fmt_x(r):
    return "–" if r is None else f"×{r:.3f}"


def print_kernels(res: dict) -> None:
    s = res["summary"]
    rounds = next(iter(s.values()))["rounds"]
    print(f"\n## kernels ({res['device']}, {rounds} rounds; µs per call, medians over rounds)")
    print("| kind | kernels | path | d untraced (events) | d CUPTI traced | duration inflation "
          "| literal (CUPTI − events) | gap untraced | gap traced | gap inflation "
          "| step queued | step launched |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, v in s.items():
        k = v.get("kernels")
        k = "–" if k is None else f"{k:g}"
        print(f"| {n} | {k} | stream | {fmt_us(v.get('d_true'))} "
              f"({fmt_us(v.get('d_untraced_events'))} bracketed) | {fmt_us(v.get('cupti_stream'))} "
              f"| {fmt_dus(v.get('dur_infl_stream'))} "
              f"| {fmt_dus(v.get('dur_infl_stream_literal'))} "
              f"| {fmt_us(v.get('gap_untraced_stream'))} | {fmt_us(v.get('gap_traced_stream'))} "
              f"| {fmt_dus(v.get('gap_infl_stream'))} | {fmt_x(v.get('step_queued'))} "
              f"| {fmt_x(v.get('step_launched'))} |")
        print(f"| {n} | {k} | graph | {fmt_us(v.get('d_true'))} "
              f"| {fmt_us(v.get('cupti_graph'))} | {fmt_dus(v.get('dur_infl_graph'))} | – "
              f"| {fmt_us(v.get('gap_untraced_graph'))} | {fmt_us(v.get('gap_traced_graph'))} "
              f"| {fmt_dus(v.get('gap_infl_graph'))} | {fmt_x(v.get('step_graph'))} "
              f"| {fmt_x(v.get('step_graph_launched'))} (launch incl.) |")
    hidden = [n for n, v in s.items() if not v.get("queue_hidden", True)]
    if hidden:
        print(f"note: the spin kernel did not hide the host's queueing for {hidden}: their "
              "'queued' figures include launch gaps")


def print_model(res: dict) -> None:
    if "error" in res:
        print(f"\n## {res.get('mode', '?')}: failed: {res['error']}")
        return
    m = res["mode"]
    print(f"\n## qwen3-0.6b {m} ({res.get('device')}): {res['untraced_steps']} untraced, "
          f"{res['traced_steps']} traced, {res['attached_untraced_steps']} attached-untraced "
          f"steps (medians)")
    print("| figure | untraced | traced | traced / untraced |")
    print("|---|---|---|---|")
    for label, a, b in (("GPU ms/step (CUDA events)", "untraced_gpu_ms", "traced_gpu_ms"),
                        ("wall ms/step", "untraced_host_ms", "traced_host_ms")):
        u, t = res.get(a), res.get(b)
        print(f"| {label} | {u and f'{u:.3f}'} | {t and f'{t:.3f}'} "
              f"| {fmt_x(t / u if u and t else None)} |")
    print(f"| attached, not tracing: GPU ms/step | {res.get('attached_untraced_gpu_ms')} | | |")
    print(f"traced steps ({res['path']} path): {res.get('traced_kernels')} kernels, kernel sum "
          f"{res.get('traced_kernel_ms')} ms, busy {res.get('traced_busy_ms')} ms, span "
          f"{res.get('traced_span_ms')} ms, gaps {res.get('traced_gaps_ms')} ms, head "
          f"{res.get('traced_head_ms')} ms")
    if "stretch_ms" in res:
        line = f"stretch {res['stretch_ms']:.3f} ms a step"
        if "stretch_inside_durations_ms" in res:
            line += (f": {res['stretch_inside_durations_ms']:.3f} ms inside kernel durations "
                     f"({res['traced_kernels']:.0f} × {res['delta_ns_used']:.0f} ns), "
                     f"{res['stretch_elsewhere_ms']:.3f} ms in gaps and around the kernels")
        print(line)
    for name in ("before", "after"):
        c = res.get(name)
        if c:
            busy = "–" if c["busy"] is None else f"{c['busy']:.1%}"
            print(f"{name}: busy {busy} ({c['basis']} basis) → {c['class']}: {c['why']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--parts", default="kernels,eager,compiled")
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--reps", type=int, default=4, help="blocks of each kind a state, a round")
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--eager-tokens", type=int, default=320)
    p.add_argument("--compiled-tokens", type=int, default=2048)
    p.add_argument("--sample-every", type=int, default=16,
                   help="a burst of 4 traced steps in every 4 x N (CUPTI finalized between)")
    p.add_argument("--delta-stream", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--delta-graph", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--part-timeout", type=float, default=200,
                   help="seconds a part may run (a model part then reports what it has)")
    a = p.parse_args()
    a.kinds = [k for k in a.kinds.split(",") if k]
    if a.part:                         # a child: one part, its JSON to --json
        res = kernels_part(a) if a.part == "kernels" else model_part(a)
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
        return 0
    try:
        import torch  # noqa: PLC0415
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
    except Exception as exc:
        print(f"tracing_perturbation needs a CUDA GPU ({exc}); run it on the device machine")
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"argv": sys.argv[1:], "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    deltas: dict = {}
    for part in a.parts.split(","):
        js = out / f"tracing_{part}.json"
        cmd = [sys.executable, __file__, "--part", part, "--json", str(js),
               "--kinds", ",".join(a.kinds), "--rounds", str(a.rounds), "--reps", str(a.reps),
               "--model", a.model, "--eager-tokens", str(a.eager_tokens),
               "--compiled-tokens", str(a.compiled_tokens), "--sample-every", str(a.sample_every),
               "--part-timeout", str(a.part_timeout)]
        for path in ("stream", "graph"):
            if deltas.get(path) is not None:
                cmd += [f"--delta-{path}", str(deltas[path])]
        t0 = time.perf_counter()
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        try:
            proc = subprocess.run(cmd, env=env, timeout=a.part_timeout + 60)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        secs = time.perf_counter() - t0
        if rc != 0 or not js.exists():
            results[part] = {"error": f"exit {rc} after {secs:.0f} s"}
            print(f"[{part}] failed: exit {rc} after {secs:.0f} s", flush=True)
            continue
        res = json.loads(js.read_text())
        res["seconds"] = round(secs, 1)
        results[part] = res
        if part == "kernels":
            deltas = suggested_constants(res["summary"])
            results["suggested_duration_inflation_ns"] = deltas
            print_kernels(res)
        else:
            print_model(res)
    (out / "tracing_perturbation.json").write_text(json.dumps(results, indent=1, default=str))
    if "suggested_duration_inflation_ns" in results:
        print("\nsuggested tuiprof/analysis/tracing.py DURATION_INFLATION_NS (ns a kernel, median "
              f"over {', '.join(SMALL)}): {results['suggested_duration_inflation_ns']}")
    print(f"results: {out / 'tracing_perturbation.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
