"""What a CUPTI memory record (MEMORY2) is: a true device cudaMalloc/cudaFree, or the rest.

CUPTI reports every allocation the CUDA stack makes, not only the device cudaMalloc a user
thinks of: pinned host buffers (cudaHostAlloc for copies), stream-ordered pool allocations
(cudaMallocAsync, CUDA graphs' memory nodes), CUPTI's own buffers. The store counts each record
under a class (memory kind × library × API) per phase, and counts true device
cudaMalloc/cudaFree (device memory, synchronous, no pool) separately; these pure functions
decide which is which. Records from recordings made before the detail fields existed (6 fields)
carry only the memory kind: their device records are counted as cudaMalloc (as before) and
their class says the detail is missing.
"""
from __future__ import annotations

import os

from .records import (A_ASYNC, A_LEN, A_LIB, A_MEMKIND, A_POOL, LIB_OTHER, LIB_UNKNOWN,
                      LIBRARIES, LIBRARY_FILES, MEMKIND_DEVICE, MEMKIND_NAMES, POOL_INVALID)

MAX_CLASSES = 256          # bound on distinct (phase, class) counters in the store
OVERFLOW = ("other classes", "other", "other")
NO_DETAIL = "device (no detail)"   # an old recording: sync/pool unknown
DEVICE_MALLOC = "device cudaMalloc"
DEVICE_POOL = "device pool"        # stream-ordered (cudaMallocAsync, graph memory nodes)
API_UNKNOWN = "API unknown"


def library_code(path: str | None) -> int:
    """Index into ``LIBRARIES`` for the shared object at ``path`` (a file name or a full path)."""
    if not path:
        return LIB_UNKNOWN
    name = os.path.basename(path)
    for part, code in LIBRARY_FILES:
        if part in name:
            return code
    return LIB_OTHER


def has_detail(rec: tuple) -> bool:
    return len(rec) >= A_LEN


def is_device_malloc(rec: tuple) -> bool:
    """A true device cudaMalloc/cudaFree (or cuMemAlloc/cuMemFree): device memory, synchronous,
    not from a memory pool."""
    if rec[A_MEMKIND] != MEMKIND_DEVICE:
        return False
    if not has_detail(rec):
        return True
    return not rec[A_ASYNC] and rec[A_POOL] == POOL_INVALID


def memory_class(rec: tuple, api: str | None) -> tuple[str, str, str]:
    """(kind, library, API) of one memory record; ``api`` is the name of the runtime/driver
    call with the same correlation id, when one was recorded."""
    mk = rec[A_MEMKIND]
    if not has_detail(rec):
        kind = NO_DETAIL if mk == MEMKIND_DEVICE else MEMKIND_NAMES.get(mk, "unknown kind")
        return kind, LIBRARIES[LIB_UNKNOWN], api or API_UNKNOWN
    if mk == MEMKIND_DEVICE:
        kind = DEVICE_MALLOC if is_device_malloc(rec) else DEVICE_POOL
    else:
        kind = MEMKIND_NAMES.get(mk, "unknown kind")
        if rec[A_ASYNC] or rec[A_POOL] != POOL_INVALID:
            kind += " (pool)"
    lib = rec[A_LIB]
    return kind, LIBRARIES[lib] if 0 <= lib < len(LIBRARIES) else "unknown", api or API_UNKNOWN


def class_key(phase_key: str, cls: tuple[str, str, str]) -> str:
    """A JSON-friendly key for the store's per-class counters."""
    return "|".join((phase_key, *cls))


def split_key(key: str) -> tuple[str, str, str, str]:
    """(phase key, kind, library, API) from :func:`class_key`'s key."""
    parts = key.split("|")
    parts += [""] * (4 - len(parts))
    return parts[0], parts[1], parts[2], parts[3]
