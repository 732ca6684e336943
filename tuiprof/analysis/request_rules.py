"""Request findings (waiting, TTFT split, ITL next to prefills, time outside model steps, KV
cache, underfilled batches, requests seen only from outside) and a rate sweep's cells and its
finding. Pure functions over a view's requests (:mod:`tuiprof.analysis.requests` has the
definitions); docs/serving.md has the thresholds' meaning."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import safe_text
from .finding import Finding
from .requests import (OUTSIDE_SHARE, KV_FULL, SPIKE_RATIO, UNDERFILLED_SHARE, WAIT_MS, WAIT_SHARE,
                       inside_ns, outside_ms, pct, step_intervals)

# ------------------------------------------------------------------ findings
def _finished(view: Any) -> list:
    return [r for r in view.requests.rows if r.status == "finished"]


def _waiting(view: Any, summaries: Any = None) -> list:
    """Requests that waited before their first model step: queueing behind other requests'
    steps, or nothing running at all (start-up: a model, cache or compile being set up)."""
    rows = [r for r in view.requests.rows if r.first_step_ns]
    if not rows:
        return []
    waits = [r.queue_ms for r in rows]
    ttfts = [r.ttft_ms for r in rows if r.ttft_ms]
    p50_w, max_w = pct(waits, 0.5), max(waits)
    p50_t = pct(ttfts, 0.5) if ttfts else None
    if not (max_w >= WAIT_MS or (p50_t and p50_w >= WAIT_SHARE * p50_t and p50_w >= 1.0)):
        return []
    starts, ends = step_intervals(view)
    worst = max(rows, key=lambda r: r.queue_ms)
    busy = inside_ns(starts, ends, worst.arrival_ns, worst.first_step_ns) / 1e6 \
        if starts and starts[0] <= worst.arrival_ns else None
    idle = worst.queue_ms - busy if busy is not None else None
    startup = (busy is not None and idle >= 0.8 * worst.queue_ms) or (
        not starts or worst.first_step_ns <= starts[0])
    nums = {"requests": len(rows), "queue_p50_ms": p50_w, "queue_max_ms": max_w,
            "ttft_p50_ms": p50_t, "worst": str(worst.id), "worst_busy_ms": busy}
    wid = safe_text(worst.id, 40)   # a request id is the program's text
    if startup:
        ev = (f"request {wid} waited {worst.queue_ms / 1e3:.1f} s for its first model step "
              f"and no step ran in {(idle if idle is not None else worst.queue_ms) / 1e3:.1f} s "
              f"of it: the server was starting up (model, KV cache, warm-up or compile), not "
              f"busy with other requests")
        adv = ("Start the engine before traffic arrives: warm it up (for transformers "
               "continuous batching, create the manager and its cache at start-up, and size the "
               "KV cache with num_blocks instead of a share of memory), or send a warm-up "
               "request before taking load.")
        title = (f"Requests waited up to {max_w / 1e3:.1f} s before their first model step: "
                 f"start-up, not queueing")
    else:
        ev = (f"queue wait p50 {p50_w:.1f} ms, max {max_w:.1f} ms"
              + (f" (TTFT p50 {p50_t:.1f} ms)" if p50_t else "")
              + (f"; request {wid} waited {worst.queue_ms:.1f} ms while other requests' "
                 f"steps ran {busy:.1f} ms of it" if busy is not None else ""))
        adv = ("Requests queue behind others: more concurrency per step (a larger "
               "max_batch_tokens or KV cache), shorter prefill chunks, or more replicas.")
        title = f"Requests waited {p50_w:.0f} ms (p50), up to {max_w:.0f} ms, before their first step"
    sev = "high" if p50_t and p50_w >= WAIT_SHARE * p50_t else "medium"
    return [Finding("requests-waiting", title, sev, None,
                     p50_w / p50_t if p50_t else None, nums, ev, adv)]


def _ttft_split(view: Any, summaries: Any = None) -> list:
    """TTFT dominated by queueing or by prefill."""
    rows = [r for r in _finished(view) if r.first_token_ns and r.first_step_ns]
    if len(rows) < 2:
        return []
    # TTFT = before the app (the kernel's receipt of an HTTP request's first bytes to its app,
    #        their wait in the socket buffer included; 0 where not known)
    #      + queue (the app to the first step) + prefill (the first step to the first token)
    b = [(r.app_ns - r.arrival_ns) / 1e6 if r.app_ns else 0.0 for r in rows]
    q = [(r.first_step_ns - (r.app_ns or r.arrival_ns)) / 1e6 for r in rows]
    p = [(r.first_token_ns - r.first_step_ns) / 1e6 for r in rows]
    t = [r.ttft_ms for r in rows]
    tb, tq, tp, tt = pct(b, 0.5), pct(q, 0.5), pct(p, 0.5), pct(t, 0.5)
    if not tt:
        return []
    known = any(r.app_ns for r in rows)
    # each request's own split (percentiles of different quantities do not add up)
    bs = pct([x / y for x, y in zip(b, t) if y > 0], 0.5) or 0.0
    qs = pct([x / y for x, y in zip(q, t) if y > 0], 0.5) or 0.0
    ps = pct([x / y for x, y in zip(p, t) if y > 0], 0.5) or 0.0
    by, share = max((("queueing", qs), ("prefill", ps), ("before the app", bs)),
                    key=lambda kv: kv[1])
    nums = {"ttft_p50_ms": tt, "queue_p50_ms": tq, "prefill_p50_ms": tp,
            "ttft_p99_ms": pct(t, 0.99), "requests": len(rows), "dominated_by": by}
    adv = {"queueing": "TTFT is mostly waiting for a first step: add batch capacity "
                       "(max_batch_tokens, KV blocks) or limit concurrency.",
           "prefill": "TTFT is mostly the prefill itself (including its chunks and the steps "
                      "it shares): shorter prompts, larger prefill chunks, or a faster prefill "
                      "(compile, attention kernel).",
           "before the app": "TTFT is mostly before the server's app saw the request (its "
                             "bytes in the socket buffer, reading and parsing them, the event loop's queue): the server's event loop "
                             "is busy; keep tokenisation and streaming off it, or add "
                             "workers."}[by]
    nums.update(queue_share_p50=qs, prefill_share_p50=ps)
    before = ""
    if known:
        nums.update(before_app_p50_ms=tb, before_app_share_p50=bs)
        before = f"before the app p50 {tb:.1f} ms, "
    return [Finding("ttft-split", f"TTFT p50 {tt:.1f} ms, mostly {by}: {share:.0%} of a "
                     f"request's TTFT (median; {before}queue p50 {tq:.1f} ms, prefill p50 "
                     f"{tp:.1f} ms)",
                     "medium" if share >= 0.5 else "info", None, share, nums,
                     f"over {len(rows)} finished requests: {before}queue wait p50 {tq:.1f} ms, "
                     f"its first step to its first token p50 {tp:.1f} ms", adv)]


def _itl_neighbour_prefill(view: Any, summaries: Any = None) -> list:
    """Decode tokens that came out of steps shared with another request's prefill take
    longer than those of decode-only steps: the neighbour's prefill stretches their ITL."""
    tl = [t for t in (view.timeline or view.tokens) if t.done and t.requests and not t.apart]
    mixed = [t.host_ms for t in tl if t.decode_tokens and t.prefill_tokens]
    pure = [t.host_ms for t in tl if t.decode_tokens and not t.prefill_tokens]
    if len(mixed) < 2 or len(pure) < 2:
        return []
    m, p = pct(mixed, 0.5), pct(pure, 0.5)
    if not p or m < SPIKE_RATIO * p:
        return []
    affected = sum(t.decode_tokens for t in tl if t.decode_tokens and t.prefill_tokens)
    total = sum(t.decode_tokens for t in tl if t.decode_tokens)
    ptoks = pct([t.prefill_tokens for t in tl if t.decode_tokens and t.prefill_tokens], 0.5)
    nums = {"mixed_step_p50_ms": m, "decode_step_p50_ms": p, "ratio": m / p,
            "mixed_steps": len(mixed), "decode_steps": len(pure),
            "affected_tokens": affected, "decode_tokens": total, "prefill_tokens_p50": ptoks}
    return [Finding("itl-neighbour-prefill",
                     f"ITL spikes from a neighbour's prefill: {m:.1f} ms vs {p:.1f} ms per "
                     f"decode step ({affected} of {total} tokens)",
                     "medium" if affected / max(1, total) >= 0.05 else "low", None,
                     affected / max(1, total), nums,
                     f"{len(mixed)} steps decoded tokens beside another request's prefill "
                     f"(p50 {ptoks:.0f} prompt tokens) and took {m / p:.1f}x the "
                     f"{len(pure)} decode-only steps", "Chunk prefills smaller (a lower "
                     "max_batch_tokens) so that decode steps stay short, or separate prefill "
                     "and decode (disaggregation) when ITL matters more than TTFT.")]


