"""Requests: latency percentiles over a sliding window, one request's story, request findings
and a rate sweep's cells. Pure functions over a view (``view.requests``: rows and aggregates,
``view.timeline``: the steps) and plain data; docs/serving.md has the definitions.

Definitions (every time on the session clock):

* **queue wait**: arrival to the start of the first model step that advanced the request;
* **TTFT**: arrival to its first token; **prefill**: its first step to its first token;
* **ITL**: the gaps between its consecutive tokens; **end-to-end**: arrival to finish;
* **outside model steps**: its end-to-end time during which no model step ran at all (the
  server's own Python, tokenisation, HTTP, waiting for work to arrive, start-up).
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..errors import safe_text

WINDOW_S = 60.0           # the sliding window of the requests pane
METRICS = ("ttft_ms", "itl_ms", "queue_ms", "e2e_ms")
QUANTILES = (0.5, 0.9, 0.99)
# finding thresholds (docs/analysis.md)
WAIT_SHARE = 0.5          # queue wait share of TTFT that makes waiting a finding
WAIT_MS = 1000.0          # or a queue wait this long, for any request
OUTSIDE_SHARE = 0.3       # end-to-end share outside model steps
SPIKE_RATIO = 1.5         # decode steps shared with a prefill over decode-only steps
KV_FULL = 0.95            # KV-cache blocks used of the total
UNDERFILLED_SHARE = 0.2   # steps where requests waited while the batch had room


def pct(values: list, q: float) -> float | None:
    """Nearest-rank percentile ``q`` (0..1) of ``values`` (None when empty)."""
    if not values:
        return None
    s = sorted(values)
    return float(s[min(len(s) - 1, max(0, int(q * (len(s) - 1) + 0.5)))])


def itl_summary(r: Any) -> dict | None:
    """``{count, mean, p50, p90, p99, max}`` of one request's inter-token latencies (ms)."""
    itl = r.itls_ms()
    if not itl:
        return None
    s = sorted(itl)
    return {"count": len(s), "mean": sum(s) / len(s), "p50": pct(s, 0.5), "p90": pct(s, 0.9),
            "p99": pct(s, 0.99), "max": s[-1]}


def outside_ms(r: Any) -> float | None:
    """A finished request's time outside any model step (ms); None when unknown."""
    if not r.finish_ns or r.model_ns is None or r.model_ns < 0:
        return None
    return max(0, r.finish_ns - r.arrival_ns - r.model_ns) / 1e6


def step_intervals(view: Any) -> tuple[list, list]:
    """(starts, ends) of the model steps in view (done, not a program's time window)."""
    steps = [t for t in (view.timeline or view.tokens) if t.done and t.phase != "window"]
    steps.sort(key=lambda t: t.start_ns)
    return [t.start_ns for t in steps], [max(t.start_ns, t.end_ns) for t in steps]


def inside_ns(starts: list, ends: list, t0: int, t1: int) -> int:
    """Time in [t0, t1] covered by the steps (starts/ends sorted, not overlapping)."""
    i = max(0, bisect_left(ends, t0))
    total = 0
    for k in range(i, len(starts)):
        if starts[k] >= t1:
            break
        total += max(0, min(ends[k], t1) - max(starts[k], t0))
    return total


def now_ns(view: Any) -> int:
    """The latest time the view knows of (its newest step, token, arrival or finish)."""
    t = 0
    for r in view.requests.rows:
        t = max(t, r.finish_ns, r.last_token_ns, r.arrival_ns)
    tl = view.timeline or view.tokens
    if tl:
        last = tl[-1]
        t = max(t, last.end_ns or last.start_ns)
    return t


# ------------------------------------------------------------------ the window
@dataclass(frozen=True)
class WindowStats:
    """Requests over the last ``span_s`` seconds (finished in it; tokens delivered in it)."""

    span_s: float
    finished: int
    in_flight: int
    requests_per_s: float
    tokens_per_s: float                      # output tokens delivered per second
    quantiles: dict = field(default_factory=dict)   # metric -> (p50, p90, p99), None if none
    series: dict = field(default_factory=dict)      # metric -> [(seconds before now, value)]
    whole: bool = False                      # the window covers every request still kept


