"""Batch configurations: MBU, MFU, class, knee and findings, with numbers checked by hand.

A made-up GPU with round peaks (1 TB/s, 100 TFLOP/s: ridge 100 FLOP/B) and a made-up dense
model with round shapes: every figure below can be recomputed on paper.
"""
from __future__ import annotations

import pytest

from tuiprof.analysis import find
from tuiprof.analysis.batch import (KNEE_GAIN, ConfigSummary, classify_step, config_summaries,
                                    measured_knee, predicted_knee)
from tuiprof.analysis.gpus import GpuSpec
from tuiprof.analysis.model import (ModelConfig, decode_step_bytes, decode_step_flops,
                                    linear_layers, model_config)
from tuiprof.analysis.tokens import mode_summaries
from tuiprof.store import SessionStore

SPEC = GpuSpec("round GPU", 100, 1e12, 100e12)        # ridge = 100 FLOP/byte
# One layer, hidden 1000, 10 heads of 100 (MHA), plain MLP of 4000, vocab 1000, bf16.
CFG = ModelConfig("round", 1000, 1, 10, 10, 100, 4000, 1000, False, 2, False, "plain")
MODEL_DEF = {"name": "round", "family": "nanochat",
             "config": {"n_layer": 1, "n_embd": 1000, "n_head": 10, "vocab_size": 1000}}
META = {"model": "round", "model_def": MODEL_DEF, "dtype": "bfloat16", "prompt_tokens": 9,
        "device": "round GPU", "measured_peaks": {"bandwidth_Bps": 1e12, "bf16_flops": 100e12}}


def test_model_description_of_a_nanochat_config():
    assert model_config(META) == CFG
    assert [(l.name, l.in_features, l.out_features) for l in linear_layers(CFG)] == [
        ("q", 1000, 1000), ("k", 1000, 1000), ("v", 1000, 1000), ("o", 1000, 1000),
        ("fc", 1000, 4000), ("proj", 4000, 1000), ("lm_head", 1000, 1000)]


def test_step_bytes_and_flops_grow_with_the_batch_as_they_should():
    # weights: 4 x 1e6 (attention) + 2 x 4e6 (MLP) = 12e6 linear params, no norm gains,
    # plus the 1e6 LM head: 13e6 x 2 bytes = 26 MB, plus one embedding row (2 kB) per sequence.
    # KV: 2 (K, V) x 1 layer x 10 heads x 100 x 2 bytes = 4 kB per position per sequence.
    b1 = decode_step_bytes(CFG, context=10, batch=1)
    b8 = decode_step_bytes(CFG, context=10, batch=8)
    assert b1["weights"] == 26_000_000 + 2_000 and b8["weights"] == 26_000_000 + 8 * 2_000
    assert b1["kv_read"] == 40_000 and b8["kv_read"] == 8 * 40_000
    assert b8["kv_write"] == 8 * 4_000
    # FLOPs: 2 x 13e6 matmul params + attention 4 x 10 heads x 100 x 10 positions, per sequence
    f8 = decode_step_flops(CFG, context=10, batch=8)
    assert f8["matmul"] == 8 * 26_000_000 and f8["attention"] == 8 * 40_000


def test_predicted_knee_is_where_the_matmul_intensity_meets_the_ridge():
    # W = 13e6, A = sum(in + out) = 4 x 2000 + 2 x 5000 + 2000 = 20,000, d = 2, ridge 100:
    # B* = 100 x 2 x 13e6 / (2 x 13e6 - 100 x 2 x 20,000) = 2.6e9 / 2.2e7 = 118.18...
    knee = predicted_knee(CFG, SPEC)
    assert knee == pytest.approx(2.6e9 / 2.2e7)
    w, a = 13e6, 20_000
    assert 2 * knee * w / (2 * (w + knee * a)) == pytest.approx(100)   # intensity = ridge there
    small = ModelConfig("small", 64, 1, 4, 4, 16, 256, 100, False, 2, False, "plain")
    assert predicted_knee(small, SPEC) is None     # 64-wide matmuls never reach 100 FLOP/B


def test_measured_knee_is_the_first_doubling_that_adds_little():
    def s(batch, tok_s):
        return ConfigSummary(batch, "eager", batch, 10, 1.0, tok_s, None, None, 10, None, None,
                             None, None, None, 100.0, "unknown", "")

    rows = [s(1, 100), s(2, 190), s(4, 360), s(8, 400), s(16, 410)]
    k = measured_knee(rows, "eager")
    assert (k.batch, k.largest) == (4, 16) and k.gain == pytest.approx((410 / 360) ** 0.5)
    assert k.gain < KNEE_GAIN and [round(g[2], 2) for g in k.gains] == [1.9, 1.89, 1.11, 1.02]
    skip = measured_knee([s(1, 100), s(4, 380)], "eager")   # two doublings: per doubling sqrt
    assert skip.batch is None and skip.gains[0][2] == pytest.approx(3.8 ** 0.5)
    assert measured_knee([s(1, 100)], "eager") is None
    # H100, eager qwen3-0.6b: batch 2 was slower than batch 1 (a noisy cell), then tokens/s
    # doubled with every doubling up to 256: no knee, not "past 1"
    dip = [s(1, 35), s(2, 34), s(4, 112), s(8, 227), s(16, 448), s(32, 863)]
    assert measured_knee(dip, "eager").batch is None


