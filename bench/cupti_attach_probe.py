"""What CUPTI costs a launch-bound loop by being attached, and whether it can be detached
(``cuptiFinalize``) between bursts and attached again for the next one.

One process, a loop of small eager torch ops (``--launches`` per step, one sync per step: the
shape of eager decode), timed in states that follow each other:

``never``    before libcupti is loaded;
``attached`` callbacks registered, no activity kind on;
``memory``   MEMORY2 on (tuiprof's state between eager bursts);
``traced``   CONCURRENT_KERNEL + MEMORY2 on;
``detached`` every kind off, flushed, ``cuptiFinalize``;
then ``traced`` again (callbacks registered again: do kernel records arrive?) and ``detached``,
in ``--cycles`` cycles so drift shows. Also CUPTI's clock against the host clocks. On the H100::

    python bench/cupti_attach_probe.py --json $OUT/attach.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--launches", type=int, default=1000)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    import torch

    x = torch.randn(64, 64, device="cuda")
    w = torch.randn(64, 64, device="cuda")

    def steps(n: int) -> float:
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            y = x
            for _ in range(a.launches // 2):
                y = torch.nn.functional.silu(y @ w)
            y.sum().item()
            ts.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(ts)

    steps(10)
    res: list[tuple[str, float]] = []
    res.append(("never", steps(a.steps)))
    from cupti import cupti

    from tuiprof.collect.cupti_raw import Layout, NameCache, RawBuffers, find_libcupti, parse_buffer

    got: list[bytes] = []
    K = cupti.ActivityKind
    clocks = []
    for _ in range(3):
        c = cupti.get_timestamp()
        clocks.append({"cupti": c, "time_ns": time.time_ns(), "monotonic_ns": time.monotonic_ns(),
                       "raw_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)})
    kernels_seen = []

    def attach() -> None:
        cupti.get_timestamp()
        rb = RawBuffers(8 << 20, got.append)
        rb.register(find_libcupti())
        attach.rb = rb  # keep the callbacks alive

    def kernels_in(buffers: list[bytes]) -> int:
        lay, names = Layout(), NameCache()
        return sum(1 for b in buffers for r in parse_buffer(b, lay, names) if r[0] == "K")

    attach()
    res.append(("attached", steps(a.steps)))
    cupti.activity_enable(K.MEMORY2)
    res.append(("memory", steps(a.steps)))
    for cycle in range(a.cycles):
        if cycle:
            try:
                attach()
                cupti.activity_enable(K.MEMORY2)
            except Exception as exc:  # noqa: BLE001
                res.append((f"re-attach failed: {exc}", 0.0))
                break
        got.clear()
        cupti.activity_enable(K.CONCURRENT_KERNEL)
        t_traced = steps(a.steps)
        cupti.activity_disable(K.CONCURRENT_KERNEL)
        cupti.activity_flush_all(1)
        kernels_seen.append(kernels_in(got))
        res.append((f"traced {cycle}", t_traced))
        res.append((f"memory {cycle}", steps(a.steps)))
        cupti.activity_disable(K.MEMORY2)
        cupti.activity_flush_all(1)
        t0 = time.perf_counter()
        cupti.finalize()
        fin_ms = 1e3 * (time.perf_counter() - t0)
        res.append((f"detached {cycle} (finalize {fin_ms:.1f} ms)", steps(a.steps)))
        t0 = time.perf_counter()
        ts = cupti.get_timestamp()
        res.append((f"detached {cycle} after get_timestamp ({1e6 * (time.perf_counter() - t0):.0f} µs)",
                    steps(a.steps)))
        clocks.append({"cupti": ts, "time_ns": time.time_ns(), "monotonic_ns": time.monotonic_ns(),
                       "raw_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW), "after": cycle})
    res.append(("end, never-like?", steps(a.steps)))
    base = res[0][1]
    print(f"# {a.launches} launches a step, median ms/step of {a.steps} steps")
    for name, ms in res:
        print(f"{name:45s} {ms:8.3f} ms  {ms / base if base else 0:6.3f}")
    print("kernel records per traced phase:", kernels_seen, "expected ~", a.launches * a.steps)
    for c in clocks:
        print("clock cupti-time_ns", c["cupti"] - c["time_ns"], "cupti-monotonic",
              c["cupti"] - c["monotonic_ns"], "cupti-raw", c["cupti"] - c["raw_ns"])
    if a.json:
        Path(a.json).write_text(json.dumps({"states": res, "kernels": kernels_seen,
                                            "clocks": clocks}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
