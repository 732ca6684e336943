"""Chrome trace / Perfetto JSON of the recorded window.

One process per GPU (``pid`` = device id) with one track per CUDA stream (``tid`` = stream
id) holding its kernels, memcpys and memsets as complete (``"X"``) events; a ``tuiprof``
process with a ``tokens`` track (prefill/decode phase ranges enclosing one range per token)
and counter (``"C"``) tracks for the NVML series and the per-token latency; a server's
requests alive in the window in a ``requests`` process, one async track per request
(``"b"``/``"e"`` events with the request's id: ``request`` holding ``queued``, ``prefill`` and
``decode``; the timeline then starts at the earliest arrival). Timestamps are
microseconds (floats, ns precision) from the window's first event. Events that would overlap
partially on one track (never seen on a real stream) go to an extra ``overlap`` track, which
Perfetto requires. A multi-rank session has one process per rank instead (its streams, its
tokens track and its counters).
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import __version__
from ..store import StoreView
from ..store.rank_set import RanksView
from ._atomic import atomic_write_bytes
from .window import GpuOp, device_id, device_name, window_of

HOST_PID = 1_000_000       # the tuiprof "process": tokens and counters
TOKENS_TID = 1
REQUESTS_PID = 1_000_001   # a server's requests: one async track each
RANK_TOKENS_TID = 2_000_000_000   # a rank's tokens track (beside its stream tracks)
UNKNOWN_STREAM_TID = 0     # memcpy/memset records without a stream id
LANE_STRIDE = 1_000_000    # tid of overlap lane n of stream s: s + n * LANE_STRIDE
_CAT = {"K": "kernel", "C": "gpu_memcpy", "S": "gpu_memset"}
NVML_UNITS = {"gpm_sm_util": "%", "gpm_sm_occupancy": "%", "gpm_dram_bw_util": "%",
              "gpm_tensor_util": "%", "util_gpu": "%", "util_memory": "%",
              "mem_used_bytes": "B", "power_mw": "mW", "sm_clock_mhz": "MHz"}


def _us(ns: int) -> float:
    return ns / 1000.0


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _op_args(op: GpuOp) -> dict:
    args: dict = {"stream": op.stream, "correlation": op.corr}
    if op.kind == "K":
        args.update({"raw name": op.raw, "grid": list(op.grid), "block": list(op.block),
                     "registers per thread": op.regs, "shared memory": op.smem,
                     "graph": op.graph_id})
    else:
        args["bytes"] = op.bytes
    return args


def _assign_lanes(ops: list[GpuOp]) -> list[int]:
    """A lane per op such that events on one (stream, lane) never overlap."""
    lane_end: dict[tuple[int, int], int] = {}
    lanes = []
    for op in ops:
        lane = 0
        while lane_end.get((op.stream, lane), -1) > op.start:
            lane += 1
        lane_end[(op.stream, lane)] = op.end
        lanes.append(lane)
    return lanes


def _gpu_events(w, t0: int, pid: int, label_prefix: str = "") -> tuple[list, list]:
    """(metadata, events) of the window's GPU ops: one track per stream of process ``pid``."""
    events: list[dict] = []
    tracks: set[tuple[int, int]] = set()
    body: list[dict] = []
    for op, lane in zip(w.ops, _assign_lanes(w.ops)):
        tid = op.stream + lane * LANE_STRIDE
        if (op.stream, lane) not in tracks:
            tracks.add((op.stream, lane))
            label = f"stream {op.stream}" if op.stream else "stream ? (not recorded)"
            events.append(_meta("thread_name", pid, tid,
                                {"name": label_prefix + label + (f" (overlap {lane})" if lane else "")}))
            events.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
        body.append({"name": op.name, "cat": _CAT[op.kind], "ph": "X", "pid": pid, "tid": tid,
                     "ts": _us(op.start - t0), "dur": _us(op.end - op.start),
                     "args": _op_args(op)})
    return events, body


