"""transformers' own loops, unchanged, give one step per forward: generate() with a dynamic
cache, a static cache, a compiled forward, and continuous batching with a varying batch."""
from __future__ import annotations

import sys

import pytest
import torch

from tuiprof.program.import_hooks import PostImport
from tuiprof.program.transformers_steps import TransformersSteps
from tuiprof.program.steps import StepRecorder

from .conftest import rows, tiny_qwen3

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


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


def test_step_bookkeeping_waits_for_the_forward_to_be_launched(model, hooked, prof):
    """The store's work for a step boundary is done when generate() runs its logits processors
    (the forward is queued, the device busy), not at the boundary before the forward launches:
    at decode step k's forward the previous step is not stored yet; at its logits processors it
    is. Nothing is lost: every step is stored by the end."""
    seen = {"forward": [], "logits": []}

    def done_steps() -> int:
        return len(rows(prof))

    class Probe(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            seen["logits"].append(done_steps())
            return scores

    handle = model.register_forward_pre_hook(lambda mod, args: seen["forward"].append(done_steps()))
    try:
        ids = torch.randint(0, 1024, (1, 8), generator=torch.Generator().manual_seed(3))
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                       min_new_tokens=5, do_sample=False, pad_token_id=0,
                       logits_processor=transformers.LogitsProcessorList([Probe()]))
    finally:
        handle.remove()
    # forward k (k = 0: the prefill) comes after steps 0..k-1 ended. From k = 2 on, only k-1 of
    # them are stored then (step k-1's end waits for the launch); at k = 1 the state change
    # (prefill -> decode) stores everything at once, as it does for the engine.
    assert seen["forward"] == [0, 1, 1, 2, 3]
    assert seen["logits"] == [0, 1, 2, 3, 4]
    assert [t.phase for t in rows(prof)] == ["prefill"] + ["decode"] * 4


def test_a_source_without_a_launch_point_stores_each_step_at_its_end(prof):
    """Once one source has reported launches, a step of another that never does is still
    stored at its own boundary (the queue never holds more than the open step's work)."""
    rec = StepRecorder(prof, sources=("transformers", "api"))
    rec.enter_scope("transformers")
    rec.begin("transformers", "prefill", positions=8)
    rec.launched("transformers")
    rec.exit_scope("transformers")
    assert len(rows(prof)) == 1
    for i in range(3):
        with rec.api_step("decode", tokens=2):
            pass
        assert len(rows(prof)) == 2 + i
    assert [(t.phase, t.batch) for t in rows(prof)] == [("prefill", 1)] + [("decode", 2)] * 3


def test_uninstall_restores_transformers(model, prof):
    from transformers.generation import logits_process, utils
    from transformers.generation.continuous_batching import continuous_api

    def patched():
        return (utils.GenerationMixin.generate,
                continuous_api.ContinuousBatchingManager._generation_step,
                logits_process.LogitsProcessorList.__call__)

    before = patched()
    steps = TransformersSteps(StepRecorder(prof))
    steps.install()
    assert utils.GenerationMixin.generate is not before[0]
    assert logits_process.LogitsProcessorList.__call__ is not before[2]
    _generate(model, 1, 2)
    steps.uninstall()
    after = patched()
    assert after == before
    assert "prepare_inputs_for_generation" not in vars(model)
    assert not any(isinstance(f, PostImport) for f in sys.meta_path)


def test_the_patch_waits_for_the_program_to_import_the_module(tmp_path, monkeypatch):
    (tmp_path / "late_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = PostImport({"late_module": lambda mod: seen.append(mod.VALUE)})
    sys.meta_path.insert(0, finder)
    try:
        import late_module  # noqa: F401
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("late_module", None)
    assert seen == [1]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_each_step_marks_its_model_forward_apart_from_generates_own_work(model, hooked, prof,
                                                                         cache):
    """The host window given for a step's model forward holds the forward (module hooks at its
    first and last Python line) and none of generate()'s own work after it (its logits
    processors), and lies inside the step."""
    marks: list[tuple[str, int]] = []
    clock = hooked.recorder.clock   # the clock of the step marks

    class Probe(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            marks.append(("logits", clock()))
            return scores

    pre = model.register_forward_pre_hook(lambda *a: marks.append(("in", clock())))
    post = model.register_forward_hook(lambda *a: marks.append(("out", clock())))
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    try:
        ids = torch.randint(0, 1024, (2, 8), generator=torch.Generator().manual_seed(5))
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                       min_new_tokens=5, do_sample=False, pad_token_id=0,
                       logits_processor=transformers.LogitsProcessorList([Probe()]), **kw)
    finally:
        pre.remove()
        post.remove()
    steps = rows(prof)
    assert len(steps) == 5
    ins = [t for k, t in marks if k == "in"]
    outs = [t for k, t in marks if k == "out"]
    logits = [t for k, t in marks if k == "logits"]
    for row, t_in, t_out, t_logits in zip(steps, ins, outs, logits):
        assert row.start_ns <= row.model_start_ns <= t_in, row
        assert t_out <= row.model_end_ns <= t_logits <= row.end_ns, row
