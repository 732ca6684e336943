"""Start-up (docs/performance.md#start-up-from-the-command-to-the-first-token): the fast build path gives the same weights, ``load_engine`` reports its
phases in order (bytes for weights), and an eager start of a torch-only model imports neither
transformers nor torch.compile's machinery."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from tuiprof.engine import model_defs
from tuiprof.engine.families import cs336, deepseek, llama_layer, nanochat
from tuiprof.engine.families._build import with_max_len
from tuiprof.engine.families._decoder import _mark_static
from tuiprof.engine.hf_adapter import _rebuild_rotary
from tuiprof.engine.load import expected_meta, load_engine, load_model
from tuiprof.startup import LoadProgress, Phase, ProgressTracker, tracking

MAX_LEN = 48
SEED = 3


# ------------------------------------------------------- the build before the fast path
def _reference_qwen3(defn) -> nn.Module:
    """``hf.build_random`` as it was: meta build, ``to_empty``, seeded fills in order."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config.from_dict({k: v for k, v in defn.config.items() if k != "model_type"})
    with torch.device("meta"):
        model = Qwen3ForCausalLM._from_config(cfg, dtype=torch.float32)
    model.to_empty(device="cpu")
    model.tie_weights()
    gen = torch.Generator(device="cpu").manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, float(cfg.initializer_range), generator=gen)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
    _rebuild_rotary(model, torch.device("cpu"))
    return model


def _reference_module(model_cls, config) -> nn.Module:
    """``_build.build_module`` + ``init_random`` as they were (nn.init on meta, to_empty)."""
    with torch.device("meta"):
        module = model_cls(config)
    module = module.to(dtype=torch.float32).to_empty(device="cpu")
    gen = torch.Generator(device="cpu").manual_seed(SEED)
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    with torch.no_grad():
        for _, p in module.named_parameters():
            if id(p) in embeddings:
                p.normal_(0.0, 1.0, generator=gen)
            elif p.ndim >= 2:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)
            else:
                p.fill_(1.0)
    module.init_buffers(gen)
    return module


STUDY = {"nanochat-tiny": (nanochat.NanochatGPT, "sequence_len"),
         "llama-layer-tiny": (llama_layer.LlamaLayerLM, "max_len"),
         "deepseek-tiny": (deepseek.DeepseekDecoder, "max_len"),
         "gpt2-tiny": (cs336.TransformerLM, "context_length")}


@pytest.mark.parametrize("name", ["qwen3-tiny", *STUDY])
def test_fast_path_builds_the_same_weights_for_the_same_seed(name):
    defn = model_defs.get_model_def(name)
    new = load_model(name, device="cpu", dtype="float32", seed=SEED, max_len=MAX_LEN).adapter
    if name in STUDY:
        cls, key = STUDY[name]
        old, new = _reference_module(cls, with_max_len(defn.config, key, MAX_LEN)), new.module
    else:
        old, new = _reference_qwen3(defn), new.model
    old_t = dict(old.named_parameters()) | dict(old.named_buffers())
    new_t = dict(new.named_parameters()) | dict(new.named_buffers())
    assert old_t.keys() == new_t.keys()
    for key, t in old_t.items():
        assert torch.equal(t, new_t[key]), key
    # a different seed draws different weights (the comparison can fail)
    other = load_model(name, device="cpu", dtype="float32", seed=SEED + 1, max_len=MAX_LEN).adapter
    other_t = dict((other.module if name in STUDY else other.model).named_parameters())
    assert any(not torch.equal(t, other_t[k]) for k, t in old.named_parameters() if t.ndim >= 2)


# ------------------------------------------------------------ progress reporting
def _phases(progress: LoadProgress) -> list[str]:
    return [p.name for p in progress.phases]


def test_load_engine_reports_its_phases_in_order():
    tracker = ProgressTracker()
    with tracking(tracker):
        engine = load_engine("qwen3-tiny", device="cpu", prompt=None, max_new_tokens=8)
    names = _phases(tracker.progress)
    assert names == ["importing torch", "importing model code", "building model",
                     "initialising weights", "allocating KV cache"]
    p = tracker.progress
    assert all(ph.end_s is not None and ph.end_s >= ph.start_s for ph in p.phases)
    starts = [ph.start_s for ph in p.phases]
    assert starts == sorted(starts)
    init = p.phases[3]
    module = engine.adapter.model
    total = sum(t.numel() * t.element_size() for t in module.parameters())
    assert (init.done, init.total, init.unit) == (total, total, "bytes")
    assert dict(p.facts) == {"device": "cpu", "dtype": "float32"}


