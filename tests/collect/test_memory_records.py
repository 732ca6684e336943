"""CUPTI memory records (MEMORY2) in full: parsed from a raw buffer laid out as
``CUpti_ActivityMemory4`` in CUDA 13.0's cupti_activity.h (the buffer stands in for CUPTI's;
the parser, the library resolver and the store are the real code)."""
from __future__ import annotations

import struct

import numpy as np

from tuiprof.collect.cupti_raw import Layout, LibraryResolver, NameCache, parse_buffer
from tuiprof.store.records import LIBRARIES
from tuiprof.store.session import SessionStore

# kind, op, memkind, corr, address, bytes, timestamp, PC, pid, device, context, stream, name,
# isAsync, pad1, poolType, pad2, poolAddress, releaseThreshold, poolSize, utilizedSize, source
MEMORY4 = struct.Struct("<IIII QQQQ IIII Q II II QQQQ Q")
API = struct.Struct("<II QQ III I")   # kind, cbid, start, end, processId, threadId, corr, ret
assert MEMORY4.size == 128 and API.size == 40


def memory4(op, memkind, corr, nbytes, ts, *, pc=0, stream=7, is_async=0, pool=0,
            source=0) -> bytes:
    return MEMORY4.pack(49, op, memkind, corr, 0xD000 + corr, nbytes, ts, pc, 1, 0, 1, stream,
                        0, is_async, 0, pool, 0, 0, 0, 0, 0, source)


def c_string(s: str) -> np.ndarray:
    return np.frombuffer(s.encode() + b"\0", dtype=np.uint8).copy()


def test_every_field_classification_needs(tmp_path):
    torch_so = c_string("/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so")
    maps = tmp_path / "maps"
    maps.write_text("7f0000000000-7f0000100000 r-xp 00000000 08:01 42 "
                    "/usr/local/cuda/lib64/libcublasLt.so.13.0.0\n"
                    "7f0000200000-7f0000300000 r-xp 00000000 08:01 43 [heap]\n")
    data = b"".join([
        memory4(1, 3, 11, 2 << 20, 900, source=torch_so.ctypes.data),       # torch cudaMalloc
        memory4(1, 2, 12, 4096, 901, pc=0x7F0000000400),                    # cuBLASLt pinned
        memory4(1, 3, 13, 1 << 20, 902, pc=0x7F0000200010, is_async=1, pool=1),
        memory4(2, 3, 14, 2 << 20, 903),
        API.pack(5, 20, 880, 899, 1, 1, 11, 0),                             # the cudaMalloc
    ])
    out = parse_buffer(data, Layout(), NameCache(), {(2, 20): "cudaMalloc"},
                       libraries=LibraryResolver(str(maps)))
    assert out[0][0] == "R"                      # API records first: the store matches them
    a = [r for r in out if r[0] == "A"]
    lib = {name: i for i, name in enumerate(LIBRARIES)}
    assert a[0] == ("A", 1, 3, 2 << 20, 900, 0xD000 + 11, 11, 0, 0, 7, lib["PyTorch"])
    assert a[1][2] == 2 and a[1][10] == lib["cuBLAS"]
    assert a[2][6:10] == (13, 1, 1, 7) and a[2][10] == lib["unknown"]   # [heap]: no file
    assert a[3][1] == 2 and a[3][10] == lib["unknown"]


def test_source_pointer_read_once():
    s = c_string("libcudnn_engines_precompiled.so.9")
    r = LibraryResolver("/nonexistent")
    assert LIBRARIES[r.source(s.ctypes.data)] == "cuDNN"
    s[:] = 0                                     # CUPTI keeps it alive; a pointer is read once
    assert LIBRARIES[r.source(s.ctypes.data)] == "cuDNN"


def test_store_counts_true_cudamalloc_apart_from_the_rest():
    """A prefill with one real cudaMalloc (its API record seen), pinned host buffers and a pool
    allocation: the token row and the per-phase device counters hold only the cudaMalloc, every
    record is in a class, and the API is named where its record arrived."""
    torch_so = c_string("libc10_cuda.so")
    st = SessionStore()
    seq = st.begin_token("prefill", "eager", 1000, 0)
    data = b"".join([memory4(1, 3, 11, 2 << 20, 1100, source=torch_so.ctypes.data)]
                    + [memory4(1, 2, 20 + i, 4096, 1200 + i) for i in range(5)]
                    + [memory4(1, 3, 40, 1 << 20, 1300, is_async=1, pool=1),
                       API.pack(5, 20, 1050, 1099, 1, 1, 11, 0)])
    st.add_records(parse_buffer(data, Layout(), NameCache(), {(2, 20): "cudaMalloc"},
                                libraries=LibraryResolver("/nonexistent")))
    st.end_token(seq, 2000, 1.0)
    st.add_records(parse_buffer(memory4(1, 1, 50, 64, 10), Layout(), NameCache(), {},
                                libraries=LibraryResolver("/nonexistent")))   # before any token
    v = st.view()
    row = v.tokens[-1]
    assert (row.mallocs, row.malloc_bytes) == (1, 2 << 20)
    assert v.allocs["device_by_phase"] == {"prefill/eager": {
        "mallocs": 1, "frees": 0, "malloc_bytes": 2 << 20, "free_bytes": 0}}
    assert v.allocs["tokens"]["mallocs"] == 7     # every record, as before
    cls = {k: c["mallocs"] for k, c in v.allocs["classes"].items()}
    assert cls == {"prefill/eager|device cudaMalloc|PyTorch|cudaMalloc": 1,
                   "prefill/eager|pinned host|unknown|API unknown": 5,
                   "prefill/eager|device pool|unknown|API unknown": 1,
                   "startup|pageable host|unknown|API unknown": 1}


def test_old_records_without_detail_still_count():
    st = SessionStore()
    seq = st.begin_token("decode", "eager", 1000, 0)
    st.add_records([("A", 1, 3, 1 << 20, 1100, 0xABC), ("A", 1, 2, 64, 1101, 0xABD)])
    st.end_token(seq, 2000, 1.0)
    v = st.view()
    assert v.tokens[-1].mallocs == 1
    assert set(v.allocs["classes"]) == {
        "decode/eager|device (no detail)|unknown|API unknown",
        "decode/eager|pinned host|unknown|API unknown"}


def test_class_counters_are_bounded():
    st = SessionStore()
    st.add_records([("R", f"api{i}", 1, 2, i) for i in range(600)])   # 600 distinct APIs
    st.add_records([("A", 1, 3, 64, 10 + i, i, i, 0, 0, 0, 0) for i in range(600)])
    classes = st.view().allocs["classes"]
    assert len(classes) <= 257 and sum(c["mallocs"] for c in classes.values()) == 600

