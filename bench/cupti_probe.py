"""Where does CUPTI record handling cost time? A probe run on the GPU machine.

Runs an eager decode-like workload (many small kernels per step, like Qwen3 eager decode) and
measures whole-run wall time per step for: no CUPTI; CUPTI with a callback that ignores the
records (cupti-python's own per-record cost); the tuple-building callback; tuple building plus
folding into the store. Also reports which runtime/driver API records arrive when only
per-callback-id enables are used, with and without the RUNTIME/DRIVER kinds.
"""
from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from cupti import cupti  # noqa: E402

from tuiprof.collect.cupti_collector import CuptiCollector  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402

N_KERNELS = 1800


def step(x: torch.Tensor, w: torch.Tensor) -> int:
    for _ in range(N_KERNELS // 3):
        x = torch.nn.functional.silu(x @ w) * 1.0001 + 0.0001
    return int(x.argmax().item())


def run_steps(n: int, x, w) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        step(x, w)
    return (time.perf_counter() - t) * 1e3 / n


def main() -> None:
    raw = "--objects" not in sys.argv
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) / 32
    for _ in range(3):
        step(x, w)
    store = SessionStore(ring_tokens=4)
    col = CuptiCollector(store, api=False, memory=False, raw=raw)
    col.start()
    col._set_device_kinds(False)
    if raw:
        configs = {"bare": None, "raw: copy only": "copy", "raw: copy+parse": "parse",
                   "raw: copy+parse+fold": "fold"}
    else:
        configs = {"bare": None, "cupti-python: no-op callback": "noop",
                   "cupti-python: tuples": "tuples", "cupti-python: tuples+fold": "fold"}
    results: dict[str, list[float]] = {k: [] for k in configs}
    orig_store_add = store.add_records
    orig_impl = col._buffer_completed_impl

    def set_mode(m):
        store.add_records = orig_store_add if m == "fold" else (lambda recs: None)
        if raw:
            col._rawbufs.sink = (lambda data: None) if m == "copy" else col._queue_raw
        else:
            col._buffer_completed_impl = (lambda acts: None) if m == "noop" else orig_impl

    for rnd in range(5):
        for cfg, m in configs.items():
            col._set_device_kinds(m is not None)
            if m:
                set_mode(m)
            t = time.perf_counter()
            run_steps(20, x, w)
            if m:
                cupti.activity_flush_all(1)
                col._drain()
            results[cfg].append((time.perf_counter() - t) * 1e3 / 20)
    col._set_device_kinds(False)
    set_mode("fold")
    base = statistics.median(results["bare"])
    print("\n| configuration | ms/step (median of 5) | ratio to bare |")
    print("|---|---|---|")
    for cfg, vals in results.items():
        print(f"| {cfg} | {statistics.median(vals):.2f} | {statistics.median(vals) / base:.2f} |")
    print(f"records folded: {store.view().counters['records']}, buffers {col.buffers}, "
          f"callback {col.callback_s:.3f}s, parse+fold {col.fold_s:.3f}s")
    if raw:
        s2 = SessionStore(ring_tokens=4)
        col.store = s2
        col.api = True
        col._enable_api_subset()
        col._set_device_kinds(True)
        run_steps(2, x, w)
        cupti.activity_flush_all(1)
        col._drain()
        v = s2.view()
        print(f"API records (kinds on, other ids off): {dict(sorted((k, s.count) for k, s in v.api.items()))}")
        print(f"kernels in those 2 steps: {v.counters['kernels']}")
    col.stop()


if __name__ == "__main__":
    main()
