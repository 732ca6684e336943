"""GPU checks of the workloads (skipped without CUDA; run on the GPU machine)."""

from __future__ import annotations

import pytest
import torch

import workload_helpers  # noqa: F401 - puts the repository on sys.path
from tuiprof.sweep import run_sweep

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_cuda_sweep_profiles_kernels():
    result = run_sweep(["gpt2-tiny"], [32], passes=("inference", "train-backward"), attention=("plain", "sdpa"),
                       warmup=1, iters=2, device="cuda")
    assert {r.status for r in result.cells} == {"ok"}
    for r in result.cells:
        assert r.profile.source == "cuda-kernels" and 0 < r.profile.gemm_fraction < 1
        assert r.peak_mem_mib > 0
    plain = result.find("gpt2-tiny", 32, "inference", attention="plain").profile
    assert plain.attn_softmax_ms > 0 and plain.attn_matmul_ms > 0


def test_real_oom_under_a_memory_limit_is_recorded_and_the_sweep_continues():
    result = run_sweep(["gpt2-large", "gpt2-tiny"], [1024, 32], passes=("train-backward",), memory_limit_gib=2.0,
                       warmup=0, iters=1, device="cuda", profile=False)
    torch.cuda.set_per_process_memory_fraction(1.0)
    status = {(r.cell.model, r.cell.seq_len): r.status for r in result.cells}
    assert status[("gpt2-large", 1024)] == "oom"
    assert status[("gpt2-tiny", 32)] == "ok"


@pytest.mark.parametrize("name", ["nanochat-tiny", "deepseek-tiny", "gpt2-tiny", "llama-layer-tiny"])
def test_cuda_graph_decode_matches_eager(name):
    from tuiprof.engine.families import get_family
    from tuiprof.engine.model_defs import get_model_def

    defn = get_model_def(name)
    adapter = get_family(defn.family).build(defn, device="cuda", dtype="float32", seed=0)
    prompt = torch.randint(0, adapter.vocab_size, (1, 8), device="cuda", generator=None)
    adapter.reset_cache()
    adapter.prefill(prompt)
    eager = [adapter.decode(torch.tensor([[i + 1]], device="cuda"), torch.tensor([8 + i], device="cuda")) for i in range(3)]
    torch._dynamo.reset()
    step = torch.compile(adapter.decode, mode="reduce-overhead", fullgraph=True)
    adapter.reset_cache()
    adapter.prefill(prompt)
    graphed = [step(torch.tensor([[i + 1]], device="cuda"), torch.tensor([8 + i], device="cuda")).clone() for i in range(3)]
    for a, b in zip(eager, graphed):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)
