"""PyTorch caching-allocator statistics, read after each token.

``num_device_alloc``/``num_device_free`` count real cudaMalloc/cudaFree calls made by the
caching allocator; ``allocation_all_allocated`` counts allocation requests served. Reading
``torch.cuda.memory_stats`` builds a dict of ~150 entries, so it is read every
``every`` tokens (1 by default; the cost is measured in bench/overhead/overhead.py).
"""
from __future__ import annotations

import sys

FIELDS = {
    "num_device_alloc": "num_device_alloc",
    "num_device_free": "num_device_free",
    "allocation_all_allocated": "allocation.all.allocated",
    "active_bytes": "active_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
}


def read_allocator_stats(device: int | None = None) -> dict | None:
    """The caching allocator's counters for ``device`` (None: the calling thread's current
    device, which is the engine's: a tensor-parallel rank's own GPU), or None without CUDA in use.

    Never imports torch nor initialises CUDA itself: a profiled program may not use either.
    """
    torch = sys.modules.get("torch")
    try:  # the program may be importing torch on another thread right now
        if torch is None or not torch.cuda.is_initialized():
            return None
    except (AttributeError, ImportError):
        return None
    stats = torch.cuda.memory_stats(device)
    return {k: int(stats.get(v, 0)) for k, v in FIELDS.items()}
