"""drop_cuda_graphs finds inductor's cudagraph-tree managers on the engine thread whichever way
that thread got them. In the live app the compile worker imports cudagraph_trees first, so the
engine thread's managers sit in inductor's Python thread-local (tuiprof.engine.compile_support.
_own_cudagraph_trees), not in torch's C++ thread-local state; on the H100 the drop then found
nothing, and CUPTI stayed attached. CUDA graphs cannot exist on a CPU: the manager and its nodes
here are stand-ins with the attributes the drop uses; the real ones: tests/gpu/test_detach_gpu.py
and the app on the H100."""
from __future__ import annotations

import threading
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")
trees = pytest.importorskip("torch._inductor.cudagraph_trees")

from tuiprof.engine.compile_support import _own_cudagraph_trees  # noqa: E402
from tuiprof.engine.graphs import drop_cuda_graphs  # noqa: E402


class Node:
    def __init__(self, *children: "Node") -> None:
        self.children = {"f": list(children)} if children else {}
        self.graph = object()
        self.cached_removed = False

    def remove_node_cached_tensors(self) -> None:
        self.cached_removed = True


class Manager:
    def __init__(self, roots: list) -> None:
        self.current_node = roots[0]          # not a CUDAGraphNode: nothing to clear first
        self.roots = defaultdict(list, {"f": roots})
        self.path_state = None


class Container:
    def __init__(self, manager) -> None:
        self.tree_manager = manager


def _on_a_fresh_thread(fn):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)
    return out[0]


def test_graphs_of_a_thread_that_did_not_import_the_trees_first_are_dropped():
    nodes = [Node(), Node()]
    root = Node(*nodes)

    def engine_thread():
        assert not torch._C._is_key_in_tls("tree_manager_containers")
        _own_cudagraph_trees()                # as the engine thread does before recording
        trees.local.tree_manager_containers[0] = Container(Manager([root]))
        return drop_cuda_graphs(), drop_cuda_graphs()

    first, again = _on_a_fresh_thread(engine_thread)
    assert (first, again) == (3, 0)
    assert all(n.graph is None and n.cached_removed for n in [root, *nodes])


def test_a_thread_without_cudagraph_trees_drops_nothing():
    assert _on_a_fresh_thread(drop_cuda_graphs) == 0
