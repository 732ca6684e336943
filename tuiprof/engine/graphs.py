"""Dropping the CUDA graphs that torch.compile recorded, keeping what it compiled.

A CUPTI finalized while CUDA graphs it saw are still replayed kills the next replay
("unspecified launch failure" on the H100, driver 580, whether the graphs were recorded under
CUPTI or only replayed under it: docs/performance.md#cupti-and-cuda-graphs). Graphs recorded after the
finalize replay cleanly. So a collector that detaches CUPTI between bursts drops the graphs
first: inductor's cudagraph trees then record new ones at the compiled functions' next calls
(tens of milliseconds; no recompile).

A user's program may record CUDA graphs of its own (``torch.cuda.graph``,
``make_graphed_callables``, transformers' continuous batching), which nobody can drop and
record again: :class:`GraphCaptures` watches every capture so that a session keeps CUPTI
attached once such a graph exists. A rank of a distributed job drops inductor's trees as one
process does: every rank drops at the same step, since their bursts fall on the same steps, and
records its graphs again beside its peers, who are recording theirs. On two H100s a compiled
TP job (transformers' compiled decode, NCCL's all-reduces inside the graphs) decoded the same
tokens as without tuiprof and detached 4 times a rank without a fault
(docs/results.md, "Processes"). ``TUIPROF_RANK_GRAPHS=keep`` keeps a rank that recorded
graphs attached instead, as before.
"""
from __future__ import annotations

import os
import sys
import threading
from collections import defaultdict
from typing import Any


def drop_cuda_graphs() -> int:
    """Free every CUDA graph that inductor's cudagraph trees recorded *on this thread* (their
    managers are thread-local: call it on the thread that decodes, at a step boundary); returns
    how many. Uses inductor internals (torch 2.11-2.13)."""
    import sys

    if "torch._inductor.cudagraph_trees" not in sys.modules:
        return 0
    import torch
    from torch._inductor import cudagraph_trees as trees

    # the managers are in inductor's thread-local, or in torch's C++ thread-local state where
    # inductor stashed them (the thread that imported cudagraph_trees first; see
    # tuiprof.engine.compile_support._own_cudagraph_trees for the other threads)
    if not (hasattr(trees.local, "tree_manager_containers")
            or torch._C._is_key_in_tls("tree_manager_containers")):
        return 0
    dropped = 0
    for container in trees.get_obj(trees.local, "tree_manager_containers").values():
        manager = container.tree_manager
        if manager is None:
            continue
        if isinstance(manager.current_node, trees.CUDAGraphNode):
            manager.clear_current_path_state_and_set_to_none()
        manager.current_node = None
        nodes = [node for roots in manager.roots.values() for node in roots]
        while nodes:
            node = nodes.pop()
            for children in node.children.values():
                nodes.extend(children)
            node.remove_node_cached_tensors()
            node.graph = None  # the graph and its executable are destroyed here
            dropped += 1
        manager.roots = defaultdict(list)
        manager.path_state = trees.ExecutionState.NONE
    if dropped and torch.cuda.is_available():
        torch.cuda.synchronize()
    return dropped


INDUCTOR_TREES = "cudagraph_trees.py"
RANK_GRAPHS_ENV = "TUIPROF_RANK_GRAPHS"  # "keep": a rank that recorded graphs stays attached


class GraphCaptures:
    """Watches ``torch.cuda.CUDAGraph.capture_begin`` while installed: which threads recorded
    graphs through inductor's cudagraph trees (:func:`drop_cuda_graphs` can drop them, on that
    thread), and whether any graph was recorded otherwise (nothing can drop it). A capture is
    rare (once per graph), so looking at its caller's frames costs nothing that matters."""

    def __init__(self) -> None:
        self.tree_threads: set[int] = set()
        self.foreign = 0                   # captures outside inductor's cudagraph trees
        self.captures = 0                  # every capture seen, wherever it came from
        self._asked: tuple[int, int] | None = None   # (captures, thread) of the last answer
        self._answer = ""
        self._restore: tuple[Any, Any] | None = None

    def install(self) -> None:
        from torch.cuda.graphs import CUDAGraph as cls  # noqa: PLC0415

        if self._restore is not None or "capture_begin" not in cls.__dict__:
            return
        orig = cls.__dict__["capture_begin"]
        watcher = self

        def capture_begin(graph, *args, **kwargs):
            watcher.seen(sys._getframe(1))
            return orig(graph, *args, **kwargs)

        capture_begin.__wrapped__ = orig
        capture_begin.__doc__ = orig.__doc__
        self._restore = (cls, orig)
        cls.capture_begin = capture_begin

    def uninstall(self) -> None:
        if self._restore is not None:
            cls, orig = self._restore
            cls.capture_begin = orig
            self._restore = None

    def seen(self, frame: Any) -> None:
        """A capture begins, called from ``frame``: inductor's trees or the program's own."""
        self.captures += 1
        for _ in range(6):
            if frame is None:
                break
            if frame.f_code.co_filename.endswith(INDUCTOR_TREES):
                self.tree_threads.add(threading.get_ident())
                return
            frame = frame.f_back
        self.foreign += 1

    def undroppable(self) -> str:
        """Why CUPTI must stay attached on this thread ("" if it need not): a graph that
        :func:`drop_cuda_graphs`, called here, would not drop. Asked at every step: the
        answer is kept until a capture or another thread asks."""
        key = (self.captures, threading.get_ident())
        if key != self._asked:
            self._asked, self._answer = key, self._why()
        return self._answer

    def _why(self) -> str:
        if self.foreign:
            return "the program records CUDA graphs of its own"
        if (self.captures and os.environ.get(RANK_GRAPHS_ENV, "").strip().lower() == "keep"
                and in_distributed_job()):
            return "a rank of a distributed job records CUDA graphs"
        if self.tree_threads - {threading.get_ident()}:
            return "torch.compile recorded CUDA graphs on another thread"
        return ""


def in_distributed_job() -> bool:
    """This process is a rank of a job of two or more: torchrun's environment, or a process
    group it joined (``mp.spawn`` workers that pass their rank themselves)."""
    from .distributed import RankInfo  # noqa: PLC0415 - no torch at import

    try:
        info = RankInfo.from_env()
    except Exception:  # RANK set to something else than a number: the process group says
        info = None
    if info is not None and info.world_size > 1:
        return True
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized()
                    and dist.get_world_size() > 1)
    except Exception:  # a half-initialized module: not a job as far as anyone can tell
        return False
