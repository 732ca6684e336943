"""Requests: latency percentiles over a sliding window, one request's story, the exports' phases
and the processes' requests joined (request findings and a rate sweep's cells:
:mod:`tuiprof.analysis.request_rules`). Pure functions over a view (``view.requests``: rows and aggregates,
``view.timeline``: the steps) and plain data; docs/serving.md has the definitions.

Definitions (every time on the session clock):

* **queue wait**: arrival to the start of the first model step that advanced the request;
* **TTFT**: arrival to its first token; **prefill**: its first step to its first token;
* **ITL**: the gaps between its consecutive tokens; **end-to-end**: arrival to finish;
* **outside model steps**: its end-to-end time during which no model step ran at all (the
  server's own Python, tokenisation, HTTP, waiting for work to arrive, start-up).
"""
from __future__ import annotations

import copy
import dataclasses
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..store.records import K_END, K_NAME, K_START, KERNEL, KIND


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
    # the kernel's receipt of its first bytes to the HTTP server reading them (None: unknown)
    in_socket_ms: float | None = None


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
    inside = _inside_ms(view, r, end)
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
        outside, inside, itl_summary(r), kern, in_socket_ms=getattr(r, "in_socket_ms", None))


def _kernels(view: Any, r: Any, its: list, steps: int) -> dict:
    """The kernels of a request's steps still in view (the traced ones)."""
    traced = [t for t in its if t.sampled and t.kernels]
    top: dict[str, list] = {}
    want = {t.seq for t in traced}
    for seq, recs in view.raw or ():
        if seq not in want:
            continue
        for rec in recs:
            if rec[KIND] == KERNEL:
                e = top.setdefault(rec[K_NAME], [0, 0])
                e[0] += 1
                e[1] += rec[K_END] - rec[K_START]
    return {"steps": steps, "in_view": len(its), "traced": len(traced),
            "kernels": sum(t.kernels for t in traced),
            "kernel_ms": sum(t.kernel_ns for t in traced) / 1e6,
            "gpu_ms": sum(t.gpu_ms for t in its if t.gpu_ms is not None) or None,
            "top": sorted(((n, c, ns / 1e6) for n, (c, ns) in top.items()),
                          key=lambda x: -x[2])[:8]}


def _inside_ms(view: Any, r: Any, end: int) -> float | None:
    """The request's time inside the model (ms): what its finished record says, else the steps'
    time over its interval when the steps go back that far; None when they do not."""
    if r.finish_ns and r.model_ns is not None and r.model_ns >= 0:
        return r.model_ns / 1e6
    starts, ends = step_intervals(view)
    if starts and starts[0] <= r.arrival_ns:
        return inside_ns(starts, ends, r.arrival_ns, end) / 1e6
    return None


def _outside_story(view: Any, r: Any, tl: list) -> RequestStory:
    """A request seen from outside the engine (a proxy): its steps are those that ran while it
    was in flight (joined by time); no queue wait, no prefill split, no step said it advanced
    it."""
    end = r.finish_ns or now_ns(view)
    its = [t for t in tl if t.start_ns < end and t.end_ns > r.arrival_ns]
    inside = _inside_ms(view, r, end)
    outside = max(0.0, (end - r.arrival_ns) / 1e6 - inside) if inside is not None else None
    # the book joins a finished request to the steps that had ended by then; the view also
    # has the one that was running when it finished
    kern = _kernels(view, r, its, max(len(r.steps), len(its)))
    return RequestStory(r, None, None, None, [], 0, 0.0, 0, None, 0, None, outside, inside,
                        itl_summary(r), kern, outside=True,
                        in_socket_ms=getattr(r, "in_socket_ms", None))


