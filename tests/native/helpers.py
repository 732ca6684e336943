"""Building blocks of the native-program tests: tuiprof's injection library (built as in use),
a stand-in libcupti and a driver program compiled here, and activity-record scripts in CUPTI's
documented layout (cupti-python's record dtypes) for the stand-in to emit."""
from __future__ import annotations

import re
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent / "fake"
KERNEL, MEMCPY, MEMSET, DRIVER, RUNTIME, MARKER, MEMORY2 = 10, 1, 2, 4, 5, 12, 49
GRAPH_TRACE = 51
LAUNCH, MEMCPY_ASYNC = 211, 41   # cudaLaunchKernel_v7000, cudaMemcpyAsync_v3020 (runtime cbids)
GRAPH_LAUNCH = 311               # cudaGraphLaunch_v10000 (runtime cbid)


@dataclass
class Native:
    build: object      # tuiprof.injection.build.NativeBuild
    fake: Path         # the stand-in libcupti
    driver: Path       # the program


def compile_native(tmp: Path) -> Native:
    """The injection library (tuiprof's own build), the stand-in libcupti and the driver;
    ``pytest.skip`` with the reason where no compiler or headers are found."""
    import pytest

    from tuiprof.errors import TuiprofError
    from tuiprof.injection.build import STUB, build, find_compiler

    try:
        b = build()
        cc = find_compiler()
    except TuiprofError as exc:
        pytest.skip(f"the injection library cannot be built here: {exc}")
    fake = tmp / "libfakecupti.so"
    driver = tmp / "driver"
    for cmd in ([cc, "-O1", "-shared", "-fPIC", "-o", str(fake), str(HERE / "fake_cupti.c"),
                 f"-I{STUB}", f"-I{b.cupti.include}"],
                [cc, "-O1", "-o", str(driver), str(HERE / "driver.c"), "-ldl"]):
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return Native(b, fake, driver)


def dtypes():
    """CUPTI's record layouts, as cupti-python declares them."""
    import pytest

    cupti = pytest.importorskip("cupti.cupti")
    return {KERNEL: _kernel_dtype(cupti), MEMCPY: cupti.activity_memcpy6_dtype,
            MEMSET: cupti.activity_memset4_dtype, MEMORY2: cupti.activity_memory4_dtype,
            RUNTIME: cupti.activity_api_dtype, DRIVER: cupti.activity_api_dtype,
            MARKER: cupti.activity_marker2_dtype, GRAPH_TRACE: cupti.activity_graph_trace2_dtype}


def _kernel_dtype(cupti):
    """The kernel record of CUPTI 13.0 (``CUpti_ActivityKernel10``, what cupti-python 13.0.x
    declares), or the newest one a later cupti-python declares (``Kernel13`` in 13.4): the
    parser's field offsets are the same in each, only the size differs."""
    versions = [int(m.group(1)) for m in map(re.compile(r"activity_kernel(\d+)_dtype$").match,
                                             dir(cupti)) if m]
    if not versions:
        raise AssertionError(f"cupti-python {getattr(cupti, '__version__', '?')} declares no "
                             "kernel record layout (activity_kernelN_dtype)")
    return getattr(cupti, f"activity_kernel{max(versions)}_dtype")


