"""Resolving --model: registry names, local directories (safetensors), the HF cache."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from tuiprof.engine import model_defs
from tuiprof.engine.load import load_engine, load_model
from tuiprof.engine.source import resolve_model
from tuiprof.errors import TuiprofError

from ._helpers import run_engine


def _tiny_config() -> dict:
    return dict(model_defs.get_model_def("qwen3-tiny").config)


def test_registry_name(tmp_path):
    src = resolve_model("qwen3-tiny")
    assert (src.origin, src.family, src.weights, src.tokenizer) == ("registry", "qwen3", None, None)


def test_unknown_name_is_the_registry_error():
    with pytest.raises(TuiprofError, match=r"^unknown model 'qwen9'; known: .*qwen3-tiny.*cached "
                                           r"Hugging Face repo id\)$"):
        resolve_model("qwen9")


def test_malformed_config_json_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "hidden_size": \n')
    with pytest.raises(TuiprofError) as err:
        resolve_model(str(tmp_path))
    assert str(err.value).startswith(f"{tmp_path / 'config.json'} is not valid JSON: ")
    assert "\n" not in str(err.value)


def test_directory_problems(tmp_path):
    with pytest.raises(TuiprofError, match="has no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(TuiprofError, match="has no 'model_type'"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(_tiny_config()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(TuiprofError, match="pickle"):
        resolve_model(str(tmp_path))
    with pytest.raises(TuiprofError, match="no such model directory"):
        resolve_model(str(tmp_path / "missing"))


def test_uncached_repo_id_never_downloads():
    with pytest.raises(TuiprofError, match="not in the local Hugging Face cache"):
        resolve_model("tuiprof-tests/definitely-not-cached")


def test_directory_without_weights_is_random(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_tiny_config()))
    loaded = load_model(str(tmp_path), device="cpu", max_len=32)
    assert loaded.source.origin == "directory" and loaded.source.family == "qwen3"
    assert loaded.weights == "random (seed 0)" and loaded.params == 139_648


def test_directory_with_safetensors_loads_them(tmp_path, prompt):
    from tuiprof.engine.families import get_family

    donor = get_family("qwen3").build(model_defs.get_model_def("qwen3-tiny"), device="cpu",
                                      dtype="float32", seed=7, max_len=32)
    state = {k: v.contiguous() for k, v in donor.model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the embedding, as in HF checkpoints
    (tmp_path / "config.json").write_text(json.dumps(_tiny_config()))
    save_file(state, str(tmp_path / "model.safetensors"))

    loaded = load_model(str(tmp_path), device="cpu", seed=0, max_len=32)
    assert loaded.weights == f"loaded from {tmp_path}"
    got = loaded.adapter.model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in state.items())
    assert torch.equal(got["lm_head.weight"], state["model.embed_tokens.weight"])
    ids = prompt[:, :4]
    want = run_engine(donor, ids, max_new_tokens=8).token_ids
    assert run_engine(loaded.adapter, ids, max_new_tokens=8).token_ids == want

    engine = load_engine(str(tmp_path), device="cpu", prompt_len=4, max_new_tokens=8)
    assert engine.info["weights"] == f"loaded from {tmp_path}"
    assert engine.info["prompt"] == "random ids (4 tokens, seed 0)"


def test_mismatched_safetensors_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_tiny_config()))
    save_file({"model.embed_tokens.weight": torch.zeros(10, 64)}, str(tmp_path / "m.safetensors"))
    with pytest.raises(TuiprofError, match=r"'model.embed_tokens.weight' has shape \(10, 64\), "
                                           r"the model expects \(1024, 64\)"):
        load_model(str(tmp_path), device="cpu", max_len=32)


def test_engine_info(tiny):
    engine = load_engine("qwen3-tiny", device="cpu", prompt_len=5, max_new_tokens=10)
    info = engine.info
    assert info["model"] == "qwen3-tiny" and info["family"] == "qwen3"
    assert info["params"] == 139_648 and info["non_embedding_params"] == 139_648 - 65_536
    assert info["dtype"] == "float32" and info["weight_bytes"] == 4 * 139_648
    assert info["device"] == "cpu" and info["weights"] == "random (seed 0)"
    assert info["torch"] == torch.__version__ and info["compile_mode"] == "default"
    assert info["prompt_tokens"] == 5 and engine.prompt_ids.shape == (1, 5)
