"""A synthetic CUPTI record stream shaped like tests/gpu/native/decode_like.cu on an H100, for
the step detector's tests (tests/analysis/test_period.py, tests/program/test_stream_steps.py).

A host thread launches each step's 26 kernels (an embedding, 2 layers of 11, a norm, the LM
head's GEMV and an argmax) and reads the token back; the GPU runs them in order. What the
detector has to live with, as the H100 run showed it:

- a host gap before each step's first kernel (the token's copy back, the host's turn), of
  ``host_gap_us`` (drawn per step);
- launches a few microseconds apart, so the GPU waits for the first kernels of a step (the
  embedding and norm take 2-3 us) and runs ahead once the GEMVs (40 us; 320 us for the LM head)
  begin; now and then the host thread stalls between two launches (``stall_every`` launches,
  ``stall_us`` long: preemption, a page fault, CUPTI's own work), and the GPU then idles inside
  a step, sometimes longer than the host gap before it;
- kernel times with jitter and occasional outliers; attention that grows with the position;
- record timestamps with jitter, and records reaching the session in buffers of any size, each
  record once it is complete (a kernel's after it ends, an API call's after it returns).
"""
from __future__ import annotations

import random

LAYER = ["rmsnorm", "gemv_small_grid", "rope", "attn_decode", "gemv_small_grid",
         "add_residual", "rmsnorm", "gemv_small_grid", "silu_mul", "gemv_small_grid",
         "add_residual"]
STEP = ["embed"] + LAYER * 2 + ["rmsnorm", "gemv_small_grid", "argmax_token"]     # 26
SETUP = ["fill_weights"] * 8
PREFILL = ["gemm_prefill", "attn_prefill", "gemm_prefill", "attn_prefill", "gemm_prefill",
           "argmax_token"]
US = 1_000
DURATION_US = {"embed": 2.8, "rmsnorm": 2.1, "rope": 1.1, "add_residual": 1.06,
               "silu_mul": 1.28, "argmax_token": 8.3, "fill_weights": 7.7,
               "gemm_prefill": 86.0, "attn_prefill": 1.2}


def _duration(rnd: random.Random, name: str, pos: int, lm_head: bool) -> int:
    if name == "gemv_small_grid":
        us = 320.0 if lm_head else 40.7
    elif name == "attn_decode":
        us = 2.4 + 0.04 * pos
    else:
        us = DURATION_US[name]
    us *= rnd.uniform(0.97, 1.05)
    if rnd.random() < 0.01:
        us *= rnd.uniform(1.5, 3.0)          # an outlier (clocks, a neighbour on the bus)
    return max(1, int(us * US))


def decode_like(steps: int = 512, seed: int = 0, host_gap_us: tuple = (100, 300),
                stall_every: int = 60, stall_us: tuple = (20, 600), stream: int = 7,
                t0: int = 1_000_000_000) -> tuple[list, list[int], int]:
    """Records of a whole run (set-up, a prefill, ``steps`` decode steps) in the order the
    session receives them; returns (records, the first kernel's correlation id of each decode
    step, the prefill's first kernel's correlation id).

    Records are the parser's tuples: ``("K", name, start, end, gx, gy, gz, bx, by, bz, regs,
    smem, stream, corr, graph)``, ``("R", api, start, end, corr)``, ``("C", copy_kind, bytes,
    start, end, stream, corr)``."""
    rnd = random.Random(seed)
    out: list[tuple[int, tuple]] = []          # (when the record is complete, record)
    host = t0
    gpu = t0
    corr = 0
    firsts: list[int] = []

    def jitter(t: int) -> int:
        return t + rnd.randint(-200, 200)      # CUPTI's clock reads, a few hundred ns

    def launch(name: str, pos: int, lm_head: bool = False) -> None:
        nonlocal host, gpu, corr
        if stall_every and rnd.random() < 1 / stall_every:
            host += int(rnd.uniform(*stall_us) * US)
        corr += 1
        api_s, api_e = host, host + int(rnd.uniform(2.0, 3.5) * US)
        out.append((api_e, ("R", "cudaLaunchKernel", jitter(api_s), jitter(api_e), corr)))
        host = api_e + int(rnd.uniform(0.3, 1.5) * US)
        start = max(api_s + int(rnd.uniform(3.0, 5.0) * US), gpu + int(0.6 * US))
        end = start + _duration(rnd, name, pos, lm_head)
        gpu = end
        grid = 8 if name == "gemv_small_grid" else 1
        k = ("K", name, jitter(start), jitter(end), grid, 1, 1, 256, 1, 1, 32, 0, stream, corr,
             0)
        out.append((end + int(rnd.uniform(1, 40) * US), k))

    def read_token() -> None:
        nonlocal host, gpu, corr
        corr += 1
        api_s = host
        c_s = max(host + int(2 * US), gpu + int(1 * US))
        c_e = c_s + int(rnd.uniform(1.8, 2.4) * US)
        gpu = c_e
        api_e = c_e + int(rnd.uniform(2, 6) * US)
        out.append((api_e, ("R", "cudaMemcpy", jitter(api_s), jitter(api_e), corr)))
        out.append((c_e + US, ("C", 2, 4, jitter(c_s), jitter(c_e), stream, corr)))
        host = api_e

    for name in SETUP:
        launch(name, 0)
    host = gpu + 500 * US                     # synchronised, the prompt prepared
    prefill = corr + 1
    for name in PREFILL:
        launch(name, 64)
    read_token()
    for s in range(steps):
        host += int(rnd.uniform(*host_gap_us) * US)
        firsts.append(corr + 1)
        for i, name in enumerate(STEP):
            launch(name, 64 + s, lm_head=i == len(STEP) - 2)
        read_token()
    out.sort(key=lambda x: x[0])
    return [r for _, r in out], firsts, prefill


def chunks(records: list, seed: int = 0, sizes: tuple = (1, 900)) -> list[list]:
    """``records`` cut into buffers of random sizes, in order."""
    rnd = random.Random(seed)
    out, i = [], 0
    while i < len(records):
        n = rnd.randint(*sizes)
        out.append(records[i:i + n])
        i += n
    return out
