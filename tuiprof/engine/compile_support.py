"""What the engine's compiles use around ``torch.compile``: the compiled decode step every engine
on one adapter shares, a compile job on its worker thread, inductor's gate that lets dynamo trace
while a helper process compiles, the cache and time counters a compile reports, and an eager
step run beside a compile (:func:`beside_compile`).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

COMPILE_SWITCH_INTERVAL_S = 2e-5  # the GIL switch interval while a compile runs beside decoding


@dataclass
class CompiledStep:
    """``torch.compile`` of the adapter's decode step, shared by every engine on the adapter.

    A first compile at a batch >= 2 marks the batch dimension dynamic: every batch >= 2 then
    reuses that graph (CUDA graph trees still record one graph per batch size). Batch 1 gets a
    static graph of its own (dynamo specialises size 1). ``batches``: those already run."""

    dynamo: Callable                            # torch.compile's function
    batches: set = field(default_factory=set)
    order: list = field(default_factory=list)   # the batches in the order they were compiled
    # a graph ("b1", "dyn": precompiled.graph_of) -> its step compiled ahead of time, loaded
    # from the cache or saved there (tuiprof/engine/precompiled.py)
    aot: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)   # one line each: what the saved steps did

    @property
    def fn(self) -> Callable:
        """What the engine calls: dynamo's function, or, once a graph was compiled ahead of
        time, a step that takes that graph's function for its batch (dynamo's for the rest)."""
        aot = self.aot
        if not aot:
            return self.dynamo
        dynamo = self.dynamo

        def step(*args: Any) -> Any:
            f = aot.get("b1" if args[0].shape[0] == 1 else "dyn")
            return (f or dynamo)(*args)
        return step

    def add(self, batch: int) -> None:
        if batch not in self.batches:
            self.batches.add(batch)
            self.order.append(batch)


@dataclass
class _CompileJob:
    """A compile for ``batch`` on a worker thread (its first call on a cache of that batch)."""

    batch: int
    cache: Any
    thread: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    t0: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0
    helper: Any = None              # a CompileHelper filling the cache first, if one runs
    helper_s: float | None = None   # how long it took (None: no helper)
    helper_note: str = ""           # one line when it failed (the compile goes on here)
    helper_done: threading.Event = field(default_factory=threading.Event)
    parts: dict = field(default_factory=dict)  # seconds in dynamo and inductor (_compile_times)
    gated_s: float = 0.0            # inductor's part spent waiting for the helper (overlap)
    saved_step: str = ""            # "loaded" / "saved": the graph's step kept across sessions
    notes: list = field(default_factory=list)   # one line each from the saved steps
    noted: bool = False
    cancelled: bool = False

    def cancel(self) -> None:
        """The session stops: end the helper; a compile in this process cannot be stopped."""
        self.cancelled = True
        helper = self.helper
        if helper is not None:
            helper.stop()


OVERLAP_ENV = "TUIPROF_COMPILE_OVERLAP"
_gate = threading.local()
_gate_installed = False
_gate_lock = threading.Lock()


def _warm_foreground() -> bool:
    """A compile whose graphs are all cached runs with decoding paused
    (``TUIPROF_WARM_COMPILE=beside``: beside decoding, like a cold one)."""
    import os

    return os.environ.get("TUIPROF_WARM_COMPILE", "foreground").strip().lower() != "beside"


def compile_overlap() -> bool:
    """Trace here while the helper compiles (``TUIPROF_COMPILE_OVERLAP=0``: wait for the helper
    first, then compile here from start to end)."""
    import os

    return os.environ.get(OVERLAP_ENV, "1").strip().lower() not in ("0", "off", "no", "false")


class _Once:
    """``fn()`` once; later calls return at once (graph breaks reach inductor more than once)."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn, self.called = fn, False

    def __call__(self) -> None:
        if not self.called:
            self.called = True
            self.fn()


class _inductor_gate:
    """While active on this thread, inductor's compile of each graph dynamo hands it first calls
    ``wait()``: dynamo's trace goes on here while the helper fills the cache, and inductor
    then finds the graph in it. Inductor's backend object is wrapped once per process, by its
    ``__call__``; on every other thread, and here outside the block, it is unchanged."""

    def __init__(self, wait: Callable[[], None]) -> None:
        self.wait = wait

    def __enter__(self) -> None:
        _install_gate()
        _gate.wait = self.wait

    def __exit__(self, *exc: Any) -> None:
        _gate.wait = None


def _install_gate() -> None:
    global _gate_installed
    with _gate_lock:
        if _gate_installed:
            return
        wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
        original = getattr(wrapper, "__call__", None)
        if original is None:
            return

        def gated(self, *args: Any, **kwargs: Any) -> Any:
            wait = getattr(_gate, "wait", None)
            if wait is not None:
                wait()
            return original(self, *args, **kwargs)

        wrapper.__call__ = gated
        _gate_installed = True