def _outside(view: Any, summaries: Any = None) -> list:
    """Requests whose life is mostly outside any model step."""
    rows = [(r, outside_ms(r)) for r in _finished(view)]
    rows = [(r, o) for r, o in rows if o is not None and r.e2e_ms]
    if not rows:
        return []
    o = pct([x for _, x in rows], 0.5)
    e = pct([r.e2e_ms for r, _ in rows], 0.5)
    if not e or o < OUTSIDE_SHARE * e:
        return []
    srv = [(r.queued_ns - r.arrival_ns) / 1e6 for r, _ in rows if r.queued_ns]
    nums = {"outside_p50_ms": o, "e2e_p50_ms": e, "share": o / e, "requests": len(rows),
            "server_before_queue_p50_ms": pct(srv, 0.5) if srv else None}

    def s(ms: float) -> str:
        return f"{ms / 1e3:.1f} s" if ms >= 1000 else f"{ms:.1f} ms"

    ev = (f"median over {len(rows)} requests: {s(o)} of their {s(e)} end to end passed with no "
          f"model step running")
    if srv:
        ev += f"; the server's own work before the engine's queue (parsing, tokenisation) " \
              f"p50 {pct(srv, 0.5):.2f} ms"
    return [Finding("outside-model-steps", f"{s(o)} of {s(e)} a request is outside model steps",
                     "high" if o >= 0.5 * e else "medium", None, o / e, nums, ev,
                     "The time goes to the server, not the model: start-up (see "
                     "requests-waiting), the engine's loop sleeping between requests, the "
                     "server's Python, tokenisation or HTTP. Profile the server process's "
                     "threads (the host pane), warm up before load, and keep the engine's loop "
                     "fed.")]


