"""A scripted server session for the request tests: four requests over six model steps, on a
real SessionStore (the same calls a request source makes), with exact times.

    t (ms)  0 a arrives, 1 b arrives          (a, b queue)
           10 step 0: prefill a, b (16 tokens each)       -> 30: a, b first tokens
           31 c arrives
           32 step 1: prefill c (64 tokens) + decode a, b -> 80: a, b, c tokens (ITL spike)
           81 step 2..4: decode a, b, c (10 ms each)      -> tokens at 91, 101, 111
          111 a, b finish (4 tokens each); c goes on
          112 d arrives and waits (no step takes it)
          120 step 5: decode c                             -> 130; c in flight
"""
from __future__ import annotations

from tuiprof.store import SessionStore

MS = 1_000_000


def serving_store(keep: int = 1024) -> SessionStore:
    st = SessionStore(requests_keep=keep)
    book = st.requests
    book.arrived("a", 16, "api", t=0)
    book.arrived("b", 16, "api", t=1 * MS)

    def step(i, start, end, prefill=(), decode=(), ptok=0, pending=0, kv=(4, 64)):
        seq = st.begin_token("prefill" if prefill else "decode", "eager", start * MS, i,
                             batch=len(prefill) + len(decode), positions=ptok + len(decode))
        st.set_step_requests(seq, prefill=prefill, decode=decode, prefill_tokens=ptok,
                             decode_tokens=len(decode), pending=pending,
                             running=len(prefill) + len(decode), kv_used=kv[0], kv_total=kv[1])
        st.end_token(seq, end * MS, float(end - start))
        for rid in (*prefill, *decode):
            book.tokens(rid, 1, t=end * MS)

    step(0, 10, 30, prefill=("a", "b"), ptok=32)
    book.arrived("c", 64, "api", t=31 * MS)
    step(1, 32, 80, prefill=("c",), decode=("a", "b"), ptok=64)
    for i, s in enumerate((81, 91, 101)):
        step(2 + i, s, s + 10, decode=("a", "b", "c"))
    book.finished("a", "length", t=111 * MS)
    book.finished("b", "length", t=111 * MS)
    book.arrived("d", 8, "api", t=112 * MS)
    step(5, 120, 130, decode=("c",), pending=1)
    return st
