"""Where the time goes, checked against numbers computed here straight from the recordings' JSON."""
from __future__ import annotations

import numpy as np
import pytest
from analysis_data import decode_records, decode_windows, duration
from analysis_names import ALL_NAMES

from tuiprof.analysis import (attention_split, category_shares, launch_bound, library_shares,
                              mode_summaries, phase_split, token_timing, top_kernels)

CATEGORY = {r[0]: r[2] for r in ALL_NAMES}
LIBRARY = {r[0]: r[1] for r in ALL_NAMES}


def _expected_shares(d: dict, key: dict, copies: bool) -> dict:
    ns: dict = {}
    for r in decode_records(d, "KCS" if copies else "K"):
        k = key[r[1]] if r[0] == "K" else "memcpy/memset"
        ns[k] = ns.get(k, 0) + duration(r)
    tot = sum(ns.values())
    return {k: v / tot for k, v in ns.items()}


@pytest.mark.parametrize("which", ["eager", "compiled"])
def test_category_and_library_shares(which, request):
    view = request.getfixturevalue(f"{which}_view")
    d = request.getfixturevalue(f"{which}_json")
    got = {k: s.share for k, s in category_shares(view).items()}
    exp = _expected_shares(d, CATEGORY, copies=True)
    assert got.keys() == exp.keys()
    for k in exp:
        assert got[k] == pytest.approx(exp[k], abs=1e-9)
    got = {k: s.share for k, s in library_shares(view).items()}
    exp = _expected_shares(d, LIBRARY, copies=False)
    for k in exp:
        assert got[k] == pytest.approx(exp[k], abs=1e-9)


def test_eager_decode_is_mostly_small_aten_kernels(eager_view):
    """Eager decode at batch 1: ATen's elementwise and copy/cast kernels take more of the GPU
    time than the GEMVs (the shares themselves: test_category_and_library_shares)."""
    sh = category_shares(eager_view)
    assert sh["elementwise"].share + sh["copy/cast"].share > sh["GEMM/GEMV"].share > 0.15
    assert library_shares(eager_view)["PyTorch ATen"].share > 0.5


def test_compiled_decode_is_mostly_gemv(compiled_view):
    """Compiled, Inductor fuses the elementwise work into a few Triton kernels: the GEMVs are
    most of the time, Triton the next library."""
    sh = category_shares(compiled_view)
    assert sh["GEMM/GEMV"].share == max(s.share for s in sh.values()) and sh["GEMM/GEMV"].share > 0.5
    libs = sorted(library_shares(compiled_view).items(), key=lambda kv: -kv[1].share)
    assert "Triton/Inductor" in [name for name, _ in libs[:2]]


@pytest.mark.parametrize("which", ["eager", "compiled"])
def test_busy_vs_wall(which, request):
    view = request.getfixturevalue(f"{which}_view")
    d = request.getfixturevalue(f"{which}_json")
    f = request.getfixturevalue(f"{which}_facts")
    busy = f.kernel_ms_median
    wins = decode_windows(d)
    walls = [(e - s) / 1e6 for _, s, e in wins]
    summ = mode_summaries(view)[which]
    assert summ.tokens == f.decode_steps and summ.kernels_per_token == f.kernels_per_step_median
    assert summ.ms_median == pytest.approx(np.median(walls), rel=1e-6)
    assert summ.ms_p90 == pytest.approx(np.percentile(walls, 90), rel=1e-6)
    assert summ.tokens_per_s == pytest.approx(1000 / np.mean(walls), rel=1e-6)
    ks = decode_records(d, "K")
    assert summ.busy_ms_per_token == pytest.approx(busy, rel=0.02)
    # kernels never overlap in these recordings: busy = sum of kernel time
    assert summ.busy_fraction == pytest.approx(sum(duration(r) for r in ks) / 1e6 / sum(walls),
                                               rel=1e-3)
    lb = launch_bound(view)
    assert lb.launch_bound is (lb.busy_fraction < 0.5)    # the rule: the GPU busy < 50 % of a step
    assert lb.launch_bound or which == "compiled"          # eager at batch 1 always is
    assert lb.busy_ms == pytest.approx(busy, rel=0.03)