def _kv_full(view: Any, summaries: Any = None) -> list:
    tl = [t for t in (view.timeline or view.tokens) if t.done and t.kv_total]
    pre = view.requests.counts.get("preempted", 0)
    if not tl and not pre:
        return []
    full = [t for t in tl if t.kv_used >= KV_FULL * t.kv_total]
    peak = max((t.kv_used / t.kv_total for t in tl), default=0.0)
    if not full and not pre:
        return []
    waiting = sum(1 for t in full if t.pending)
    nums = {"steps_full": len(full), "steps": len(tl), "peak_share": peak, "preemptions": pre,
            "full_steps_with_waiting": waiting,
            "kv_total_blocks": tl[-1].kv_total if tl else None}
    title = (f"KV cache full in {len(full)} of {len(tl)} steps" if full else "KV cache") + (
        f", {pre} preemption{'s' if pre != 1 else ''}" if pre else "")
    return [Finding("kv-cache-full", title, "high" if pre else "medium", None,
                     len(full) / len(tl) if tl else None, nums,
                     f"peak {peak:.0%} of {nums['kv_total_blocks']} blocks; {waiting} of the "
                     f"full steps had requests waiting", "Give the KV cache more blocks "
                     "(memory share, num_blocks), shorter outputs, or fewer requests at once; "
                     "a preempted request computes its prompt again.")]


