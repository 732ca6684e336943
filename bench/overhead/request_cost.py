"""What tuiprof's request bookkeeping costs per output token (target: < 5 µs a token on the CI
CPU), on the paths a server takes:

* ``api``: ``tuiprof.request_token(id)`` once per token (a server of its own, under a session);
* ``batching``: transformers continuous batching's per-step hooks (``update_batch``'s diff over
  the batch, one locked ``advance`` per step) for a batch of B requests, per token;
* ``step``: the step's request record (``set_step_requests``) per token of a B-request step.

Each figure is the best of 7 repeats, per token; arrival and finish are included, amortised
over the request's tokens (64 here).

    python bench/overhead/request_cost.py [--batch 32] [--tokens 64] [--requests 200]

``--arrival``: what uvicorn's ``data_received`` hook costs per request (its first read) with
the kernel's receipt read from ``TCP_INFO`` (one ``getsockopt`` on a real loopback socket,
``tuiprof/collect/socket_arrival.py``) and without it (the read's time only), interleaved
A/B: blocks of each in turn, the median of the blocks' per-call times and the median of the
rounds' differences.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tuiprof  # noqa: E402
from tuiprof import marks  # noqa: E402
from tuiprof.program.transformers_requests import TransformersRequests  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402


class _State:   # what update_batch's diff reads of a transformers RequestState
    __slots__ = ("request_id", "generated_tokens", "status", "max_new_tokens", "error")

    def __init__(self, rid, limit):
        self.request_id, self.generated_tokens, self.status = rid, [], 2
        self.max_new_tokens, self.error = limit, None


class _Future:
    __slots__ = ("state", "query_length")

    def __init__(self, st):
        self.state, self.query_length = st, 1


class _IO:
    def __init__(self):
        self.requests_in_batch = []


class _Proc:    # the batch processor's attributes the hooks read
    def __init__(self):
        self.inputs_and_outputs = _IO()
        self.scheduler = None
        self.cache = None


def api(requests: int, tokens: int) -> float:
    st = SessionStore(requests_keep=256)
    marks._requests = st.requests
    try:
        t0 = time.perf_counter()
        for i in range(requests):
            tuiprof.request_arrived(i, prompt_tokens=16)
            for _ in range(tokens):
                tuiprof.request_token(i)
            tuiprof.request_finished(i, reason="length")
        return (time.perf_counter() - t0) / (requests * tokens)
    finally:
        marks._requests = None


def batching(requests: int, tokens: int, batch: int) -> float:
    st = SessionStore(requests_keep=256)
    src = TransformersRequests(st.requests, time.time_ns)
    proc = _Proc()
    done = 0
    t0 = time.perf_counter()
    while done < requests:
        states = [_State(f"r{done + j}", tokens) for j in range(batch)]
        for s in states:
            src.added(s.request_id, [0] * 16, time.time_ns())
        proc.inputs_and_outputs.requests_in_batch = [_Future(s) for s in states]
        for k in range(tokens):
            seen = src.before_update(proc)
            for s in states:            # what update_batch does to each request
                s.generated_tokens.append(k)
                if len(s.generated_tokens) == tokens:
                    s.status = 3
            src.after_update(seen)
        done += batch
    return (time.perf_counter() - t0) / (done * tokens)


def step_record(steps: int, batch: int) -> float:
    st = SessionStore()
    ids = tuple(f"r{j}" for j in range(batch))
    for rid in ids:
        st.requests.arrived(rid, 16, "api")
    t0 = time.perf_counter()
    for i in range(steps):
        seq = st.begin_token("decode", "eager", i * 1000, i, batch=batch, positions=batch)
        st.set_step_requests(seq, decode=ids, decode_tokens=batch, running=batch)
        st.end_token(seq, i * 1000 + 900, 0.9)
    return (time.perf_counter() - t0) / (steps * batch)


def arrival(rounds: int = 21, calls: int = 5000) -> dict:
    """uvicorn's data_received hook per request, with and without the TCP_INFO read,
    interleaved (the order alternating a round)."""
    import socket  # noqa: PLC0415
    import statistics  # noqa: PLC0415

    from tuiprof.program import transformers_requests as tr  # noqa: PLC0415

    ls = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(ls.getsockname())
    s, _ = ls.accept()
    c.sendall(b"x")

    class Transport:
        def get_extra_info(self, name):
            return s if name == "socket" else None

    class Proto:
        cycle = None

        def __init__(self):
            self.transport = Transport()

    def noop(self, data):
        return None

    with_info = tr.received_hook(noop, time.time_ns)
    real = tr.socket_wait_ns
    times: dict = {"tcp_info": [], "read_only": []}
    try:
        for r in range(rounds):
            for arm in (("tcp_info", "read_only") if r % 2 == 0 else ("read_only", "tcp_info")):
                tr.socket_wait_ns = real if arm == "tcp_info" else (lambda sock: 0)
                p = Proto()
                t0 = time.perf_counter()
                for _ in range(calls):
                    p._tuiprof_first = None          # each call: a new request's first read
                    with_info(p, b"")
                times[arm].append((time.perf_counter() - t0) / calls)
    finally:
        tr.socket_wait_ns = real
        for x in (c, s, ls):
            x.close()
    diffs = [a - b for a, b in zip(times["tcp_info"], times["read_only"])]
    return {"tcp_info_us": statistics.median(times["tcp_info"]) * 1e6,
            "read_only_us": statistics.median(times["read_only"]) * 1e6,
            "difference_us": statistics.median(diffs) * 1e6,
            "difference_spread_us": [min(diffs) * 1e6, max(diffs) * 1e6], "rounds": rounds,
            "calls": calls}


def best(fn, *a) -> float:
    return min(fn(*a) for _ in range(7))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--arrival", action="store_true",
                    help="the request's arrival from TCP_INFO: its cost per request, A/B")
    args = ap.parse_args()
    if args.arrival:
        a = arrival()
        print(f"uvicorn's data_received hook per request ({a['rounds']} interleaved rounds of "
              f"{a['calls']} calls, medians): with the TCP_INFO read {a['tcp_info_us']:.2f} "
              f"µs, the read's time only {a['read_only_us']:.2f} µs; the difference "
              f"{a['difference_us']:.2f} µs (rounds {a['difference_spread_us'][0]:.2f} to "
              f"{a['difference_spread_us'][1]:.2f})")
        return 0
    print(f"{platform.python_implementation()} {platform.python_version()} on "
          f"{platform.machine()}; {args.requests} requests x {args.tokens} tokens, batch "
          f"{args.batch}; best of 7, per output token")
    rows = [("api: tuiprof.request_token per token", best(api, args.requests, args.tokens)),
            ("batching: update_batch hooks per token", best(batching, args.requests,
                                                            args.tokens, args.batch)),
            ("step: the step's request record per token", best(step_record, 512, args.batch))]
    for label, s in rows:
        print(f"{label:<48} {s * 1e6:7.2f} µs")
    total = rows[1][1] + rows[2][1]
    print(f"{'continuous batching in all (batching + step)':<48} {total * 1e6:7.2f} µs")
    ok = max(rows[0][1], total) < 5e-6
    print(f"{'OK' if ok else 'OVER'}: target < 5 µs per token")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
