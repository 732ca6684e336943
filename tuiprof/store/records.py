"""Layout of the raw activity records that flow from the collectors into the store.

Records are plain tuples, not objects: the CUPTI callback is a hot path and a tuple is the
cheapest thing Python can build. Recordings (docs/recording.md, the H100 ones in
``tests/data``) hold the same tuples, so a replayed recording and a live session feed the
store the very same values.

Kernel  ``("K", name, start_ns, end_ns, grid_x, grid_y, grid_z, block_x, block_y, block_z,
           registers_per_thread, shared_mem_bytes, stream_id, correlation_id, graph_id)``
Memcpy  ``("C", copy_kind, bytes, start_ns, end_ns[, stream_id, correlation_id])``
Memset  ``("S", bytes, start_ns, end_ns[, stream_id, correlation_id])``
Alloc   ``("A", memory_operation_type, memory_kind, bytes, timestamp_ns, address[,
           correlation_id, is_async, pool_type, stream_id, library])`` (CUPTI MEMORY2; the
        bracketed fields came later: recordings and snapshots without them still load, see
        :mod:`tuiprof.store.alloc_classes`; ``library`` is an index into ``LIBRARIES``)
API     ``("R", api_name, start_ns, end_ns, correlation_id)`` (runtime/driver calls that are
        enabled one by one; never every API call)
Graph   ``("G", start_ns, end_ns, correlation_id, graph_id, stream_id)`` (CUPTI GRAPH_TRACE: one
        record per CUDA-graph launch, its whole execution; between sampling bursts in compiled
        mode, and only with ``ProfilerOptions(graphs=True)``: it crashed the process on the H100)

Timestamps are CUPTI's clock (nanoseconds). Token marks taken on the host use the same clock.
"""
from __future__ import annotations

KIND = 0        # every record: its kind, one of these
KERNEL = "K"
MEMCPY = "C"
MEMSET = "S"
ALLOC = "A"
API = "R"
GRAPH = "G"

# Kernel tuple indices.
K_NAME, K_START, K_END = 1, 2, 3
K_GRID = slice(4, 7)
K_BLOCK = slice(7, 10)
K_LAUNCH = slice(4, 10)   # grid and block, one tuple (a launch configuration)
K_REGS, K_SMEM, K_STREAM, K_CORR, K_GRAPH = 10, 11, 12, 13, 14

# Memcpy tuple indices.
C_KIND, C_BYTES, C_START, C_END, C_STREAM, C_CORR = 1, 2, 3, 4, 5, 6
# Memset tuple indices.
S_BYTES, S_START, S_END, S_STREAM, S_CORR = 1, 2, 3, 4, 5
# Alloc tuple indices.
A_OP, A_MEMKIND, A_BYTES, A_TS, A_ADDR = 1, 2, 3, 4, 5
A_CORR, A_ASYNC, A_POOL, A_STREAM, A_LIB = 6, 7, 8, 9, 10
A_LEN_OLD, A_LEN = 6, 11

# The library a memory record came from (its ``source`` or the shared object holding its PC).
LIBRARIES = ("unknown", "PyTorch", "cuBLAS", "cuDNN", "NCCL", "CUPTI", "CUDA runtime",
             "CUDA driver", "other")
LIB_UNKNOWN, LIB_OTHER = 0, len(LIBRARIES) - 1
# Substrings of a shared object's file name, first match wins (cublasLt before cudart etc.).
LIBRARY_FILES = (("libc10_cuda", 1), ("libtorch", 1), ("libc10", 1), ("libcublas", 2),
                 ("libcudnn", 3), ("libnccl", 4), ("libcupti", 5), ("libcudart", 6),
                 ("libcuda.so", 7), ("libcuda-", 7))
# API tuple indices.
R_NAME, R_START, R_END, R_CORR = 1, 2, 3, 4
# Graph tuple indices.
G_START, G_END, G_CORR, G_GRAPH, G_STREAM = 1, 2, 3, 4, 5
# The kernel name a native program's graph-level launch record takes in the kernel stream
# (``--cuda-graph-trace graph``): one unit of a step's work whose own kernels are not traced.
GRAPH_KERNEL = "[CUDA graph launch]"

# CUPTI copy kinds (CUpti_ActivityMemcpyKind) and the direction names used in the UI/exports.
COPY_KINDS = {
    0: "Unknown",
    1: "Host-to-Device",
    2: "Device-to-Host",
    3: "Host-to-Array",
    4: "Array-to-Host",
    5: "Array-to-Array",
    6: "Array-to-Device",
    7: "Device-to-Array",
    8: "Device-to-Device",
    9: "Host-to-Host",
    10: "Peer-to-Peer",
}
DIRECTION = {1: "h2d", 2: "d2h", 8: "d2d", 10: "p2p"}

# CUpti_ActivityMemoryOperationType
MEMOP_ALLOCATION = 1
MEMOP_RELEASE = 2
# CUpti_ActivityMemoryKind / CUpti_ActivityMemoryPoolType (cupti_activity.h, CUDA 13.0)
MEMKIND_NAMES = {0: "unknown kind", 1: "pageable host", 2: "pinned host", 3: "device",
                 4: "array", 5: "managed", 6: "device static", 7: "managed static"}
MEMKIND_DEVICE = 3
POOL_INVALID, POOL_LOCAL, POOL_IMPORTED = 0, 1, 2

from ..phases import COMPILED, DECODE, EAGER, MODES, PHASES, PREFILL  # noqa: F401


def record_start(rec: tuple) -> int:
    """The timestamp that places a record in time (start, or the alloc timestamp)."""
    kind = rec[KIND]
    if kind == KERNEL:
        return rec[K_START]
    if kind == MEMCPY:
        return rec[C_START]
    if kind == MEMSET:
        return rec[S_START]
    if kind == ALLOC:
        return rec[A_TS]
    return rec[R_START]
