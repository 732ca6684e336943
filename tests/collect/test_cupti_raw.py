"""Raw CUPTI buffer parsing, on buffers laid out with cupti-python's own record dtypes."""
from __future__ import annotations

import numpy as np
import pytest

from tuiprof.collect.cupti_raw import Layout, LayoutError, NameCache, parse_buffer

cupti = pytest.importorskip("cupti.cupti")


def _rec(dtype, **fields) -> bytes:
    a = np.zeros(1, dtype=dtype)
    for k, v in fields.items():
        a[k] = v
    return a.tobytes()


@pytest.fixture()
def name_buffers():
    # real C strings whose addresses go in the kernel records' name field
    bufs = [np.frombuffer(s.encode() + b"\0", dtype=np.uint8).copy()
            for s in ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "_ZN2at6native18reduce_kernelIiEEvv")]
    return bufs


@pytest.mark.parametrize("kver,cver", [(10, 6), (11, 7), (9, 5)])
def test_parse_mixed_buffer(kver, cver, name_buffers):
    kdt = getattr(cupti, f"activity_kernel{kver}_dtype")
    cdt = getattr(cupti, f"activity_memcpy{cver}_dtype")
    p0, p1 = (b.ctypes.data for b in name_buffers)
    recs = [
        _rec(kdt, kind=10, start=2000, end=2500, name=p0, grid_x=4, grid_y=12, grid_z=1,
             block_x=384, block_y=1, block_z=1, registers_per_thread=168,
             static_shared_memory=1024, dynamic_shared_memory=32, stream_id=7,
             correlation_id=11, graph_id=0),
        _rec(cdt, kind=1, copy_kind=2, bytes=8, start=3000, end=3100, stream_id=7, correlation_id=12),
        _rec(kdt, kind=10, start=1000, end=1200, name=p1, grid_x=2, grid_y=1, grid_z=1,
             block_x=128, block_y=1, block_z=1, registers_per_thread=32, stream_id=7,
             correlation_id=10, graph_id=5),
        _rec(cupti.activity_memset4_dtype, kind=2, bytes=4, start=1500, end=1600, stream_id=7,
             correlation_id=13),
        _rec(cupti.activity_memory4_dtype, kind=49, memory_operation_type=1, memory_kind=3,
             bytes=2 << 20, timestamp=900, address=0xDEAD000),
        _rec(cupti.activity_api_dtype, kind=5, cbid=211, start=950, end=990, correlation_id=10),
    ] + [_rec(kdt, kind=10, start=5000 + i, end=5001 + i, name=p0, stream_id=7) for i in range(5)]
    data = b"".join(recs)
    layout = Layout()
    out = parse_buffer(data, layout, NameCache(), {(2, 211): "cudaLaunchKernel"})
    assert layout.sizes[10] == kdt.itemsize
    ks = [r for r in out if r[0] == "K"]
    assert [r[2] for r in ks] == [1000, 2000, 5000, 5001, 5002, 5003, 5004]  # sorted by start
    assert ks[0] == ("K", "_ZN2at6native18reduce_kernelIiEEvv", 1000, 1200, 2, 1, 1, 128, 1, 1,
                     32, 0, 7, 10, 5)
    assert ks[1] == ("K", "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", 2000, 2500, 4, 12, 1, 384, 1,
                     1, 168, 1056, 7, 11, 0)
    assert ("C", 2, 8, 3000, 3100, 7, 12) in out
    assert ("S", 4, 1500, 1600, 7, 13) in out
    assert ("A", 1, 3, 2 << 20, 900, 0xDEAD000, 0, 0, 0, 0, 0) in out
    assert ("R", "cudaLaunchKernel", 950, 990, 10) in out
    assert len(out) == len(recs)
    # launch records before the kernels they launched, though written after them: the store
    # matches each kernel to its launch as it comes (the model/loop split)
    assert out.index(("R", "cudaLaunchKernel", 950, 990, 10)) < out.index(ks[0])


def test_garbage_is_rejected():
    with pytest.raises(LayoutError):
        parse_buffer(np.full(64, 7, dtype=np.uint32).tobytes(), Layout(), NameCache())
