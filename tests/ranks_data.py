"""Two ranks of a tensor-parallel decode as their stores hold them (analysis and export tests).

Real SessionStores fed the records a 2-GPU NCCL run produces (kernel names as CUPTI reports
them), with durations chosen so that the expected figures can be computed by hand."""
from __future__ import annotations

from tuiprof.store import SessionStore
from tuiprof.store.rank_set import RanksView

NCCL = "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE"
GEMV = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
US = 1_000


def _k(name: str, start: int, end: int, corr: int) -> tuple:
    return ("K", name, start, end, 1, 1, 1, 128, 1, 1, 32, 0, 7, corr, 0)


def rank_store(rank: int, steps: int, compute_us: int, comm_us: int, *, t0: int = 10**12,
               step_us: int = 5000, offset_ns: int = 0, end_lag_us: int = 0,
               q_heads: tuple = (0, 8)) -> SessionStore:
    """``steps`` decode steps of ``step_us``: one GEMV of ``compute_us`` then one all-reduce of
    ``comm_us`` (the compute ends where the collective starts: no overlap). ``offset_ns``
    shifts the rank's clock, ``end_lag_us`` makes it finish each step later."""
    st = SessionStore(ring_tokens=64)
    st.meta.update(rank=rank, world_size=2, device_index=rank, device="NVIDIA H200",
                   params=350_000_000, model_params=600_000_000, tp_shard={"q_heads": list(q_heads)},
                   clock_sync=[{"at": "ready", "clock_ns": t0 + offset_ns, "unix_ns": t0}])
    corr = 0
    for i in range(steps):
        start = t0 + offset_ns + i * step_us * US
        seq = st.begin_token("decode", "eager", start, i, 0)
        k0 = start + 100 * US
        corr += 2
        st.add_records([_k(GEMV, k0, k0 + compute_us * US, corr),
                        _k(NCCL, k0 + compute_us * US, k0 + (compute_us + comm_us) * US, corr + 1)])
        end = start + (step_us - 500 + end_lag_us) * US
        st.end_token(seq, end, (end - start) / 1e6, None, 42)
    return st


def two_ranks(**kw) -> RanksView:
    # rank 1 computes more (9 heads); rank 0 waits for it inside the all-reduce
    r0 = rank_store(0, 12, compute_us=1000, comm_us=1500, q_heads=(0, 8), **kw)
    r1 = rank_store(1, 12, compute_us=1600, comm_us=900, q_heads=(8, 17), end_lag_us=30)
    return RanksView((r0.view(), r1.view()), {"world_size": 2})


LAUNCH = "cudaLaunchKernel_v7000"
SYNC = "cudaStreamSynchronize_v3020"


def _api(name: str, start: int, corr: int) -> tuple:
    return ("R", name, start, start + 4 * US, corr)


def simulate_tp(host_us, *, steps: int = 6, calls: int = 4, compute_us=20, transfer_us: int = 30,
                step_gap_us: int = 200, t0: int = 10**12, drop: tuple = (), syncs: tuple = ()):
    """Host-bound tensor-parallel decode steps as CUPTI records them, simulated rank by rank.

    Per call on each rank: the host launches a compute kernel, spends ``host_us[r]`` (a number,
    or a function ``(step, call) -> µs``) before launching the all-reduce; the GPU runs each
    kernel once launched and free (5 µs launch latency). The all-reduce of a call ends on every
    rank ``transfer_us`` after the last rank's kernel starts. ``compute_us[r]``: a rank's
    compute kernel (a number for all). ``drop``: (rank, step, call) whose all-reduce record is
    lost; ``syncs``: (rank, step, call) with a stream synchronisation in the host gap before
    that all-reduce's launch.

    Returns (stores, truth): per rank a SessionStore, and per (step, call) the true
    ``{"starts": [...], "end": ns, "late": rank}``."""
    n = len(host_us)
    host = [h if callable(h) else (lambda s, c, h=h: h) for h in host_us]
    comp = compute_us if isinstance(compute_us, (list, tuple)) else [compute_us] * n
    stores = []
    for r in range(n):
        st = SessionStore(ring_tokens=64)
        st.meta.update(rank=r, world_size=n, device_index=r, device="NVIDIA H100",
                       clock_sync=[{"at": "ready", "clock_ns": t0, "unix_ns": t0}])
        stores.append(st)
    truth = {}
    start = t0
    lat = 5 * US
    for step in range(steps):
        seqs = [st.begin_token("decode", "eager", start, step, 0) for st in stores]
        host_t = [start + 10 * US] * n
        gpu_free = [start] * n
        corr = [step * 1000] * n
        recs: list[list] = [[] for _ in range(n)]
        for c in range(calls):
            starts = []
            for r in range(n):
                corr[r] += 1
                recs[r].append(_api(LAUNCH, host_t[r], corr[r]))
                ks = max(host_t[r] + lat, gpu_free[r])
                ke = ks + comp[r] * US
                recs[r].append(_k(GEMV, ks, ke, corr[r]))
                gap = int(host[r](step, c) * US)
                if (r, step, c) in syncs:
                    recs[r].append(("R", SYNC, host_t[r] + 4 * US + gap // 4,
                                    host_t[r] + 4 * US + gap // 2, 0))
                host_t[r] += 4 * US + gap
                corr[r] += 1
                recs[r].append(_api(LAUNCH, host_t[r], corr[r]))
                starts.append(max(host_t[r] + lat, ke))
                host_t[r] += 4 * US
            end = max(starts) + transfer_us * US
            truth[(step, c)] = {"starts": starts, "end": end, "late": starts.index(max(starts))}
            for r in range(n):
                if (r, step, c) not in drop:
                    recs[r].append(_k(NCCL, starts[r], end, corr[r]))
                gpu_free[r] = end
        stop = max(max(gpu_free), max(host_t)) + 50 * US
        for r, st in enumerate(stores):
            st.add_records(sorted(recs[r], key=lambda x: x[2]))
            st.end_token(seqs[r], stop, (stop - start) / 1e6, None, 1)
        start = stop + step_gap_us * US
    return stores, truth