def _underfilled(view: Any, summaries: Any = None) -> list:
    """Steps that advanced fewer requests than the server has shown it can, while requests
    waited and the KV cache had room."""
    tl = [t for t in (view.timeline or view.tokens) if t.done and t.requests]
    if len(tl) < 4:
        return []
    most = max(len(t.requests) for t in tl)
    under = [t for t in tl if t.pending and len(t.requests) < most
             and (not t.kv_total or t.kv_used < KV_FULL * t.kv_total)]
    if len(under) < UNDERFILLED_SHARE * len(tl) or most < 2:
        return []
    mean_b = sum(len(t.requests) for t in under) / len(under)
    mean_w = sum(t.pending for t in under) / len(under)
    nums = {"steps": len(under), "of_steps": len(tl), "batch_mean": mean_b, "batch_max": most,
            "waiting_mean": mean_w}
    return [Finding("batch-underfilled", f"Batch underfilled while requests waited: "
                     f"{len(under)} of {len(tl)} steps advanced {mean_b:.1f} requests "
                     f"(up to {most} seen) with {mean_w:.1f} waiting", "medium", None,
                     len(under) / len(tl), nums,
                     "requests waited although the step had room (fewer requests than the most "
                     "seen in a step, KV cache not full)",
                     "The scheduler admits too little per step: raise max_batch_tokens or "
                     "max requests per batch, or check what holds requests back (a token "
                     "budget spent on one long prefill).")]