def window(view: Any, seconds: float = WINDOW_S, now: int | None = None) -> WindowStats:
    """TTFT, ITL, queue wait and end-to-end over the requests finished in the last
    ``seconds`` (at most the rows the store keeps), with request and output-token rates."""
    rows = view.requests.rows
    now = now if now is not None else now_ns(view)
    t0 = now - int(seconds * 1e9)
    done = [r for r in rows if r.done and r.finish_ns >= t0 and r.status == "finished"]
    first = min((r.arrival_ns for r in rows), default=now)
    span = max(1e-9, min(seconds, (now - max(t0, first)) / 1e9)) if rows else seconds
    vals: dict[str, list] = {m: [] for m in METRICS}
    series: dict[str, list] = {m: [] for m in METRICS}
    for r in done:
        age = (now - r.finish_ns) / 1e9
        for m, v in (("ttft_ms", r.ttft_ms), ("queue_ms", r.queue_ms), ("e2e_ms", r.e2e_ms)):
            if v is not None:
                vals[m].append(v)
                series[m].append((age, v))
    tokens = 0
    for r in rows:
        t = r.token_ns
        if len(t) and t[-1] >= t0:
            k = bisect_left(t, t0)
            tokens += len(t) - k
            if len(t) - k > 1:
                gaps = [(t[i] - t[i - 1]) / 1e6 for i in range(max(1, k), len(t))]
                vals["itl_ms"].extend(gaps)
                age = (now - t[-1]) / 1e9
                series["itl_ms"].append((age, sum(gaps) / len(gaps)))
    qs = {m: tuple(pct(v, q) for q in QUANTILES) if v else None for m, v in vals.items()}
    return WindowStats(span, len(done), sum(1 for r in rows if not r.done),
                       len(done) / span if span else 0.0, tokens / span if span else 0.0, qs,
                       series, whole=bool(rows) and t0 <= first)


@dataclass(frozen=True)
class InFlight:
    id: Any
    age_ms: float
    state: str
    tokens: int
    ttft_ms: float | None
    itl_p50_ms: float | None


def in_flight(view: Any, now: int | None = None) -> list[InFlight]:
    """The requests in flight, oldest first."""
    now = now if now is not None else now_ns(view)
    out = []
    for r in view.requests.rows:
        if r.done:
            continue
        itl = r.itls_ms()
        state = r.status
        if state == "queued" and getattr(r, "outside", False):
            state = "no token"   # seen from outside: whether it is queued nobody says
        out.append(InFlight(r.id, max(0, now - r.arrival_ns) / 1e6, state, r.output_tokens,
                            r.ttft_ms, pct(itl, 0.5) if itl else None))
    out.sort(key=lambda x: -x.age_ms)
    return out


# ------------------------------------------------------------ one request's story
@dataclass(frozen=True)
class RequestStory:
    """What one request went through (docs/serving.md, "A request's detail")."""

    row: Any
    before_app_ms: float | None      # the HTTP server's first bytes to its app (None: unknown)
    server_ms: float | None          # arrival to the engine's queue (parsing, tokenisation)
    waited_ms: float | None          # arrival to its first model step
    behind: list                     # [(step seq, prefill tokens, [request ids prefilling])]
    steps_before: int                # model steps that ran while it waited
    busy_wait_ms: float              # of its wait, the time those steps ran
    prefill_steps: int
    prefill_ms: float | None         # its first step to its first token
    decode_steps: int
    shared_mean: float | None        # others in its decode steps, on average
    outside_ms: float | None         # its life outside any model step
    inside_ms: float | None
    itl: dict | None
    kernels: dict                    # steps of it still in view: traced, kernels, kernel ms, top
    outside: bool = False            # seen from outside the engine (a proxy): no queue, no split