def test_classes_and_the_numbers_that_decide_them():
    assert classify_step(0.3, 0.1, 0.01, 10, 100)[0] == "launch-bound"
    klass, why = classify_step(0.9, 0.2, 0.05, 25, 100)
    assert klass == "memory-bound" and "MBU 20.0% > MFU 5.0%" in why and "ridge 100" in why
    klass, why = classify_step(0.95, 0.3, 0.6, 200, 100)
    assert klass == "compute-bound" and "MFU 60.0% >= MBU 30.0%" in why
    assert "not assessed" in classify_step(None, 0.2, 0.05, 25, 100)[1]


def _session(steps_ms: dict, compiling_ms: tuple = ()) -> SessionStore:
    """Decode steps of ``{batch: ms}`` (10 each, eager), contexts 10..19; ``compiling_ms``:
    batch-1 steps decoded beside a compile."""
    store = SessionStore(meta=dict(META))
    t = 0
    for batch, ms in steps_ms.items():
        for step in range(10):
            seq = store.begin_token("decode", "eager", t, step, batch=batch, config=batch)
            t += int(ms * 1e6)
            store.end_token(seq, t, ms)
    for ms in compiling_ms:
        seq = store.begin_token("decode", "eager", t, 20, batch=1, config=1, compiling=True)
        t += int(ms * 1e6)
        store.end_token(seq, t, ms)
    return store


def test_config_summaries_of_a_two_batch_session():
    view = _session({1: 10.0, 4: 12.0}, compiling_ms=(30.0, 50.0)).view()
    one, four = config_summaries(view)
    assert (one.batch, four.batch) == (1, 4) and one.steps == 10
    assert one.tok_s == pytest.approx(100.0) and four.tok_s == pytest.approx(4000 / 12)
    # median context: prompt 9 + step + 1 over steps 2..9 (the first two are warm-up) -> 15
    assert four.context == 15
    nbytes = decode_step_bytes(CFG, 15, 4)["total"]
    assert four.mbu == pytest.approx(nbytes / 0.012 / 1e12)
    assert four.mfu == pytest.approx(decode_step_flops(CFG, 15, 4)["total"] / 0.012 / 100e12)
    assert four.klass == "memory-bound" and four.busy is None   # no kernel data on this session
    assert (one.compiling_steps, one.compiling_ms) == (2, 40.0)
    assert one.ms_step == 10.0                                  # the compile's steps left out


def test_steps_beside_a_compile_stay_out_of_the_clean_statistics():
    view = _session({1: 10.0}, compiling_ms=(30.0, 50.0)).view()
    ts = view.token_stats[("decode", "eager")]
    assert ts["host_ms"].count == 10 and ts["host_ms"].max == 10.0
    assert ts["compiling_ms"].count == 2 and ts["compiling_ms"].median == 40.0
    ms = mode_summaries(view)["eager"]
    assert ms.tokens == 10 and ms.ms_p99 == 10.0 and ms.window_tokens == 10


def test_findings_raise_the_batch_and_find_the_knee():
    view = _session({1: 10.0, 2: 10.5, 4: 11.0, 8: 19.0}).view(batch=1)
    found = {f.id: f for f in find(view)}
    raise_ = found["raise-batch"]
    mbu = config_summaries(view)[0].mbu
    assert raise_.title == f"At batch 1 you use {mbu:.0%} of the bandwidth you could: raise the batch (eager)"
    knee = found["batch-knee"]
    # tokens/s 100, 190.5, 363.6, 421.1: the doubling from 4 to 8 adds 16 % (< 25 %)
    assert knee.title == "Batch knee ≈118 (predicted); measured: eager past batch 4"
    stopped = found["batch-scaling-stopped"]
    assert stopped.title == "Past batch 4 tokens/s grows 16% per doubling (eager): memory-bound"
    assert raise_.evidence.startswith("100 tokens/s at 10.00 ms/step; MBU ")
    assert raise_.numbers["predicted_knee"] == pytest.approx(2.6e9 / 2.2e7)


def test_a_cpu_session_gets_no_gpu_class_and_no_batch_findings():
    """On a CPU, MBU/MFU against assumed GPU peaks read ~0 %: the class said "memory-bound"
    and a finding told the user to raise the batch to use the bandwidth."""
    store = _session({1: 10.0, 2: 10.5, 4: 11.0, 8: 19.0})
    store.meta["device"] = "cpu"
    view = store.view(batch=1)
    assert {s.klass for s in config_summaries(view)} == {"unknown"}
    ids = {f.id for f in find(view)}
    assert "gpu-unused" in ids and not ids & {"raise-batch", "batch-knee", "batch-scaling-stopped"}