def test_token_timing_split(compiled_view, compiled_json):
    row = [t for t in compiled_view.tokens if t.phase == "decode"][5]
    tt = token_timing(row)
    assert tt.head_ms + tt.span_ms + tt.tail_ms == pytest.approx(tt.wall_ms, rel=1e-9)
    assert tt.gaps_ms == pytest.approx(tt.span_ms - tt.busy_ms, abs=1e-9)
    in_graphs = [r for r in compiled_json["records"]
                 if r[0] == "K" and r[14] and row.start_ns <= r[2] <= row.end_ns]
    assert tt.graph_kernels == len(in_graphs) > 0


def test_phase_split(eager_view, eager_json, eager_facts):
    ps = phase_split(eager_view)
    s, e = [m[2] for m in eager_json["marks"] if m[1] == -1]
    pre = sum(duration(r) for r in eager_json["records"] if r[0] == "K" and s <= r[2] <= e)
    assert ps["prefill"]["tokens"] == 1 and ps["decode"]["tokens"] == eager_facts.decode_steps
    assert ps["prefill"]["gpu_ms"] >= pre / 1e6
    assert ps["prefill"]["gpu_share"] + ps["decode"]["gpu_share"] == pytest.approx(1.0)


def test_top_kernels(eager_view, eager_json, eager_facts):
    rows = top_kernels(eager_view, "eager", "decode", 5)
    assert len(rows) == 5
    top = rows[0]
    assert top.info.short == "cuBLAS GEMV nvjet 64x8"
    ks = [r for r in decode_records(eager_json, "K") if r[1] == top.name]
    assert top.launches == len(ks) and len(ks) % eager_facts.decode_steps == 0  # the same each step
    assert top.total_ms == pytest.approx(sum(duration(r) for r in ks) / 1e6)
    assert top.per_token == pytest.approx(len(ks) / eager_facts.decode_steps)
    assert rows == sorted(rows, key=lambda r: -r.total_ms)


def test_attention_fused(eager_view, eager_json, eager_facts):
    a = attention_split(eager_view)
    sdpa = [r for r in decode_records(eager_json, "K") if "sdpa" in r[1]]   # cuDNN's fused kernel
    expect = sum(duration(r) for r in sdpa) / 1e6 / eager_facts.decode_steps
    assert a["path"] == "fused" and a["fused_attention_ms"] == pytest.approx(expect, rel=1e-6)


def test_eager_attention_path_split():
    """Non-fused attention (HF eager): q·kᵀ and p·v matmuls around a softmax kernel."""
    from tuiprof.analysis import match_gemms
    from tuiprof.store import SessionStore
    gemv = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
    softmax = ("_ZN2at6native19cunn_SoftMaxForwardILi8EN3c108BFloat16EffNS0_22SoftMaxForwardEpilogue"
               "EEEvPT2_PKT0_i")
    meta = {"device": "NVIDIA H100 80GB HBM3", "sm_count": 132, "prompt_tokens": 4,
            "model_def": {"name": "tiny", "family": "llama", "config": {
                "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
                "vocab_size": 1000, "tie_word_embeddings": True}}}
    s = SessionStore(meta=meta)
    seq = s.begin_token("decode", "eager", 0, 0)
    names = []
    for _ in range(2):
        names += [gemv] * 3 + [gemv, softmax, gemv] + [gemv] * 4
    names.append(gemv)
    recs, t = [], 1000
    for i, n in enumerate(names):
        dur = 3000 if n == softmax else 2000
        recs.append(("K", n, t, t + dur, 4, 1, 1, 128, 1, 1, 32, 0, 7, i, 0))
        t += dur + 500
    s.add_records(recs)
    s.end_token(seq, t + 1000, (t + 1000) / 1e6)
    v = s.view()
    m = match_gemms(v)
    assert m.ok and [g.linear.name for g in m.launches][:9] == [
        "q", "k", "v", "attn_qk", "attn_pv", "o", "gate", "up", "down"]
    a = attention_split(v)
    assert a["path"] == "eager"
    assert a["softmax_ms"] == pytest.approx(2 * 3000 / 1e6)
    assert a["attention_matmul_ms"] == pytest.approx(4 * 2000 / 1e6)
    assert a["linear_matmul_ms"] == pytest.approx(15 * 2000 / 1e6)
