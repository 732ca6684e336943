"""Launch configuration, waves and the roofline (model level and per GEMM launch)."""
from __future__ import annotations

import dataclasses

import pytest
from analysis_data import NCU, decode_records

from tuiprof.analysis import (gpu_spec, launch_info, match_gemms, model_config, model_roofline,
                              occupancy, read_ncu_csv, small_grid_launches)
from tuiprof.analysis.model import decode_token_bytes, linear_layers, param_counts


def test_occupancy_h100_nvjet():
    # 384 threads x 168 regs: 5376 regs/warp -> 12 warps/SM -> 1 block; 164 KB smem -> 1 block
    o = occupancy(384, 168, 164308)
    assert o.blocks_per_sm == 1 and o.warps_per_sm == 12
    assert occupancy(128, 18, 0).blocks_per_sm == 16           # 2048 threads / 128
    assert occupancy(32, 16, 0).blocks_per_sm == 32            # block limit
    assert occupancy(256, 128, 0).limiter == "registers"       # 65536 / (128*32) = 16 warps -> 2
    assert occupancy(256, 128, 0).blocks_per_sm == 2
    assert occupancy(128, 32, 100_000).blocks_per_sm == 2      # 2 x (100000+1024) <= 233472
    assert occupancy(128, 32, 300_000).limiter == "too big"


def test_waves_fixture_gemv(eager_json):
    spec = gpu_spec({"device": "NVIDIA H100 80GB HBM3", "sm_count": 132})
    seen = set()
    for r in decode_records(eager_json, "K"):
        if r[1].startswith("nvjet_sm90_tst_64x8"):
            li = launch_info(r[4:7], r[7:10], r[10], r[11], spec.sm_count, spec.limits)
            seen.add(li.blocks)
            assert li.waves == pytest.approx(li.blocks / 132) and li.waves < 1
    assert min(seen) == 16 and max(seen) == 48


def test_small_grid_launches(eager_view):
    rows = small_grid_launches(eager_view, "decode", "eager")
    names = {r.short for r in rows}
    assert "cuBLAS GEMV nvjet 64x8" in names
    assert not any("split-K reduce" in n for n in names)
    assert all(r.launch.waves < 1 for r in rows)
    assert "cuBLAS GEMV nvjet 384x8" not in names                # LM head: 132 blocks = 1 wave


def test_gpu_table():
    assert gpu_spec({"device": "NVIDIA H100 80GB HBM3"}).bandwidth_Bps == 3.35e12
    assert gpu_spec({"device": "NVIDIA H100 PCIe"}).sm_count == 114
    assert gpu_spec({"device": "NVIDIA L40S"}).name == "L40S"
    assert gpu_spec({"device": "NVIDIA L4"}).name == "L4"
    assert gpu_spec({"device": "NVIDIA A100-SXM4-40GB"}).bandwidth_Bps == 1.555e12
    m = gpu_spec({"device": "NVIDIA H100 80GB HBM3",
                  "measured_peaks": {"bandwidth_Bps": 3.0e12, "bf16_flops": 7e14}})
    assert (m.bandwidth_Bps, m.bf16_flops, m.source) == (3.0e12, 7e14, "measured")
    assert gpu_spec({"device": "x"}, {"sm_count": 7}).sm_count == 7


def test_model_level_qwen3(eager_view, compiled_view, eager_facts, compiled_facts):
    cfg = model_config(eager_view.meta)
    assert cfg is not None and cfg.vocab_size == 151936
    pc = param_counts(cfg)
    assert pc["total"] == pytest.approx(596e6, rel=0.005)
    b = decode_token_bytes(cfg, 0)
    # README: ~1.19 GB per decode token (tied embedding read again as the LM head)
    assert b["weights"] == pytest.approx(1.19e9, rel=0.01)
    assert len(linear_layers(cfg)) == 28 * 7 + 1
    e = model_roofline(eager_view)
    c = model_roofline(compiled_view)
    assert e.floor_bw_ms == pytest.approx(e.bytes["total"] / 3.35e12 * 1e3)
    assert e.floor_ms == pytest.approx(0.357, abs=0.01)                 # ~0.36 ms at 3.35 TB/s
    assert e.floor_compute_ms < 0.01 * e.floor_bw_ms                    # memory-bound token
    assert e.over_floor == pytest.approx(eager_facts.step_ms_median / e.floor_ms, rel=0.05)
    assert c.over_floor == pytest.approx(compiled_facts.step_ms_median / c.floor_ms, rel=0.05)
    assert c.achieved_frac == pytest.approx(e.bytes["total"] / (c.measured_ms / 1e3) / 3.35e12)
    assert c.busy_achieved_frac > c.achieved_frac
    meta = {k: v for k, v in eager_view.meta.items() if k != "model_def"}   # nothing to build from
    no_model = dataclasses.replace(eager_view, meta={**meta, "model": "unknown"})
    assert model_roofline(no_model) is None
    assert not match_gemms(no_model).ok


