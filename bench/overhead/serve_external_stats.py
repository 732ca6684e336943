"""The figures of ``serve_external.py``: one cell's client figures, the ratios to bare over
rounds (median and spread, the ratio of totals, and pooled latencies), each session's own
figure beside the client's cost, and the markdown report.

Why each figure is there:

* **throughput** (output tokens over the load's wall time, first due to last end): at a rate
  well below saturation an open-loop client's throughput is set by its arrivals, so its
  ratio moves only by the last request's end; near saturation it is the server's capacity;
* **TTFT and end-to-end p50/p99**, each cell's against the bare cell of its round;
* **TPOT p50** (time per output token after the first, each request's own): the figure that
  says what a step costs, over every token of every request, least moved by one slow request;
* **pooled** p50s: every request of every round of a way against every request of bare's
  rounds (the latency counterpart of the ratio of totals);
* **bare's own spread** over rounds: how far the same server moved between rounds, the
  yardstick a ratio's spread is read against.
"""
from __future__ import annotations

import statistics

MODES = ("bare", "live", "headless", "leave", "every")
METRICS = ("tok_s", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "tpot_p50")
POOLED = ("ttft", "e2e", "tpot")


def pct(xs: list, q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def tpot_ms(r: dict) -> float | None:
    """A request's time per output token after its first (ms), None with fewer than two."""
    if not r.get("ok") or r.get("tokens", 0) < 2 or "ttft_ms" not in r or "last_s" not in r:
        return None
    first = r["due_s"] + r["ttft_ms"] / 1e3
    return max(0.0, (r["last_s"] - first) * 1e3 / (r["tokens"] - 1))


def cell_figures(recs: list) -> dict:
    ok = [r for r in recs if r.get("ok")]
    ttft = [r["ttft_ms"] for r in ok]
    e2e = [r["e2e_ms"] for r in ok]
    tpot = [t for t in (tpot_ms(r) for r in ok) if t is not None]
    wall = (max(r["end_s"] for r in ok) - min(r["due_s"] for r in recs)) if ok else None
    toks = sum(r["tokens"] for r in ok)
    return {"requests": len(recs), "ok": len(ok), "tokens": toks, "wall_s": wall,
            "tok_s": toks / wall if wall else None, "req_s": len(ok) / wall if wall else None,
            "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
            "e2e_p50": pct(e2e, 0.5), "e2e_p99": pct(e2e, 0.99), "tpot_p50": pct(tpot, 0.5),
            # every request's own figures (ms), for the pooled ratios
            "lat": {"ttft": [round(x, 2) for x in ttft], "e2e": [round(x, 2) for x in e2e],
                    "tpot": [round(x, 3) for x in tpot]},
            "errors": sorted({r["error"] for r in recs if r.get("error")})[:3]}


def window_pct(series: list, start: float, end: float) -> float | None:
    """A session's own overhead figure over [start, end] (unix seconds): the rise of its cost
    over the time between the first and last of its series' moments inside the window (None
    with fewer than two of them, or less than half a second apart)."""
    inside = [(t, c) for t, c in series or () if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] - inside[0][0] < 0.5:
        return None
    (t0, c0), (t1, c1) = inside[0], inside[-1]
    return 100.0 * (c1 - c0) / (t1 - t0)


def _spread(v: list) -> dict:
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def summarize(cells: list) -> dict:
    """Per rate and way: each round's ratio to the bare server's cell of the same round; the
    throughput's ratio of totals; pooled p50 ratios; the sessions' own figures over their cells
    beside the client's cost; bare's own spread over rounds."""
    bare = {(c["round"], c["rate"]): c for c in cells if c["mode"] == "bare"}
    out: dict = {}
    totals: dict = {}
    own: dict = {}
    pooled: dict = {}
    for c in cells:
        if c["mode"] == "bare":
            continue
        b = bare.get((c["round"], c["rate"]))
        if b is None:
            continue
        key = (f"{c['rate']:g}", c["mode"])
        slot = out.setdefault(key[0], {}).setdefault(c["mode"], {m: [] for m in METRICS})
        for m in METRICS:
            if c["fig"].get(m) and b["fig"].get(m):
                slot[m].append(c["fig"][m] / b["fig"][m])
        if c["fig"].get("tokens") and b["fig"].get("tokens"):
            t = totals.setdefault(key, [0.0, 0.0, 0.0, 0.0])
            t[0] += c["fig"]["tokens"]
            t[1] += c["fig"]["wall_s"]
            t[2] += b["fig"]["tokens"]
            t[3] += b["fig"]["wall_s"]
        p = pooled.setdefault(key, {k: ([], []) for k in POOLED})
        for k in POOLED:   # only rounds where both ran
            p[k][0].extend((c["fig"].get("lat") or {}).get(k) or ())
            p[k][1].extend((b["fig"].get("lat") or {}).get(k) or ())
        if c.get("self_pct") is not None:
            own.setdefault(key, []).append(c["self_pct"])
    table = {}
    for rate, modes in out.items():
        for mode, ms in modes.items():
            row = {m: _spread(v) for m, v in ms.items() if v}
            t = totals.get((rate, mode))
            if t and t[1] and t[3] and t[2]:
                row["tok_s_totals"] = (t[0] / t[1]) / (t[2] / t[3])
            for k, (mine, theirs) in (pooled.get((rate, mode)) or {}).items():
                a, b = pct(mine, 0.5), pct(theirs, 0.5)
                if a and b:
                    row[f"{k}_pooled"] = a / b
            o = own.get((rate, mode))
            if o:
                row["self_pct"] = _spread(o)
            if row.get("tok_s"):
                row["cost_tok_s_pct"] = 100.0 * (1.0 - row["tok_s"]["median"])
            if row.get("tpot_pooled"):
                row["cost_tpot_pct"] = 100.0 * (1.0 - 1.0 / row["tpot_pooled"])
            table.setdefault(rate, {})[mode] = row
    bare_abs: dict = {}
    for c in bare.values():
        bare_abs.setdefault(f"{c['rate']:g}", []).append(c["fig"])
    bare_fig = {}
    for r, fs in bare_abs.items():
        row = {}
        for m in METRICS:
            v = [f[m] for f in fs if f.get(m)]
            if v:
                row[m] = _spread(v)
        bare_fig[r] = row
    return {"ratios": table, "bare": bare_fig}


def _cell(v: dict | None, extra: float | None = None) -> str:
    if v is None:
        return "–"
    text = f"{v['median']:.3f} ({v['min']:.3f}–{v['max']:.3f})"
    return text if extra is None else f"{text} · {extra:.3f}"


def report(s: dict) -> str:
    lines = ["| rate (req/s) | tuiprof | rounds | throughput · ratio of totals | TTFT p50 · "
             "pooled | TTFT p99 | e2e p50 · pooled | e2e p99 | TPOT p50 · pooled | own figure "
             "over the load (%) | client's cost: 1 − throughput (%) | client's cost: per token "
             "(%) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for rate in sorted(s["ratios"], key=float):
        for mode in MODES:
            r = s["ratios"][rate].get(mode)
            if not r:
                continue
            n = max(v["n"] for k, v in r.items() if k in METRICS)
            cells = [_cell(r.get("tok_s"), r.get("tok_s_totals")),
                     _cell(r.get("ttft_p50"), r.get("ttft_pooled")), _cell(r.get("ttft_p99")),
                     _cell(r.get("e2e_p50"), r.get("e2e_pooled")), _cell(r.get("e2e_p99")),
                     _cell(r.get("tpot_p50"), r.get("tpot_pooled"))]
            o = r.get("self_pct")
            cells.append("–" if o is None else
                         f"{o['median']:.1f} ({o['min']:.1f}–{o['max']:.1f})")
            for k in ("cost_tok_s_pct", "cost_tpot_pct"):
                cells.append("–" if r.get(k) is None else f"{r[k]:.1f}")
            lines.append(f"| {rate} | {mode} | {n} | " + " | ".join(cells) + " |")
    lines += ["", "Ratios to the bare server of the same round: median (min–max over rounds); "
              "after · the ratio of totals (throughput) or of the pooled p50 over every request "
              "of those rounds. Throughput is output tokens/s over the load's wall time; TPOT is "
              "each request's time per output token after its first. The own figure is the "
              "session's overhead over each cell's load (its snapshot's overhead.series); the "
              "client's cost per token is 1 − 1/(pooled TPOT ratio).", "",
              "Bare, its own cells over rounds: median (min–max)", "",
              "| rate | rounds | throughput (tok/s) | TTFT p50 (ms) | TTFT p99 | e2e p50 | e2e p99 "
              "| TPOT p50 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for rate, f in sorted(s["bare"].items(), key=lambda kv: float(kv[0])):
        n = max((v["n"] for v in f.values()), default=0)
        lines.append(f"| {rate} | {n} | " + " | ".join(
            "–" if f.get(m) is None else
            f"{f[m]['median']:,.1f} ({f[m]['min']:,.1f}–{f[m]['max']:,.1f})" for m in METRICS)
            + " |")
    for mode, ov in (s.get("self_report") or {}).items():
        lines.append(f"\n{mode}: the session's own figure over its whole life: overhead "
                     f"{ov.get('pct')} % ({ov.get('method')}; threads {ov.get('threads_s')} s "
                     f"(NVML {ov.get('nvml_s')} s, CUPTI {ov.get('cupti_s')} s, serving "
                     f"{ov.get('serve_s')} s), hooks {ov.get('hooks_s')} s, switches "
                     f"{ov.get('switch_s')} s, traced steps {ov.get('tracing_s')} s over "
                     f"{ov.get('wall_s')} s; attached steps without an untraced peer "
                     f"{ov.get('untraced_reference_missing')})")
    if s.get("capacity"):
        lines.append(f"\ncapacity of the bare server (a burst at once): {s['capacity']}")
    return "\n".join(lines)
