"""Measure the device's peaks at start-up (``--measure-peaks``) for the roofline.

Bandwidth: a device-to-device copy (bytes read + bytes written over the best time);
compute: a large matmul in the session's dtype (2·n³ over the best time). The roofline
(:func:`tuiprof.analysis.gpu_spec`) prefers these to its table of known GPUs.
"""
from __future__ import annotations

import time


def measure_peaks(device: str = "cuda", copy_mib: int = 1024, n: int = 8192,
                  repeats: int = 5, dtype: str | None = None) -> dict:
    """Best-of-``repeats`` copy bandwidth (B/s) and matmul rate (FLOP/s) on ``device``."""
    import torch  # noqa: PLC0415

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    dt = getattr(torch, dtype) if dtype else (torch.bfloat16 if cuda else torch.float32)

    def best(fn) -> float:
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return min(times)

    nbytes = copy_mib * 1024 * 1024
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    t_copy = best(lambda: dst.copy_(src))
    del src, dst
    a = torch.randn(n, n, dtype=dt, device=dev)
    b = torch.randn(n, n, dtype=dt, device=dev)
    t_mm = best(lambda: torch.mm(a, b))
    del a, b
    if cuda:
        torch.cuda.empty_cache()
    return {"bandwidth_Bps": 2.0 * nbytes / t_copy, "bf16_flops": 2.0 * n ** 3 / t_mm,
            "method": f"copy of {copy_mib} MiB and a {n}x{n} {str(dt).split('.')[-1]} matmul, "
                      f"best of {repeats} on {dev.type}"}
