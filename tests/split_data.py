"""Steps whose kernels were launched inside and outside a model-forward window, as CUPTI
records in the layout of ``tuiprof.store.records`` (the raw-buffer parser's and the H100
recordings' fields): for the store's split by launch and the panes that show it."""
from __future__ import annotations

from tuiprof.store import SessionStore

US = 1000
STEP = 1000 * US   # a step every millisecond of host time
FILL = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"


def kernel(name: str, start: int, dur: int, corr: int, graph: int = 0) -> tuple:
    return ("K", name, start, start + dur, 1, 1, 1, 128, 1, 1, 32, 0, 7, corr, graph)


def api(name: str, start: int, corr: int) -> tuple:
    return ("R", name, start, start + 2 * US, corr)


def window(i: int) -> tuple[int, int]:
    """Step ``i``'s model window: 90 to 650 µs into the step."""
    return i * STEP + 90 * US, i * STEP + 650 * US


def records(i: int, corr0: int, model_kernels: int, loop_kernels: int,
            model_name: str = "gemv", loop_name: str = "fill") -> tuple[list, list]:
    """Launch (API) and kernel records of step ``i``: ``model_kernels`` launched 100 µs into
    the step and on (4 µs each), ``loop_kernels`` from 700 µs on (11 µs each)."""
    t0 = i * STEP
    apis, kernels = [], []
    for k in range(model_kernels):
        t = t0 + 100 * US + k * 10 * US
        apis.append(api("cudaLaunchKernel", t, corr0 + k))
        kernels.append(kernel(model_name, t + 5 * US, 4 * US, corr0 + k))
    for k in range(loop_kernels):
        t = t0 + 700 * US + k * 20 * US
        corr = corr0 + model_kernels + k
        apis.append(api("cudaLaunchKernel", t, corr))
        kernels.append(kernel(loop_name, t + 5 * US, 11 * US, corr))
    return apis, kernels


def split_store(steps: int = 6, model_kernels: int = 20, loop_kernels: int = 20,
                mode: str = "compiled", meta: dict | None = None, **names) -> SessionStore:
    """A store of ``steps`` traced decode steps, each with its model window and records."""
    store = SessionStore(ring_tokens=8, meta=meta or {"source": "program",
                                                        "step_source": "transformers",
                                                        "model": "m", "device": "cuda"})
    store.set_collector("cupti", True, "CUPTI: kernels")
    corr = 1
    for i in range(steps):
        seq = store.begin_token("decode", mode, i * STEP, i, model=window(i))
        apis, kernels = records(i, corr, model_kernels, loop_kernels, **names)
        corr += model_kernels + loop_kernels
        store.add_records(apis + kernels)
        store.end_token(seq, i * STEP + 900 * US, 0.9)
    return store
