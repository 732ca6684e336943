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