class Script:
    """Activity records for the stand-in libcupti: string fields hold an index into the
    script's names (the stand-in puts its own copy's address there)."""

    def __init__(self) -> None:
        self.dt = dtypes()
        self.names: list[str] = []
        self.records: list[bytes] = []

    def _name(self, s: str | None) -> int:
        if s is None:
            return 0
        if s not in self.names:
            self.names.append(s)
        return self.names.index(s) + 1

    def _rec(self, kind: int, **fields) -> None:
        a = np.zeros(1, dtype=self.dt[kind])
        a["kind"] = kind
        for k, v in fields.items():
            a[k] = v
        self.records.append(a.tobytes())

    def kernel(self, name: str, start: int, end: int, corr: int, grid=(1, 1, 1),
               block=(128, 1, 1), regs=32, smem=(0, 0), stream=7, graph=0) -> None:
        self._rec(KERNEL, name=self._name(name), start=start, end=end, correlation_id=corr,
                  grid_x=grid[0], grid_y=grid[1], grid_z=grid[2], block_x=block[0],
                  block_y=block[1], block_z=block[2], registers_per_thread=regs,
                  static_shared_memory=smem[0], dynamic_shared_memory=smem[1],
                  stream_id=stream, graph_id=graph)

    def graph(self, graph_id: int, start: int, end: int, corr: int, stream: int = 7) -> None:
        """A graph-level launch record (``CUpti_ActivityGraphTrace2``): one per graph launch."""
        self._rec(GRAPH_TRACE, graph_id=graph_id, start=start, end=end, correlation_id=corr,
                  stream_id=stream, device_id=0, context_id=1)

    def api(self, cbid: int, start: int, end: int, corr: int, runtime: bool = True) -> None:
        self._rec(RUNTIME if runtime else DRIVER, cbid=cbid, start=start, end=end,
                  correlation_id=corr)

    def memcpy(self, copy_kind: int, nbytes: int, start: int, end: int, corr: int,
               stream: int = 7) -> None:
        self._rec(MEMCPY, copy_kind=copy_kind, bytes=nbytes, start=start, end=end,
                  stream_id=stream, correlation_id=corr)

    def memset(self, nbytes: int, start: int, end: int, corr: int, stream: int = 7) -> None:
        self._rec(MEMSET, bytes=nbytes, start=start, end=end, stream_id=stream,
                  correlation_id=corr)

    def memory(self, op: int, nbytes: int, ts: int, address: int, corr: int,
               source: str | None = None) -> None:
        self._rec(MEMORY2, memory_operation_type=op, memory_kind=3, bytes=nbytes,
                  timestamp=ts, address=address, correlation_id=corr,
                  source=self._name(source))

    def marker(self, flags: int, ts: int, mid: int, name: str | None = None) -> None:
        self._rec(MARKER, flags_=flags, timestamp=ts, id=mid, object_kind=2,
                  name=self._name(name))

    def write(self, path: Path) -> Path:
        sizes = {k: d.itemsize for k, d in self.dt.items()}
        out = [struct.pack("=4I", 0x50434B46, len(sizes), len(self.names), len(self.records))]
        out += [struct.pack("=II", k, s) for k, s in sizes.items()]
        for n in self.names:
            b = n.encode()
            out.append(struct.pack("=I", len(b)) + b)
        out += self.records
        path.write_bytes(b"".join(out))
        return path


def decode_like(s: Script, steps: int, t0: int = 1_000_000_000, corr0: int = 1,
                layers: int = 4, gap_ns: int = 40_000, with_api: bool = True,
                marker_name: str | None = None) -> tuple[int, list[str], list[str]]:
    """A prefill then ``steps`` decode steps of a small model, as a decode loop on a GPU
    launches them: each step's first kernel after a host gap (the token read back), a D2H copy
    of the token at its end. Returns (next time, the prefill's kernels, a step's kernels)."""
    layer = ["rmsnorm", "gemv_qkv", "rope", "attn_decode", "gemv_o", "add", "rmsnorm",
             "gemv_up", "silu_mul", "gemv_down", "add"]
    step = ["embed"] + layer * layers + ["rmsnorm", "gemv_lm_head", "argmax"]
    prefill = ["embed"] + [("gemm_" + k[5:]) if k.startswith("gemv_") else
                           ("attn_prefill" if k == "attn_decode" else k)
                           for k in layer * layers] + ["rmsnorm", "gemm_lm_head", "argmax"]
    t, corr = t0, corr0
    mid = 100
    for phase, names in [("prefill", prefill)] + [("decode", step)] * steps:
        t += gap_ns
        if marker_name:
            s.marker(2, t - 500, mid, marker_name if phase == "decode" else "prefill")
        for i, name in enumerate(names):
            if with_api:
                s.api(LAUNCH, t, t + 2_000, corr)
            grid = (4, 1, 1) if name.startswith("gemv") else (64, 1, 1)
            s.kernel(name, t + 3_000, t + 6_000 + (20_000 if phase == "prefill" else 0), corr,
                     grid=grid)
            t += 6_000 + (20_000 if phase == "prefill" else 0)
            corr += 1
        if with_api:
            s.api(MEMCPY_ASYNC, t + 500, t + 4_000, corr)  # the token, to the host
        s.memcpy(2, 4, t + 1_000, t + 2_000, corr)
        corr += 1
        t += 4_000
        if marker_name:
            s.marker(4, t, mid)
            mid += 1
    return t, prefill, step
