"""Loading local safetensors weights: round trip, strict key/shape matching, one-line errors."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from workload_helpers import build_tiny
from tuiprof.errors import TuiprofError


def _logits(adapter) -> torch.Tensor:
    with torch.no_grad():
        return adapter.module(torch.arange(8).view(1, 8))


def test_cs336_round_trip(tmp_path):
    src = build_tiny("gpt2-tiny", seed=1)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in src.module.state_dict().items()}, str(path))
    loaded = build_tiny("gpt2-tiny", seed=2, weights=str(path))
    assert torch.equal(_logits(src), _logits(loaded))
    assert "layers.1.ffn.w2.weight" in src.module.state_dict()


def test_deepseek_round_trip_in_hf_key_layout(tmp_path):
    src = build_tiny("deepseek-tiny", seed=1)
    external = src.module.to_external(src.module.state_dict())
    assert external["model.layers.1.mlp.experts.7.down_proj.weight"].shape == (64, 32)
    assert "model.layers.1.mlp.shared_experts.gate_proj.weight" in external
    assert "model.layers.0.mlp.gate_proj.weight" in external  # the dense first layer
    tensors = {k: v.contiguous().clone() for k, v in external.items()}
    tensors["model.vision_model.patch.weight"] = torch.zeros(2)  # dropped by weights_ignore_prefixes
    save_file(tensors, str(tmp_path / "model-00001.safetensors"))
    loaded = build_tiny("deepseek-tiny", seed=2, weights=str(tmp_path),
                        weights_ignore_prefixes=["model.vision_model."])
    assert torch.equal(_logits(src), _logits(loaded))


def test_missing_and_unexpected_keys_fail_in_one_line(tmp_path):
    state = {k: v.contiguous() for k, v in build_tiny("nanochat-tiny").module.state_dict().items()}
    state.pop("lm_head.weight")
    state["transformer.extra.weight"] = torch.zeros(3)
    path = tmp_path / "bad.safetensors"
    save_file(state, str(path))
    with pytest.raises(TuiprofError) as err:
        build_tiny("nanochat-tiny", weights=str(path))
    msg = str(err.value)
    assert "\n" not in msg
    assert "1 missing (e.g. lm_head.weight)" in msg and "1 unexpected (e.g. transformer.extra.weight)" in msg


def test_wrong_shape_fails(tmp_path):
    state = {k: v.contiguous() for k, v in build_tiny("llama-layer-tiny").module.state_dict().items()}
    state["mlp.down_proj.weight"] = torch.zeros(64, 100)
    path = tmp_path / "bad.safetensors"
    save_file(state, str(path))
    with pytest.raises(TuiprofError, match=r"mlp.down_proj.weight: file \(64, 100\), model \(64, 172\)"):
        build_tiny("llama-layer-tiny", weights=str(path))


def test_unreadable_file_fails(tmp_path):
    path = tmp_path / "nothing.safetensors"
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(TuiprofError, match="cannot read weights"):
        build_tiny("gpt2-tiny", weights=str(path))
