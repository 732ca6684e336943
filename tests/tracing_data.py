"""A compiled session with traced and untraced steps, built in a real store: what a GPU session
with CUPTI finalized between its bursts stores (the numbers are chosen, not measured).

Untraced steps (CUPTI detached: ``attached=False``, ``sampled=False``) take ``untraced_ms`` of
wall time and ``untraced_gpu`` by their CUDA events; a burst's traced steps (``attached=True``,
``sampled=True``) take ``traced_ms`` / ``traced_gpu`` and carry kernel records: ``kernels``
kernels a step, half of them 2 µs (``tiny_elementwise``), half ``gemv_us`` (``gemv_bf16``), every
one launched from a CUDA graph, back to back. One step before the burst is attached but not
traced (the attach lead), as in a live session: it is on neither side.
"""
from __future__ import annotations

from tuiprof.store import SessionStore

TINY_US = 2.0


def traced_store(untraced: int = 40, traced: int = 4, untraced_ms: float = 2.74,
                 traced_ms: float = 3.20, untraced_gpu: float = 2.60, traced_gpu: float = 3.10,
                 kernels: int = 100, gemv_us: float = 28.0, after: int = 8) -> SessionStore:
    store = SessionStore(ring_tokens=16, series_len=512,
                         meta={"device": "cuda:0", "mode": "compiled", "batch": 1})
    t = 1_000_000_000_000
    step = 0
    corr = 1

    def one(attached, sampled, wall, gpu, records):
        nonlocal t, step, corr
        seq = store.begin_token("decode", "compiled", t, step, sampled=sampled,
                                attached=attached)
        if records:
            recs = []
            k0 = t + 100_000
            for i in range(kernels):
                tiny = i % 2 == 0
                dur = int((TINY_US if tiny else gemv_us) * 1000)
                name = "tiny_elementwise" if tiny else "gemv_bf16"
                recs.append(("K", name, k0, k0 + dur, 1, 1, 1, 128, 1, 1, 32, 0, 7, corr, 3))
                k0 += dur + 500
            corr += 1
            store.add_records(recs)
        end = t + int(wall * 1e6)
        store.end_token(seq, end, wall, gpu)
        t = end + 1000
        step += 1

    for _ in range(untraced):
        one(False, False, untraced_ms, untraced_gpu, False)
    one(True, False, traced_ms, traced_gpu, False)       # the attach lead: on neither side
    for _ in range(traced):
        one(True, True, traced_ms, traced_gpu, True)
    for _ in range(after):
        one(False, False, untraced_ms, untraced_gpu, False)
    return store