def story(view: Any, rid: Any) -> RequestStory | None:
    """The story of request ``rid`` (None when the view does not have it)."""
    r = view.requests.get(rid)
    if r is None:
        return None
    tl = [t for t in (view.timeline or view.tokens) if t.done and t.phase != "window"]
    if getattr(r, "outside", False):
        return _outside_story(view, r, tl)
    end_wait = r.first_step_ns or r.finish_ns or now_ns(view)
    # the steps that ran while it waited: the one running when it arrived, and those after
    before = [t for t in tl if t.start_ns < end_wait and t.end_ns > r.arrival_ns
              and t.seq != r.first_step_seq]
    busy_wait = sum(min(t.end_ns, end_wait) - max(t.start_ns, r.arrival_ns)
                    for t in before) / 1e6
    behind = []
    for t in before:
        ids = list(t.requests[:t.prefills])
        if ids or t.prefill_tokens:
            behind.append((t.seq, t.prefill_tokens, ids))
    end = r.finish_ns or now_ns(view)
    starts, ends = step_intervals(view)
    inside = None
    if r.finish_ns and r.model_ns is not None and r.model_ns >= 0:
        inside = r.model_ns / 1e6
    elif starts and starts[0] <= r.arrival_ns:
        inside = inside_ns(starts, ends, r.arrival_ns, end) / 1e6
    e2e = (end - r.arrival_ns) / 1e6
    outside = max(0.0, e2e - inside) if inside is not None else None
    mine = set(r.steps)
    its = [t for t in tl if t.seq in mine]
    kern = _kernels(view, r, its, len(r.steps))
    app = r.app_ns or r.arrival_ns
    return RequestStory(
        r, r.before_app_ms, (r.queued_ns - app) / 1e6 if r.queued_ns else None, r.queue_ms,
        behind,
        len(before), busy_wait, r.prefill_steps,
        (r.first_token_ns - r.first_step_ns) / 1e6 if r.first_token_ns and r.first_step_ns
        else None, r.decode_steps, r.shared / r.decode_steps if r.decode_steps else None,
        outside, inside, itl_summary(r), kern)


def _kernels(view: Any, r: Any, its: list, steps: int) -> dict:
    """The kernels of a request's steps still in view (the traced ones)."""
    traced = [t for t in its if t.sampled and t.kernels]
    top: dict[str, list] = {}
    want = {t.seq for t in traced}
    for seq, recs in view.raw or ():
        if seq not in want:
            continue
        for rec in recs:
            if rec[0] == "K":
                e = top.setdefault(rec[1], [0, 0])
                e[0] += 1
                e[1] += rec[3] - rec[2]
    return {"steps": steps, "in_view": len(its), "traced": len(traced),
            "kernels": sum(t.kernels for t in traced),
            "kernel_ms": sum(t.kernel_ns for t in traced) / 1e6,
            "gpu_ms": sum(t.gpu_ms for t in its if t.gpu_ms is not None) or None,
            "top": sorted(((n, c, ns / 1e6) for n, (c, ns) in top.items()),
                          key=lambda x: -x[2])[:8]}


def _outside_story(view: Any, r: Any, tl: list) -> RequestStory:
    """A request seen from outside the engine (a proxy): its steps are those that ran while it
    was in flight (joined by time); no queue wait, no prefill split, no step said it advanced
    it."""
    end = r.finish_ns or now_ns(view)
    its = [t for t in tl if t.start_ns < end and t.end_ns > r.arrival_ns]
    starts, ends = step_intervals(view)
    inside = None
    if r.finish_ns and r.model_ns is not None and r.model_ns >= 0:
        inside = r.model_ns / 1e6
    elif starts and starts[0] <= r.arrival_ns:
        inside = inside_ns(starts, ends, r.arrival_ns, end) / 1e6
    outside = max(0.0, (end - r.arrival_ns) / 1e6 - inside) if inside is not None else None
    # the book joins a finished request to the steps that had ended by then; the view also
    # has the one that was running when it finished
    kern = _kernels(view, r, its, max(len(r.steps), len(its)))
    return RequestStory(r, None, None, None, [], 0, 0.0, 0, None, 0, None, outside, inside,
                        itl_summary(r), kern, outside=True)


# ------------------------------------------------------------------ findings
def _finding(*args: Any, **kw: Any):
    from .findings import Finding  # noqa: PLC0415 - findings imports this module's rules

    return Finding(*args, **kw)


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
    return [_finding("requests-waiting", title, sev, None,
                     p50_w / p50_t if p50_t else None, nums, ev, adv)]