def _from_outside(view: Any, summaries: Any = None) -> list:
    """Requests seen through the proxy: what their figures are, and what they cannot be."""
    rows = [r for r in view.requests.rows if getattr(r, "outside", False)]
    if not rows:
        return []
    fin = [r for r in rows if r.status == "finished"]
    ttft = [r.ttft_ms for r in fin if r.ttft_ms is not None]
    e2e = [r.e2e_ms for r in fin if r.e2e_ms is not None]
    chunks = sum(1 for r in rows if r.tokens_from == "chunks")
    steps = [len(r.steps) for r in fin]
    bad = sum(1 for r in rows if r.http_status >= 400)
    nums = {"requests": len(rows), "finished": len(fin), "ttft_p50_ms": pct(ttft, 0.5),
            "e2e_p50_ms": pct(e2e, 0.5), "tokens_counted_from_chunks": chunks,
            "steps_in_flight_p50": pct(steps, 0.5), "http_errors": bad}
    # the same requests seen by the engine's own hooks too: how far apart the two views are
    own = {r.id: r for r in view.requests.rows if not getattr(r, "outside", False)}
    own.update({r.client_id: r for r in view.requests.rows if getattr(r, "client_id", "")
                and not getattr(r, "outside", False)})   # a server whose ids are its own
    pairs = [(r, own[r.id[6:]]) for r in fin if isinstance(r.id, str)
             and r.id.startswith("proxy:") and r.id[6:] in own]
    pairs = [(a, b) for a, b in pairs if b.status == "finished" and a.ttft_ms is not None
             and b.ttft_ms is not None]
    title = (f"{len(rows)} requests seen through the proxy, from outside the engine: TTFT p50 "
             f"{_ms(pct(ttft, 0.5))}, end to end p50 {_ms(pct(e2e, 0.5))}; no queue time")
    ev = ("arrival is the request's first byte at the proxy and its first token the first "
          "streamed chunk that carried text (a response that is not a stream: its end); the "
          "server does not say when a request entered its queue or which steps advanced it, so "
          "TTFT is not split into queue wait and prefill, and its steps are those that ran "
          "while it was in flight (joined by time")
    ev += f", p50 {pct(steps, 0.5):.0f} a request)" if steps else ")"
    if chunks:
        ev += (f"; {chunks} sent no usage: their output tokens are the chunks counted and their "
               "prompt is unknown")
    if bad:
        ev += f"; {bad} answered with an HTTP error"
    if pairs:
        dt = pct([a.ttft_ms - b.ttft_ms for a, b in pairs], 0.5)
        de = pct([a.e2e_ms - b.e2e_ms for a, b in pairs], 0.5)
        nums.update(matched=len(pairs), ttft_minus_hooks_p50_ms=dt, e2e_minus_hooks_p50_ms=de)
        ev += (f"; {len(pairs)} were also seen by the engine's hooks: the proxy's TTFT minus "
               f"theirs p50 {dt:+.2f} ms, end to end {de:+.2f} ms")
        wired = [(a, b) for a, b in pairs if getattr(b, "wire_first_ns", 0)
                 and getattr(b, "wire_end_ns", 0) and a.token_ns and b.first_token_ns]
        if wired:
            # the hooks' own clock points differ from the proxy's: they end at the engine
            # (its token handed over, its finish), the proxy at the bytes it read. Over the
            # same interval (the hooks to the bytes their server wrote) the rest is the phases
            ms = 1e6
            wt = pct([a.ttft_ms - (b.wire_first_ns - b.arrival_ns) / ms for a, b in wired], 0.5)
            we = pct([a.e2e_ms - (b.wire_end_ns - b.arrival_ns) / ms for a, b in wired], 0.5)
            into = pct([(b.arrival_ns - a.arrival_ns) / ms for a, b in wired], 0.5)
            after = pct([(b.wire_first_ns - b.first_token_ns) / ms for a, b in wired], 0.5)
            back = pct([(a.token_ns[0] - b.wire_first_ns) / ms for a, b in wired], 0.5)
            nums.update(ttft_minus_hooks_wire_p50_ms=wt, e2e_minus_hooks_wire_p50_ms=we,
                        to_server_p50_ms=into, after_engine_p50_ms=after,
                        back_to_proxy_p50_ms=back)
            ev += (f": {after:.2f} ms (p50) from the engine handing the first token over to "
                   f"its server writing it (detokenising, the event stream, the server's event "
                   f"loop), which the hooks' TTFT leaves out and a client pays; over the same "
                   f"interval (the hooks to the bytes their server wrote) the proxy's TTFT "
                   f"minus theirs p50 {wt:+.2f} ms, end to end {we:+.2f} ms: {into:.2f} ms "
                   f"from the proxy's arrival to the server reading it, {back:.2f} ms from "
                   "the first token written to the proxy reading it")
        else:
            ev += " (HTTP and the event stream)"
    adv = ("For a queue wait and a prefill per request, serve with hooks tuiprof reads "
           "(transformers continuous batching, tuiprof.request_*), or send stream_options "
           "{\"include_usage\": true} so that token counts are the server's own.")
    return [Finding("requests-from-outside", title, "info", None, None, nums, ev, adv)]


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f} ms"


REQUEST_RULES = (_waiting, _ttft_split, _itl_neighbour_prefill, _outside, _kv_full,
                 _underfilled, _from_outside)


# ------------------------------------------------------------------ sweep cells
@dataclass(frozen=True)
class ServeCell:
    """One cell of a serving sweep (a rate or a concurrency)."""

    load: str                 # "rate" | "concurrency"
    value: float
    requests: int
    duration_s: float
    requests_per_s: float
    tokens_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    e2e_p50_ms: float | None
    goodput_rps: float | None  # requests/s that met the SLO
    attainment: float | None   # share of requests that met the SLO
    status: str = "ok"
    error: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def meets_slo(r: Any, ttft_ms: float | None, itl_ms: float | None) -> bool:
    """A finished request within the SLO: TTFT and its mean ITL (time per output token)."""
    if r.status != "finished":
        return False
    if ttft_ms is not None and (r.ttft_ms is None or r.ttft_ms > ttft_ms):
        return False
    if itl_ms is not None:
        itl = r.itls_ms()
        if itl and sum(itl) / len(itl) > itl_ms:
            return False
    return True