def _host_events(view: StoreView, w, t0: int, pid: int, tid: int, off: int = 0) -> list:
    """Token and phase ranges on track ``tid``, token latency and NVML counters of ``pid``."""
    body: list[dict] = []
    # Phase ranges (runs of tokens of one phase and mode) enclosing the token ranges.
    runs: list[list] = []
    for t in w.tokens:
        if not (t.done and t.end_ns >= t.start_ns):
            continue
        start, end = t.start_ns - off, t.end_ns - off
        if runs and runs[-1][0] == (t.phase, t.mode, t.cycle):
            runs[-1][2] = end
            runs[-1][3] += 1
        else:
            runs.append([(t.phase, t.mode, t.cycle), start, end, 1])
        body.append({"name": f"{t.phase} {t.step}" if t.step >= 0 else t.phase,
                     "cat": "token", "ph": "X", "pid": pid, "tid": tid,
                     "ts": _us(start - t0), "dur": _us(end - start),
                     "args": {"seq": t.seq, "step": t.step, "mode": t.mode, "kernels": t.kernels,
                              "host_ms": t.host_ms, "busy_ms": t.busy_ns / 1e6}})
        body.append({"name": "token latency (ms)", "cat": "counter", "ph": "C",
                     "pid": pid, "tid": 0, "ts": _us(end - t0),
                     "args": {"ms": t.host_ms}})
    for (phase, mode, _cycle), start, end, n in runs:
        body.append({"name": f"{phase} ({mode})", "cat": "phase", "ph": "X", "pid": pid,
                     "tid": tid, "ts": _us(start - t0), "dur": _us(end - start),
                     "args": {"tokens": n}})
    for smp in view.nvml:
        ts = smp.get("ts_ns")
        if not isinstance(ts, int) or ts - off < t0 or ts - off > w.t1:
            continue
        for key, value in smp.items():
            if key == "ts_ns" or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            unit = NVML_UNITS.get(key, "")
            body.append({"name": f"nvml {key}" + (f" ({unit})" if unit else ""),
                         "cat": "nvml", "ph": "C", "pid": pid, "tid": 0,
                         "ts": _us(ts - off - t0), "args": {key: value}})
    return body


def _requests_of(view: StoreView, w) -> list:
    """The requests alive in the window (every kept one when it is empty)."""
    from ..analysis.requests import export_requests  # noqa: PLC0415

    if not view.requests.rows:
        return []
    return export_requests(view, w.t0, w.t1) if not w.empty else list(view.requests.rows)


def _request_events(view: StoreView, reqs: list, t0: int, pid: int = REQUESTS_PID) -> list:
    """Async ranges of ``reqs``: ``request`` holding ``queued``, ``prefill``, ``decode``."""
    from ..analysis.requests import now_ns, phases  # noqa: PLC0415

    body: list[dict] = []
    now = now_ns(view)
    for r in reqs:
        rid = str(r.id)
        for name, start, end in phases(r, now):
            args = {"request": rid}
            if name == "request":
                args.update(prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens,
                            status=r.status, ttft_ms=r.ttft_ms, e2e_ms=r.e2e_ms)
            common = {"cat": "request", "id": rid, "pid": pid, "tid": 0}
            body.append({"name": name, "ph": "b", "ts": _us(start - t0), "args": args, **common})
            body.append({"name": name, "ph": "e", "ts": _us(end - t0), **common})
    return body


def _sorted(body: list) -> list:
    # Parents before children at equal timestamps: by ts, then longest first.
    body.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    return body


