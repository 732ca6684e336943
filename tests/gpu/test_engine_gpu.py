"""qwen3-0.6b on the GPU: eager and compiled (CUDA graphs), 256 decode tokens each.

Eager: the bare engine (no collectors) in the ``eager`` workload process. Compiled: the one
compiled session of the ``compiled`` workload process (see test_collect_gpu.py), so that the suite
compiles once, in a process of its own.
"""
from __future__ import annotations

import statistics

import pytest

from _workloads import DECODE

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture
def run(request):
    return request.getfixturevalue(f"{request.param}_run")


@pytest.mark.parametrize("run", ["eager", "compiled"], indirect=True)
def test_qwen3_0_6b_decode(run):
    eng = run["engine"]
    mode = eng["mode"]
    assert eng["dtype"] == "bfloat16" and eng["params"] == 596_049_920
    assert eng["error"] is None, eng["message"]
    decode = [t for t in eng["tokens"] if t["phase"] == "decode"]
    assert len(decode) == DECODE
    bad = [(t["step"], t["mode"], t["gpu_ms"]) for t in decode
           if not (t["mode"] == mode and t["gpu_ms"] is not None and t["gpu_ms"] > 0)]
    assert not bad, (eng["message"], bad[:4])
    steady = decode[8:]
    host_s = sum(t["host_ms"] for t in steady) / 1e3
    gpu_ms = statistics.median(t["gpu_ms"] for t in steady)
    compile_s = eng["compile_s"]
    print(f"\nqwen3-0.6b {mode}: {len(steady) / host_s:.1f} tokens/s (median gpu {gpu_ms:.3f} "
          f"ms/token{'' if compile_s is None else f', compile {compile_s:.1f} s'})")