def serve_cell(rows: Iterable, load: str, value: float, slo_ttft_ms: float | None = None,
               slo_itl_ms: float | None = None) -> ServeCell:
    """A sweep cell from the requests of one run (their span is its duration)."""
    rows = [r for r in rows if r.done]
    fin = [r for r in rows if r.status == "finished"]
    if not fin:
        return ServeCell(load, value, 0, 0.0, 0.0, 0.0, None, None, None, None, None, None,
                         None, "empty", "no request finished")
    t0 = min(r.arrival_ns for r in rows)
    t1 = max(r.finish_ns for r in rows)
    dur = max(1e-9, (t1 - t0) / 1e9)
    ttft = [r.ttft_ms for r in fin if r.ttft_ms is not None]
    itl = [x for r in fin for x in r.itls_ms()]
    e2e = [r.e2e_ms for r in fin]
    slo = slo_ttft_ms is not None or slo_itl_ms is not None
    good = sum(1 for r in fin if meets_slo(r, slo_ttft_ms, slo_itl_ms)) if slo else None
    return ServeCell(load, value, len(fin), dur, len(fin) / dur,
                     sum(r.output_tokens for r in fin) / dur, pct(ttft, 0.5), pct(ttft, 0.99),
                     pct(itl, 0.5), pct(itl, 0.99), pct(e2e, 0.5),
                     good / dur if good is not None else None,
                     good / len(rows) if good is not None else None)


def best_load(cells: list, attainment: float = 0.9) -> ServeCell | None:
    """The highest load whose requests met the SLO at least ``attainment`` of the time."""
    ok = [c for c in cells if c.status == "ok" and c.attainment is not None
          and c.attainment >= attainment]
    return max(ok, key=lambda c: c.value) if ok else None


def sweep_finding(cells: list, slo_ttft_ms: float | None, slo_itl_ms: float | None,
                  attainment: float = 0.9):
    """The highest rate (or concurrency) that still meets the SLO, as a finding."""
    if slo_ttft_ms is None and slo_itl_ms is None:
        return None
    slo = " and ".join(s for s in (f"TTFT <= {slo_ttft_ms:g} ms" if slo_ttft_ms is not None
                                   else "", f"ITL <= {slo_itl_ms:g} ms" if slo_itl_ms is not None
                                   else "") if s)
    best = best_load(cells, attainment)
    kind = cells[0].load if cells else "rate"
    unit = " req/s" if kind == "rate" else " concurrent"
    nums = {"slo_ttft_ms": slo_ttft_ms, "slo_itl_ms": slo_itl_ms, "attainment": attainment,
            "cells": [c.to_dict() for c in cells]}
    if best is None:
        return Finding("slo-max-load", f"No {kind} met the SLO ({slo}, {attainment:.0%} of "
                        f"requests)", "high", None, None, nums,
                        "; ".join(f"{c.value:g}{unit}: {c.attainment:.0%}" for c in cells
                                  if c.attainment is not None),
                        "Lower the load below the smallest one tried, or make the server "
                        "faster (see the other findings).")
    nums["best"] = best.value
    return Finding("slo-max-load", f"Highest {kind} meeting the SLO: {best.value:g}{unit} "
                    f"({best.attainment:.0%} of requests within {slo}; goodput "
                    f"{best.goodput_rps:.2f} req/s)", "info", None, best.attainment, nums,
                    "; ".join(f"{c.value:g}{unit}: {c.attainment:.0%} within, goodput "
                              f"{c.goodput_rps:.2f} req/s" for c in cells
                              if c.attainment is not None),
                    "Run at or below this load to keep the SLO; above it, requests queue.")