def trace_dict(view: StoreView | RanksView) -> dict:
    """The trace document (``{"traceEvents": [...], ...}``) of the recorded window."""
    if isinstance(view, RanksView):
        return ranks_trace_dict(view)
    w = window_of(view)
    t0 = w.t0
    dev = device_id(view)
    device = device_name(view)
    events: list[dict] = [
        _meta("process_name", dev, 0, {"name": f"GPU {dev}: {device}"}),
        _meta("process_labels", dev, 0, {"labels": f"GPU {dev}"}),
        _meta("process_sort_index", dev, 0, {"sort_index": dev}),
        _meta("process_name", HOST_PID, 0, {"name": "tuiprof"}),
        _meta("process_sort_index", HOST_PID, 0, {"sort_index": -1}),
        _meta("thread_name", HOST_PID, TOKENS_TID, {"name": "tokens"}),
        _meta("thread_sort_index", HOST_PID, TOKENS_TID, {"sort_index": 0}),
    ]
    reqs = _requests_of(view, w)
    if reqs:  # the timeline starts at the earliest of them: a request's queue wait is whole
        t0 = min(t0, *(r.arrival_ns for r in reqs)) if not w.empty else \
            min(r.arrival_ns for r in reqs)
    meta, body = _gpu_events(w, t0, dev)
    body += _host_events(view, w, t0, HOST_PID, TOKENS_TID)
    if reqs:
        events += [_meta("process_name", REQUESTS_PID, 0, {"name": "requests"}),
                   _meta("process_sort_index", REQUESTS_PID, 0, {"sort_index": -2})]
        body += _request_events(view, reqs, t0)
    return {
        "traceEvents": events + meta + _sorted(body),
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": t0,
        "otherData": {"producer": f"tuiprof {__version__}", "device": device,
                      "time_origin": "first event of the recorded window (CUPTI ns in "
                                     "baseTimeNanoseconds)",
                      "tokens": len(w.tokens)},
    }


def ranks_trace_dict(rv: RanksView) -> dict:
    """One process per rank (``pid`` = rank): its tokens track, one track per CUDA stream,
    its token latency and NVML counters; all ranks on the aligned timeline."""
    offsets = rv.clock.offsets_ns
    windows = []
    for view, off in zip(rv.views, offsets):
        w = window_of(view)
        for op in w.ops:
            op.start, op.end = op.start - off, op.end - off
        w.t0, w.t1 = w.t0 - off, w.t1 - off
        windows.append(w)
    nonempty = [w for w in windows if not w.empty]
    t0 = min((w.t0 for w in nonempty), default=0)
    events: list[dict] = []
    body: list[dict] = []
    for r, (view, w, off) in enumerate(zip(rv.views, windows, offsets)):
        dev = device_id(view)
        device = device_name(view)
        where = "CPU" if device.startswith("cpu") else f"GPU {dev}: {device}"
        events += [_meta("process_name", r, 0, {"name": f"rank {r} ({where})"}),
                   _meta("process_labels", r, 0, {"labels": f"rank {r}"}),
                   _meta("process_sort_index", r, 0, {"sort_index": r}),
                   _meta("thread_name", r, RANK_TOKENS_TID, {"name": "tokens"}),
                   _meta("thread_sort_index", r, RANK_TOKENS_TID, {"sort_index": -1})]
        meta, ops = _gpu_events(w, t0, r)
        events += meta
        body += ops
        body += _host_events(view, w, t0, r, RANK_TOKENS_TID, off)
    return {
        "traceEvents": events + _sorted(body),
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": t0,
        "otherData": {"producer": f"tuiprof {__version__}", "ranks": rv.world_size,
                      "clock": rv.clock.to_dict(),
                      "time_origin": "first event of any rank's recorded window (aligned "
                                     "CUPTI ns in baseTimeNanoseconds)",
                      "tokens": sum(len(w.tokens) for w in windows)},
    }


def write_trace(view: StoreView | RanksView, path: str | Path) -> Path:
    """Write the Chrome trace JSON of the recorded window atomically; returns the path."""
    doc = trace_dict(view)
    try:
        data = json.dumps(doc, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in a name: kept exactly, as a \u escape
        data = json.dumps(doc, separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False).encode("ascii")
    return atomic_write_bytes(path, data)
