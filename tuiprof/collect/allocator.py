"""PyTorch caching-allocator statistics, read after each token.

``num_device_alloc``/``num_device_free`` count real cudaMalloc/cudaFree calls made by the
caching allocator; ``allocation_all_allocated`` counts allocation requests served. It is read
every ``every`` tokens (every eager token by default; the cost is measured in
bench/overhead/overhead.py), from ``torch.cuda.memory_stats_as_nested_dict``:
``torch.cuda.memory_stats`` is the same dict flattened into ~200 dotted keys and sorted, which
is most of its cost and runs on the program's thread between two steps.
"""
from __future__ import annotations

import sys

FIELDS = {  # our name: the key in torch.cuda.memory_stats (its nested dict's path, dotted)
    "num_device_alloc": "num_device_alloc",
    "num_device_free": "num_device_free",
    "allocation_all_allocated": "allocation.all.allocated",
    "active_bytes": "active_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
}
_PATHS = tuple((k, tuple(v.split("."))) for k, v in FIELDS.items())


def pick(nested: dict) -> dict:
    """FIELDS out of ``memory_stats_as_nested_dict``'s answer (0 where a level is missing)."""
    out = {}
    for name, path in _PATHS:
        v = nested
        for part in path:
            v = v.get(part, 0) if isinstance(v, dict) else 0
        out[name] = int(v) if isinstance(v, int) else 0
    return out


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
    return pick(torch.cuda.memory_stats_as_nested_dict(device))