def _ttft_split(view: Any, summaries: Any = None) -> list:
    """TTFT dominated by queueing or by prefill."""
    rows = [r for r in _finished(view) if r.first_token_ns and r.first_step_ns]
    if len(rows) < 2:
        return []
    # TTFT = before the app (an HTTP server's first bytes to its app; 0 where not known)
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
           "before the app": "TTFT is mostly before the server's app saw the request (reading "
                             "and parsing it, the event loop's queue): the server's event loop "
                             "is busy; keep tokenisation and streaming off it, or add "
                             "workers."}[by]
    nums.update(queue_share_p50=qs, prefill_share_p50=ps)
    before = ""
    if known:
        nums.update(before_app_p50_ms=tb, before_app_share_p50=bs)
        before = f"before the app p50 {tb:.1f} ms, "
    return [_finding("ttft-split", f"TTFT p50 {tt:.1f} ms, mostly {by}: {share:.0%} of a "
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
    return [_finding("itl-neighbour-prefill",
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
    return [_finding("outside-model-steps", f"{s(o)} of {s(e)} a request is outside model steps",
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
    return [_finding("kv-cache-full", title, "high" if pre else "medium", None,
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
    return [_finding("batch-underfilled", f"Batch underfilled while requests waited: "
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
               f"theirs p50 {dt:+.2f} ms, end to end {de:+.2f} ms (HTTP and the event stream)")
    adv = ("For a queue wait and a prefill per request, serve with hooks tuiprof reads "
           "(transformers continuous batching, tuiprof.request_*), or send stream_options "
           "{\"include_usage\": true} so that token counts are the server's own.")
    return [_finding("requests-from-outside", title, "info", None, None, nums, ev, adv)]


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
        return _finding("slo-max-load", f"No {kind} met the SLO ({slo}, {attainment:.0%} of "
                        f"requests)", "high", None, None, nums,
                        "; ".join(f"{c.value:g}{unit}: {c.attainment:.0%}" for c in cells
                                  if c.attainment is not None),
                        "Lower the load below the smallest one tried, or make the server "
                        "faster (see the other findings).")
    nums["best"] = best.value
    return _finding("slo-max-load", f"Highest {kind} meeting the SLO: {best.value:g}{unit} "
                    f"({best.attainment:.0%} of requests within {slo}; goodput "
                    f"{best.goodput_rps:.2f} req/s)", "info", None, best.attainment, nums,
                    "; ".join(f"{c.value:g}{unit}: {c.attainment:.0%} within, goodput "
                              f"{c.goodput_rps:.2f} req/s" for c in cells
                              if c.attainment is not None),
                    "Run at or below this load to keep the SLO; above it, requests queue.")


# ------------------------------------------------------------------ exports
def phases(r: Any, end_ns: int) -> list[tuple[str, int, int]]:
    """A request's life as ranges: ``request`` (arrival to finish, or ``end_ns`` while in
    flight) holding ``before the app`` (an HTTP server's first bytes of it to its app, where
    known), ``queued`` (to its first step), ``prefill`` (to its first token) and ``decode``
    (to its finish); a phase not reached is left out. A request seen from outside the engine
    (the proxy) holds ``ttft`` (to its first token) and ``decode`` instead."""
    end = r.finish_ns or max(end_ns, r.last_token_ns, r.arrival_ns)
    out = [("request", r.arrival_ns, end)]
    if getattr(r, "outside", False):
        # seen from outside the engine: no queue and no prefill were measured, only the time
        # to its first token ("ttft") and the stream after it
        out.append(("ttft", r.arrival_ns, min(r.first_token_ns or end, end)))
        if r.first_token_ns:
            out.append(("decode", r.first_token_ns, end))
        return [(n, s, max(s, e)) for n, s, e in out]
    app = getattr(r, "app_ns", 0) or r.arrival_ns
    if app > r.arrival_ns:
        out.append(("before the app", r.arrival_ns, min(app, end)))
    first_step = r.first_step_ns or (end if not r.first_token_ns else r.first_token_ns)
    out.append(("queued", min(app, end), min(first_step, end)))
    if r.first_step_ns:
        out.append(("prefill", r.first_step_ns, min(r.first_token_ns or end, end)))
    if r.first_token_ns:
        out.append(("decode", r.first_token_ns, end))
    return [(n, s, max(s, e)) for n, s, e in out]


def export_requests(view: Any, t0: int, t1: int) -> list:
    """The requests an export of the window [t0, t1] shows: those alive in it (every kept
    request when the window is empty, ``t1 <= t0``)."""
    rows = list(view.requests.rows)
    if t1 <= t0:
        return rows
    now = now_ns(view)
    return [r for r in rows if r.arrival_ns <= t1 and (r.finish_ns or now) >= t0]


# ---------------------------------------------------------------- processes joined
# a request's record in the server's API process and in its engine process (vLLM's frontend
# and EngineCore: tuiprof/program/vllm_requests.py), the same id in both
FRONTEND_SOURCES = ("vllm",)
ENGINE_SOURCES = {"vllm engine": "vllm"}
# what the client saw comes from the API process; the rest from the engine's record
_CLIENT_FIELDS = ("arrival_ns", "first_token_ns", "last_token_ns", "finish_ns", "status",
                  "reason", "output_tokens", "client_id")


def join_requests(engine: Any, frontend: Any) -> Any:
    """``engine``'s requests (a :class:`~tuiprof.store.requests.RequestsView` joined to its
    steps) with, for each request ``frontend`` also has, the client's side from ``frontend``:
    arrival (HTTP), client id, every token's and the finish's time as the API process handed
    them on, finish reason. Aggregates of the client's figures (TTFT, ITL, end-to-end) are the
    frontend's; the queue wait and the time outside model steps stay the engine's. ``engine``
    unchanged when nothing joins."""
    import copy  # noqa: PLC0415
    from array import array  # noqa: PLC0415

    if engine is None or frontend is None or not getattr(engine, "rows", None):
        return engine
    if not any(r.source in ENGINE_SOURCES for r in engine.rows):
        return engine
    front = {r.id: r for r in frontend.rows if r.source in FRONTEND_SOURCES}
    if not front:
        return engine
    rows = []
    for r in engine.rows:
        f = front.get(r.id) if r.source in ENGINE_SOURCES else None
        if f is None:
            rows.append(r)
            continue
        j = copy.copy(r)
        j.source = ENGINE_SOURCES[r.source]
        j.arrival_ns = min(f.arrival_ns, r.arrival_ns) if f.arrival_ns else r.arrival_ns
        j.client_id = f.client_id or r.client_id
        j.traceparent = f.traceparent or r.traceparent
        if f.token_ns:
            j.token_ns = array("q", f.token_ns)
            j.first_token_ns, j.last_token_ns = f.first_token_ns, f.last_token_ns
            j.output_tokens = f.output_tokens
        if f.done:
            j.finish_ns, j.status, j.reason = f.finish_ns, f.status, f.reason or r.reason
        elif r.done:   # the engine finished it; the API process has not handed it on yet
            j.status = "decode" if j.token_ns else r.status
            j.finish_ns = 0
        rows.append(j)
    stats = dict(engine.stats)
    for k in ("ttft_ms", "itl_ms", "e2e_ms", "output_tokens"):
        if k in frontend.stats:
            stats[k] = frontend.stats[k]
    sources = dict(engine.sources)
    for k, v in list(sources.items()):
        if k in ENGINE_SOURCES:
            sources[ENGINE_SOURCES[k]] = sources.pop(k)
    return type(engine)(tuple(rows), stats, dict(engine.counts), dict(engine.misuse), sources,
                        engine.keep)


def join_processes(views: Iterable) -> list:
    """Every process's view, an engine process's requests joined with the API process's
    (:func:`join_requests`); the API process is the one whose requests are a frontend's."""
    import dataclasses  # noqa: PLC0415

    views = list(views)
    front = next((v.requests for v in views if getattr(v, "requests", None) is not None
                  and any(k in FRONTEND_SOURCES for k in v.requests.sources)), None)
    if front is None:
        return views
    out = []
    for v in views:
        req = getattr(v, "requests", None)
        if req is not None and req is not front and any(k in ENGINE_SOURCES
                                                         for k in req.sources):
            try:
                v = dataclasses.replace(v, requests=join_requests(req, front))
            except (TypeError, ValueError):
                pass
        out.append(v)
    return out