def test_model_def_and_measured_peaks(eager_view):
    meta = dict(eager_view.meta)
    meta["model_def"] = {"name": "tiny", "family": "llama", "config": {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
        "vocab_size": 1000, "tie_word_embeddings": False}}
    cfg = model_config(meta)
    assert cfg.name == "tiny" and not cfg.tie_word_embeddings
    assert param_counts(cfg)["lm_head"] == 64 * 1000
    assert model_config({"model": "gpt-2"}) is None


@pytest.mark.parametrize("which", ["eager", "compiled"])
def test_gemm_match(which, request):
    view = request.getfixturevalue(f"{which}_view")
    m = match_gemms(view)
    assert m.ok, m.reason
    assert m.expected == m.observed == 197
    assert [s for s, _ in m.skipped] == ["CUTLASS SGEMM 128x32 tn fp32"]  # rotary fp32 matmul
    names = [g.linear.name for g in m.launches]
    assert names[:7] == ["q", "k", "v", "o", "gate", "up", "down"] and names[-1] == "lm_head"
    grids = {(g.linear.name, g.grid) for g in m.launches if g.linear.layer >= 0}
    assert grids == {("q", (4, 8, 1)), ("k", (4, 4, 1)), ("v", (4, 4, 1)), ("o", (4, 4, 1)),
                     ("gate", (4, 12, 1)), ("up", (4, 12, 1)), ("down", (4, 8, 1))}
    down = [g for g in m.launches if g.linear.name == "down"]
    assert all(g.aux_ns > 0 and "split-K" in g.info.short for g in down)
    head = m.launches[-1]
    assert head.klass == "memory-bound" and head.bw_frac > 0.5
    assert all(g.klass == "under-utilised" and g.regime == "memory"
               for g in m.launches if g.waves < 1)


def test_gemm_match_gives_up(eager_view):
    meta = dict(eager_view.meta)
    meta["model"] = "qwen3-0.6b"
    from tuiprof.analysis.model import BUILTIN, ModelConfig
    cfg = ModelConfig(**{**{f: getattr(BUILTIN["qwen3-0.6b"], f)
                            for f in BUILTIN["qwen3-0.6b"].__slots__}, "num_hidden_layers": 27})
    m = match_gemms(eager_view, cfg=cfg)
    assert not m.ok and "197 GEMM launches" in m.reason and m.launches == []


def test_bytes_against_ncu(eager_view):
    """Our per-launch byte estimates vs ncu dram__bytes.sum, within 10%."""
    ncu = read_ncu_csv(NCU)
    assert len(ncu) == 12
    m = match_gemms(eager_view)
    seq = [(g.name, g.grid) for g in m.launches]
    want = [(r["kernel"], r["grid"]) for r in ncu]
    offs = [i for i in range(len(seq) - len(want)) if seq[i:i + len(want)] == want]
    assert offs, "ncu launch sequence not found in the matched GEMMs"
    for r, g in zip(ncu, m.launches[offs[0]:offs[0] + len(want)]):
        measured = r["metrics"]["dram__bytes.sum"]
        assert g.bytes == pytest.approx(measured, rel=0.10), (g.linear.name, g.bytes, measured)
    assert [g.linear.name for g in m.launches[offs[0]:offs[0] + 4]] == ["o", "gate", "up", "down"]
