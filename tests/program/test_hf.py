"""transformers' own loops, unchanged, give one step per forward: generate() with a dynamic
cache, a static cache, a compiled forward, and continuous batching with a varying batch."""
from __future__ import annotations

import json
import sys

import pytest
import torch

from tuiprof.program.hf import TransformersSteps, _PostImport
from tuiprof.program.steps import StepRecorder

from .conftest import REPO, rows

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model():
    config = json.loads((REPO / "models" / "qwen3-tiny.json").read_text())["config"]
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(
        transformers.Qwen3Config(**config)).eval()


@pytest.fixture
def hooked(prof):
    steps = TransformersSteps(StepRecorder(prof))
    steps.install()
    yield steps
    steps.uninstall()


def _generate(model, batch, new, **kw):
    ids = torch.randint(0, 1024, (batch, 8), generator=torch.Generator().manual_seed(batch))
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                          min_new_tokens=new, do_sample=False, pad_token_id=0, **kw)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_steps_batch_and_phase(model, hooked, prof, cache):
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    out1 = _generate(model, 1, 4, **kw)
    out2 = _generate(model, 2, 5, **kw)
    got = [(t.phase, t.batch, t.positions, t.cycle, t.mode) for t in rows(prof)]
    assert got == ([("prefill", 1, 8, 0, "eager")] + [("decode", 1, 1, 0, "eager")] * 3
                   + [("prefill", 2, 16, 1, "eager")] + [("decode", 2, 2, 1, "eager")] * 4)
    assert out1.shape == (1, 12) and out2.shape == (2, 13)   # the program's results unchanged
    assert hooked.recorder.source == "transformers"


@pytest.mark.slow
def test_compiled_forward_keeps_one_step_per_forward(model, hooked, prof):
    """transformers' own compiled decode (static cache): torch.compile of ``__call__``, the GPU
    path, here with the eager backend so that it runs on the CPU in seconds."""
    cc = transformers.CompileConfig(backend="eager")
    cc._compile_all_devices = True      # what a GPU allows by itself
    ref = _generate(model, 2, 5, cache_implementation="static")
    out = _generate(model, 2, 5, cache_implementation="static", compile_config=cc)
    assert torch.equal(ref, out)
    got = [(t.phase, t.mode, t.batch) for t in rows(prof)][5:]
    assert got == [("prefill", "eager", 2)] + [("decode", "compiled", 2)] * 4


def test_continuous_batching_records_a_varying_batch(model, hooked, prof):
    cb = getattr(transformers, "ContinuousBatchingConfig", None)
    if cb is None or not hasattr(model, "continuous_batching_context_manager"):
        pytest.skip("no continuous batching in this transformers")
    gc = transformers.GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=None,
                                       pad_token_id=0)
    with model.continuous_batching_context_manager(
            generation_config=gc, continuous_batching_config=cb(num_blocks=8, max_batch_tokens=64),
            block=True, timeout=5, warmup=False) as manager:
        manager.add_request([1, 2, 3, 4, 5], max_new_tokens=3)
        manager.add_request([6, 7, 8], max_new_tokens=6)
        done = 0
        while done < 2:
            res = manager.get_result(timeout=10)
            assert res is not None
            done += res.is_finished()
    got = [(t.phase, t.batch, t.positions) for t in rows(prof)]
    assert got[0] == ("prefill", 2, 8)
    assert [b for _, b, _ in got[1:]] == [2, 2, 1, 1, 1]    # one request finished early
    assert all(p == "decode" for p, _, _ in got[1:])


def test_uninstall_restores_transformers(model, prof):
    from transformers.generation import utils
    from transformers.generation.continuous_batching import continuous_api

    before = (utils.GenerationMixin.generate, continuous_api.ContinuousBatchingManager._generation_step)
    steps = TransformersSteps(StepRecorder(prof))
    steps.install()
    assert utils.GenerationMixin.generate is not before[0]
    _generate(model, 1, 2)
    steps.uninstall()
    after = (utils.GenerationMixin.generate, continuous_api.ContinuousBatchingManager._generation_step)
    assert after == before
    assert "prepare_inputs_for_generation" not in vars(model)
    assert not any(isinstance(f, _PostImport) for f in sys.meta_path)


def test_the_patch_waits_for_the_program_to_import_the_module(tmp_path, monkeypatch):
    (tmp_path / "late_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = _PostImport({"late_module": lambda mod: seen.append(mod.VALUE)})
    sys.meta_path.insert(0, finder)
    try:
        import late_module  # noqa: F401
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("late_module", None)
    assert seen == [1]
