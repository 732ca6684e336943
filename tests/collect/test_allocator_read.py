"""The allocator counters are read from torch's nested dict, not its flattened copy: the same
values ``torch.cuda.memory_stats`` gives, at a fraction of the cost on the program's thread."""
from __future__ import annotations

import torch

from tuiprof.collect import allocator


def _nested() -> dict:  # the shape torch's C++ side returns (keys as in torch 2.x)
    def pools(n):
        return {p: {"current": n, "peak": n + 1, "allocated": n + 2, "freed": n + 3}
                for p in ("all", "large_pool", "small_pool")}
    return {"allocation": pools(11), "active_bytes": pools(4096), "reserved_bytes": pools(8192),
            "allocated_bytes": pools(2048), "segment": pools(3), "num_device_alloc": 7,
            "num_device_free": 5, "num_alloc_retries": 0, "max_split_size": -1,
            "reserved_bytes_by_private_pools": {(0, 1): pools(64)}}


def test_the_nested_read_equals_torchs_flattened_stats(monkeypatch):
    nested = _nested()
    # torch.cuda.memory_stats flattens whatever memory_stats_as_nested_dict answers
    monkeypatch.setattr(torch.cuda.memory, "memory_stats_as_nested_dict", lambda device=None: nested)
    flat = torch.cuda.memory.memory_stats()
    want = {k: int(flat.get(v, 0)) for k, v in allocator.FIELDS.items()}
    assert allocator.pick(nested) == want
    assert want == {"num_device_alloc": 7, "num_device_free": 5, "allocation_all_allocated": 13,
                    "active_bytes": 4096, "reserved_bytes": 8192}


def test_a_missing_level_reads_zero():
    assert allocator.pick({"allocation": {"all": {}}, "num_device_alloc": 2}) == {
        "num_device_alloc": 2, "num_device_free": 0, "allocation_all_allocated": 0,
        "active_bytes": 0, "reserved_bytes": 0}


def test_no_cuda_in_use_reads_none():
    assert allocator.read_allocator_stats() is None
