"""Registry files, parameter counts and the unknown-model error."""
from __future__ import annotations

import json
import pathlib

import pytest
import torch

from tuiprof.engine import model_defs
from tuiprof.errors import TuiprofError


def test_registry_lists_the_qwen3_models():
    names = model_defs.list_models()
    assert "qwen3-0.6b" in names and "qwen3-tiny" in names
    # a checkout's top-level models/ (a wheel maps it into the package: tests/test_wheel.py)
    import tuiprof
    assert model_defs.models_dir() == pathlib.Path(tuiprof.__file__).resolve().parents[1] / "models"


def test_qwen3_0_6b_is_the_real_config():
    d = model_defs.get_model_def("qwen3-0.6b")
    c = d.config
    assert (d.family, d.dtype) == ("qwen3", "bfloat16")
    assert (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
            c["num_key_value_heads"], c["head_dim"], c["intermediate_size"],
            c["vocab_size"]) == (1024, 28, 16, 8, 128, 3072, 151936)
    assert c["rope_theta"] == 1e6 and c["rms_norm_eps"] == 1e-6
    assert c["tie_word_embeddings"] is True and c["max_position_embeddings"] == 40960


def test_qwen3_0_6b_param_count_closed_form():
    d = model_defs.get_model_def("qwen3-0.6b")
    total = model_defs.param_count(d)
    assert total == 596_049_920
    assert total - model_defs.embedding_params(d) == 440_467_456
    assert model_defs.weight_bytes(d) == 2 * total  # bf16
    assert model_defs.weight_bytes(d, "float32") == 4 * total


def test_tiny_param_count_matches_the_built_model(tiny):
    d = model_defs.get_model_def("qwen3-tiny")
    built = sum(p.numel() for p in tiny.adapter.model.parameters())
    assert model_defs.param_count(d) == built == 139_648 == tiny.params
    assert tiny.adapter.model.lm_head.weight is tiny.adapter.model.model.embed_tokens.weight


def test_unknown_model_is_one_line_with_the_known_names():
    with pytest.raises(TuiprofError) as err:
        model_defs.get_model_def("nope")
    msg = str(err.value)
    known = ", ".join(model_defs.list_models())
    assert msg == (f"unknown model 'nope'; known: {known} (or pass a directory with "
                   f"config.json, or a cached Hugging Face repo id)")
    assert "\n" not in msg


def test_models_dir_from_environment(tmp_path, monkeypatch):
    entry = {"name": "mine", "family": "qwen3", "description": "d", "dtype": "bfloat16",
             "config": json.loads((model_defs.models_dir() / "qwen3-tiny.json").read_text())["config"]}
    (tmp_path / "mine.json").write_text(json.dumps(entry))
    (tmp_path / "broken.json").write_text("{not json")
    monkeypatch.setenv("TUIPROF_MODELS_DIR", str(tmp_path))
    assert model_defs.list_models() == ["broken", "mine"]
    assert model_defs.param_count(model_defs.get_model_def("mine")) == 139_648
    with pytest.raises(TuiprofError, match="broken.json is not valid JSON"):
        model_defs.get_model_def("broken")


def test_linear_layers_in_forward_order(tiny):
    layers = tiny.adapter.linear_layers()
    assert layers[:7] == [
        ("model.layers.0.self_attn.q_proj", 64, 64), ("model.layers.0.self_attn.k_proj", 64, 32),
        ("model.layers.0.self_attn.v_proj", 64, 32), ("model.layers.0.self_attn.o_proj", 64, 64),
        ("model.layers.0.mlp.gate_proj", 64, 128), ("model.layers.0.mlp.up_proj", 64, 128),
        ("model.layers.0.mlp.down_proj", 128, 64)]
    assert layers[-1] == ("lm_head", 64, 1024) and len(layers) == 15


def test_random_weights_are_seeded():
    from tuiprof.engine.families import get_family

    d = model_defs.get_model_def("qwen3-tiny")
    build = get_family("qwen3").build
    a = build(d, device="cpu", dtype="float32", seed=3, max_len=16)
    b = build(d, device="cpu", dtype="float32", seed=3, max_len=16)
    c = build(d, device="cpu", dtype=torch.bfloat16, seed=4, max_len=16)
    wa, wb = a.model.model.layers[1].mlp.up_proj.weight, b.model.model.layers[1].mlp.up_proj.weight
    assert torch.equal(wa, wb)
    assert abs(wa.std().item() - 0.5) < 0.05  # initializer_range of qwen3-tiny
    assert c.model.dtype == torch.bfloat16
    assert not torch.equal(wa.bfloat16(), c.model.model.layers[1].mlp.up_proj.weight)
    assert a.model.model.rotary_emb.inv_freq[0].item() == 1.0  # rebuilt after to_empty


def test_a_models_data_folder_without_definitions_is_not_the_registry(tmp_path):
    """A checkout that kept an older layout's tuiprof/models_data (emptied of its JSON, its
    __pycache__ left) still finds the checkout's models/: on the GPU machine's copy every model
    read as unknown ("known: none")."""
    package = tmp_path / "tuiprof"
    (package / "models_data" / "__pycache__").mkdir(parents=True)
    (tmp_path / "models").mkdir()
    assert model_defs._models_dir(package) == tmp_path / "models"
    (package / "models_data" / "qwen3-tiny.json").write_text("{}")
    assert model_defs._models_dir(package) == package / "models_data"