# ------------------------------------------------------------------ exports
def phases(r: Any, end_ns: int) -> list[tuple[str, int, int]]:
    """A request's life as ranges: ``request`` (arrival to finish, or ``end_ns`` while in
    flight) holding ``in the socket buffer`` (the kernel's receipt of its first bytes to the
    HTTP server's read of them, where that was later), ``before the app`` (that read to its
    app, where known), ``queued`` (to its first step), ``prefill`` (to its first token) and
    ``decode`` (to its finish); a phase not reached is left out. A request seen from outside
    the engine (the proxy) holds ``ttft`` (to its first token) and ``decode`` instead, after
    its wait in the socket buffer, if any."""
    end = r.finish_ns or max(end_ns, r.last_token_ns, r.arrival_ns)
    out = [("request", r.arrival_ns, end)]
    read = getattr(r, "read_ns", 0)
    if read > r.arrival_ns:
        out.append(("in the socket buffer", r.arrival_ns, min(read, end)))
    if getattr(r, "outside", False):
        # seen from outside the engine: no queue and no prefill were measured, only the time
        # to its first token ("ttft") and the stream after it
        out.append(("ttft", r.arrival_ns, min(r.first_token_ns or end, end)))
        if r.first_token_ns:
            out.append(("decode", r.first_token_ns, end))
        return [(n, s, max(s, e)) for n, s, e in out]
    app = getattr(r, "app_ns", 0) or r.arrival_ns
    if app > r.arrival_ns:
        out.append(("before the app", min(max(read, r.arrival_ns), end), min(app, end)))
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
    if engine is None or frontend is None or not getattr(engine, "rows", None):
        return engine
    if not any(r.source in ENGINE_SOURCES for r in engine.rows):
        return engine
    front = {r.id: r for r in frontend.rows if r.source in FRONTEND_SOURCES}
    warm_ids = {r.id for r in getattr(frontend, "warmup", ()) or ()
                if r.source in FRONTEND_SOURCES}
    for r in getattr(frontend, "warmup", ()) or ():
        if r.source in FRONTEND_SOURCES:
            front[r.id] = r
    if not front:
        return engine
    rows, warm = [], []
    for r in getattr(engine, "warmup", ()) or ():   # the engine knew it (its id said so)
        f = front.get(r.id) if r.source in ENGINE_SOURCES else None
        warm.append(r if f is None else _joined(r, f))
    counts = dict(engine.counts)
    moved = 0     # rows the API process's warm-ups take out of the engine's counts
    for r in engine.rows:
        f = front.get(r.id) if r.source in ENGINE_SOURCES else None
        if f is None:
            rows.append(r)
            continue
        j = _joined(r, f)
        if r.id in warm_ids and not r.warmup:
            # a warm-up the API process knows of (its client said so): apart from the
            # engine's counts too, as a store keeps its own warm-ups
            j.warmup = True
            _uncount(counts, r)
            warm.append(j)
            moved += 1
            continue
        rows.append(j)
    stats = dict(engine.stats)
    for k in ("ttft_ms", "itl_ms", "e2e_ms", "output_tokens"):
        if k in frontend.stats:
            stats[k] = frontend.stats[k]
    sources = dict(engine.sources)
    for k, v in list(sources.items()):
        if k in ENGINE_SOURCES:
            sources[ENGINE_SOURCES[k]] = sources.pop(k)
    for r in warm[len(warm) - moved:]:
        if r.source in sources:
            sources[r.source] = max(0, sources[r.source] - 1)
    return dataclasses.replace(engine, rows=tuple(rows), stats=stats, counts=counts,
                               misuse=dict(engine.misuse), sources=sources, warmup=tuple(warm))


def _joined(r: Any, f: Any) -> Any:
    """The engine's row ``r`` with the client's side from the API process's row ``f``."""
    j = copy.copy(r)
    j.source = ENGINE_SOURCES[r.source]
    j.arrival_ns = min(f.arrival_ns, r.arrival_ns) if f.arrival_ns else r.arrival_ns
    j.app_ns = getattr(f, "app_ns", 0) or getattr(r, "app_ns", 0)
    j.read_ns = getattr(f, "read_ns", 0) or getattr(r, "read_ns", 0)
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
    return j


def _uncount(counts: dict, r: Any) -> None:
    """Take request ``r`` out of a store's counts, into its warm-ups (``RequestBook.warmup``)."""
    counts["arrived"] = max(0, counts.get("arrived", 0) - 1)
    counts["tokens"] = max(0, counts.get("tokens", 0) - r.output_tokens)
    if r.done and r.status in ("finished", "failed", "cancelled"):
        counts[r.status] = max(0, counts.get(r.status, 0) - 1)
    if getattr(r, "preemptions", 0):
        counts["preempted"] = max(0, counts.get("preempted", 0) - r.preemptions)
    counts["warmup"] = counts.get("warmup", 0) + 1


def join_processes(views: Iterable) -> list:
    """Every process's view, an engine process's requests joined with the API process's
    (:func:`join_requests`); the API process is the one whose requests are a frontend's."""
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