def _cache_counters() -> dict:
    """Inductor's FX-graph and AOT-autograd cache hits and misses so far in this process."""
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return {}
    return {"fxgraph_hit": counters["inductor"]["fxgraph_cache_hit"],
            "fxgraph_miss": counters["inductor"]["fxgraph_cache_miss"],
            "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
            "aot_miss": counters["aot_autograd"]["autograd_cache_miss"]}


# dynamo's own metrics (seconds, summed over calls) that say where a compile's time went
COMPILE_TIMES = {"bytecode_tracing": "dynamo", "OutputGraph.call_user_compiler": "inductor"}


def _compile_times() -> dict:
    """Seconds dynamo spent tracing and in its backend (inductor, or its caches) so far in this
    process (``torch._dynamo.utils.compilation_time_metrics``; empty where torch lacks it)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics as metrics
    except Exception:
        return {}
    return {key: float(sum(metrics.get(key, ()))) for key in COMPILE_TIMES}


def _took(job: _CompileJob, graphs_s: float | None = None, graphs: str = "") -> str:
    """How long from the job's start to compiled mode and where it went: ``compiled in 9.8 s
    (dynamo 3.1 s, inductor 1.2 s, CUDA graphs 1.0 s, 4.5 s in a helper process)``. The parts
    are this process's (inductor's less its wait for the helper); the helper's compile overlaps
    them, and the rest is the compiled step's first run, waiting and Python around them."""
    total = job.seconds + (graphs_s or 0.0)
    own = dict(job.parts)
    if "OutputGraph.call_user_compiler" in own:  # less the wait for the helper inside it
        own["OutputGraph.call_user_compiler"] -= job.gated_s
    parts = [f"{name} {own[key]:.1f} s" for key, name in COMPILE_TIMES.items()
             if own.get(key, 0.0) >= 0.05]
    if graphs_s is not None and graphs_s >= 0.05:
        parts.append(f"{graphs} {graphs_s:.1f} s")
    if job.helper_s is not None and not job.helper_note:
        parts.append(f"{job.helper_s:.1f} s in a helper process")
    if job.saved_step:
        parts.append("saved step loaded" if job.saved_step == "loaded"
                     else "step saved for the next session")
    return f"{total:.1f} s" + (f" ({', '.join(parts)})" if parts else "")


def _release_memory(cuda: bool) -> None:
    import gc

    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


class _no_cudagraphs:
    """Run compiled code without recording CUDA graphs (the compile worker's first call): CUDA
    graph trees bind to the thread that records them, and the engine thread records its own.
    ``cudagraph_capture_sizes=()`` is inductor's switch for "record no shape"."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self._patch = None

    def __enter__(self) -> None:
        if self.cuda:
            import torch._inductor.config as inductor_config

            self._patch = inductor_config.patch({"triton.cudagraph_capture_sizes": ()})
            self._patch.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._patch is not None:
            self._patch.__exit__(*exc)


FX_PATCHED = "module is not installed as a submodule"
FX_RETRY_S = 10.0


def beside_compile(fn: Callable, *args: Any, rewind: Callable[[], None] | None = None) -> Any:
    """``fn(*args)`` on the engine thread while a compile runs on the worker.

    torch.fx's symbolic tracer (inductor traces its pattern-matcher replacements with it on a
    process's first compile) patches ``nn.Module.__call__`` for every thread while it traces:
    an eager forward on this thread then fails with fx's NameError (seen on an H100 with
    qwen3-0.6b). The patch lasts milliseconds; the forward is repeated once it is gone, after
    ``rewind``: the layers that ran before the failure have written their K/V (the same values
    again) but, with a cache that counts its own write position (transformers' ``StaticLayer``),
    also moved their counter on; without the rewind the repeat wrote one slot further and the
    cycle's last step ran past the cache. Its token is selected after the forward returns."""
    deadline = time.monotonic() + FX_RETRY_S
    while True:
        try:
            return fn(*args)
        except NameError as exc:
            if FX_PATCHED not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.002)
            if rewind is not None:
                rewind()


def _own_cudagraph_trees() -> None:
    """Let this thread record and replay CUDA graph trees.

    Their managers live in a thread-local that inductor sets up only for the thread that first
    imports ``cudagraph_trees`` (and for autograd's threads); any other thread fails an
    assertion when it first records. The engine thread is the one that records (the compile
    worker only compiles), so it gets that thread-local here when another thread (an earlier
    engine, a sweep on the main thread) imported the module first."""
    try:
        from torch._inductor import cudagraph_trees as trees
    except Exception:  # pragma: no cover - a torch without inductor
        return
    local = getattr(trees, "local", None)
    if local is None or hasattr(local, "tree_manager_containers"):
        return
    try:
        if torch._C._is_key_in_tls("tree_manager_containers"):
            return
    except Exception:
        pass
    import collections

    local.tree_manager_containers = {}
    local.tree_manager_locks = collections.defaultdict(threading.Lock)