def test_local_safetensors_weights_report_bytes_read(tmp_path):
    """A local HF directory (qwen3) and a study model's --weights file: phase "loading
    weights" counts the bytes read up to the files' tensor data, and nothing is drawn at random
    first."""
    donor = load_model("qwen3-tiny", device="cpu", seed=1, max_len=32).adapter.model
    (tmp_path / "config.json").write_text(json.dumps(model_defs.get_model_def("qwen3-tiny").config))
    state = {k: v.contiguous() for k, v in donor.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp_path / "model.safetensors"))
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    small = load_model("nanochat-tiny", device="cpu", seed=1).adapter.module
    save_file({k: v.contiguous() for k, v in small.state_dict().items()}, str(tmp_path / "n.st"))
    for spec, weights, want in ((str(tmp_path), None, nbytes),
                                ("nanochat-tiny", str(tmp_path / "n.st"),
                                 sum(t.numel() * t.element_size() for t in small.state_dict().values()))):
        tracker = ProgressTracker()
        with tracking(tracker):
            load_engine(spec, device="cpu", weights=weights, prompt=None, max_new_tokens=8)
        names = _phases(tracker.progress)
        assert "loading weights" in names and "initialising weights" not in names, names
        loading = tracker.progress.phases[names.index("loading weights")]
        assert (loading.done, loading.total, loading.unit) == (want, want, "bytes")


def test_tracker_line_bounds_and_breakdown():
    tracker = ProgressTracker(t0=100.0)
    tracker.add("starting session process", 0.0, 0.4)
    tracker.begin("building model")
    tracker.begin("initialising weights")
    tracker.advance(310_000_000, 1_190_000_000)
    line = tracker.progress.line(now=104.2)
    assert line == "4.2 s · building model · initialising weights 0.31/1.19 GB"
    assert tracker.progress.line(clock=False).startswith("building model")
    tracker.first_token()
    p = tracker.progress
    assert p.first_token_s is not None and not p.open_phases()
    d = p.as_dict()
    assert [x["name"] for x in d["phases"]] == ["starting session process", "building model",
                                                 "initialising weights"]
    assert d["phases"][0]["seconds"] == 0.4 and d["phases"][2]["unit"] == "bytes"
    for i in range(100):  # bounded, whatever reports
        tracker.begin(f"phase {i}")
    assert len(tracker.progress.phases) == 32
    assert Phase("x", 0.0, None, 12, 28, "layers").amount() == "12/28 layers"


def test_expected_meta_is_known_before_anything_is_built():
    assert expected_meta("qwen3-tiny", device="cpu", seed=5) == {
        "model": "qwen3-tiny", "family": "qwen3", "device": "cpu", "dtype": "float32",
        "weights": "random (seed 5)"}
    assert expected_meta("qwen3-0.6b", device="cuda")["dtype"] == "bfloat16"
    assert expected_meta("no-such-model") == {}


# ------------------------------------------------------------ what an eager start imports
def test_mark_static_without_dynamo_sets_what_dynamo_sets(monkeypatch):
    import torch._dynamo

    a, b = torch.zeros(2), torch.zeros(2)
    torch._dynamo.mark_static_address(a)
    monkeypatch.delitem(sys.modules, "torch._dynamo")  # as in an eager session's process
    _mark_static(b)
    assert a.__dict__ == b.__dict__ and a.__dict__


def test_eager_start_of_a_torch_only_model_imports_no_transformers_dynamo_or_sympy():
    """nanochat needs only torch: building it on the meta device used to import torch._dynamo
    (nn.init's meta kernels) and sympy (to_empty), and engine_info transformers."""
    code = ("import sys\n"
            "from tuiprof.engine.load import load_engine\n"
            "e = load_engine('nanochat-tiny', device='cpu', prompt=None, max_new_tokens=3)\n"
            "e.run()\n"
            "assert e.tokens == 3, e.error\n"
            "print(sorted(m for m in ('transformers', 'torch._dynamo', 'sympy') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
