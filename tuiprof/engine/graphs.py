"""Dropping the CUDA graphs that torch.compile recorded, keeping what it compiled.

A CUPTI finalized while CUDA graphs it saw are still replayed kills the next replay
("unspecified launch failure" on the H100, driver 580, whether the graphs were recorded under
CUPTI or only replayed under it: docs/gpu-verification.md §30, §32). Graphs recorded after the
finalize replay cleanly. So a collector that detaches CUPTI between bursts drops the graphs
first: inductor's cudagraph trees then record new ones at the compiled functions' next calls
(tens of milliseconds; no recompile).
"""
from __future__ import annotations

from collections import defaultdict


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
    # tuiprof.engine.generate._own_cudagraph_trees for the other threads)
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
