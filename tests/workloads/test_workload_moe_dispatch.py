"""The deepseek MoE dispatch (DeepSeek-V2 ``moe_infer``: argsort of the (token, slot) expert
ids, gather, experts, scatter back, weighted sum) against a plain per-token loop (CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workload_helpers import build_tiny


def _moe(dtype=torch.float32):
    moe = build_tiny("deepseek-tiny").module.model.layers[1].mlp
    return moe.to(dtype)


def _per_token_loop(moe, x, w, idx):
    """Routed experts written out: for each token, for each of its k slots, expert(x) * weight."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            xt = x[t:t + 1]
            a = F.silu(xt @ moe.experts_w1[e].t()) * (xt @ moe.experts_w3[e].t())
            out[t] += (a @ moe.experts_w2[e].t())[0] * w[t, j]
    return out


def _previous_gathered(moe, x, w, idx):
    """The decode path before the argsort dispatch (``W[idx]`` per token, no sort)."""
    h = torch.einsum("nh,nkih->nki", x, moe.experts_w1[idx])
    u = torch.einsum("nh,nkih->nki", x, moe.experts_w3[idx])
    y = torch.einsum("nki,nkhi->nkh", F.silu(h) * u, moe.experts_w2[idx])
    return (y * w.unsqueeze(-1)).sum(dim=1)


@pytest.mark.parametrize("n", [1, 2, 7, 33])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dispatch_equals_per_token_loop(n, seed):
    moe = _moe()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=g)
    with torch.no_grad():
        w, idx = moe.route(x)
        ref = _per_token_loop(moe, x, w, idx)
        for path in (moe._gathered, moe._grouped):
            torch.testing.assert_close(path(x, w, idx), ref, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(moe._gathered(x, w, idx), _previous_gathered(moe, x, w, idx),
                                   atol=2e-6, rtol=1e-5)


def test_dispatch_equals_per_token_loop_in_float64():
    moe = _moe(torch.float64)
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with torch.no_grad():
        w, idx = moe.route(x)
        ref = _per_token_loop(moe, x, w, idx)
        for path in (moe._gathered, moe._grouped):
            torch.testing.assert_close(path(x, w, idx), ref, atol=1e-12, rtol=1e-12)


def test_dispatch_with_every_token_on_the_same_experts():
    """Ties in the sort (many rows of one expert) and experts no token chose."""
    moe = _moe()
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(3))
    idx = torch.tensor([[3, 5]] * 6)
    w = torch.rand(6, 2, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = _per_token_loop(moe, x, w, idx)
        for path in (moe._gathered, moe._grouped):
            torch.testing.assert_close(path(x, w, idx), ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("mode", ["decode", "full"])
def test_moe_forward_equals_loop_plus_shared_experts(mode):
    moe = _moe()
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        flat = x.reshape(-1, 64)
        w, idx = moe.route(flat)
        ref = _per_token_loop(moe, flat, w, idx) + moe.shared_experts(flat)
        torch.testing.assert_close(moe(x, mode), ref.view_as(x), atol=2e-6, rtol=1e-5)


def _decode_ops(adapter) -> set[str]:
    prompt = torch.randint(0, adapter.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))
    adapter.reset_cache()
    adapter.prefill(prompt)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        adapter.decode(torch.tensor([[5]]), torch.tensor([6]))
    return {e.key for e in prof.key_averages()}


def test_decode_runs_topk_sort_and_index_ops():
    """On CUDA these are the top-k, sort and gather/scatter kernels of the DeepSeek-OCR study."""
    ops = _decode_ops(build_tiny("deepseek-tiny"))
    assert {"aten::topk", "aten::sort", "aten::index", "aten::index_put_"} <= ops
    assert "aten::_local_scalar_dense" not in ops and "aten::item" not in ops  # no host read in decode


def test_deepseek_decode_is_fullgraph_compilable():
    adapter = build_tiny("deepseek-tiny")
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(0))
    adapter.reset_cache()
    adapter.prefill(prompt)
    eager = [adapter.decode(torch.tensor([[5 + i]]), torch.tensor([6 + i])) for i in range(2)]
    adapter.reset_cache()
    adapter.prefill(prompt)
    torch._dynamo.reset()
    step = torch.compile(adapter.decode, fullgraph=True, backend="eager")
    got = [step(torch.tensor([[5 + i]]), torch.tensor([6 + i])) for i in range(2)]
    for a, b in zip(eager, got):
        torch.testing.assert_close(a, b)
