"""Compiled steps kept across sessions (:mod:`tuiprof.engine.precompiled`), with a real
``torch.compile`` on the CPU (inductor's C++ backend): a small module's step compiled ahead of
time is saved, loaded back and gives the same numbers, reads the weights at each call, and a
file that is stale (its guards refuse the inputs), corrupt or truncated is removed with one
line; a step that cannot be compiled whole is marked so; the directory stays bounded."""
from __future__ import annotations

import pytest
import torch

from tuiprof.engine import precompiled as pc


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 16)

    def decode(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * pos

    def broken(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        torch._dynamo.graph_break()
        return y * pos


FIELDS = {"max_len": 64, "prompt_len": 4, "compile_mode": "default", "adapter": "Tiny"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One step compiled ahead of time and saved (the compile is the slow part: once)."""
    root = tmp_path_factory.mktemp("precompiled")
    tiny = Tiny().eval()
    args = (torch.randn(2, 16), torch.tensor([3.0]))
    steps = pc.PrecompiledSteps(root, FIELDS)
    with torch.no_grad():
        fn, note = steps.compile("b1", tiny.decode, tiny, args, pc.mode_options("default"))
    return steps, tiny, args, fn, note


def test_saved_then_loaded_the_same_numbers_and_the_weights_read_at_each_call(saved):
    steps, tiny, args, fn, note = saved
    assert fn is not None and note == "", note
    path = steps.path("b1")
    assert path.exists() and path.parent == steps.dir and steps.dir.name == "precompiled"
    with torch.no_grad():
        eager = tiny.decode(*args)
        assert torch.allclose(fn(*args), eager, atol=1e-6)
        loaded, note = steps.load("b1", tiny, args, pc.mode_options("default"))
        assert note == "" and loaded is not None
        assert torch.allclose(loaded(*args), eager, atol=1e-6)
        tiny.lin.weight.mul_(2.0)            # not kept in the file: read from the module
        try:
            assert torch.allclose(loaded(*args), tiny.decode(*args), atol=1e-6)
        finally:
            tiny.lin.weight.div_(2.0)


def test_the_key_names_graph_shapes_torch_and_python(saved):
    steps = saved[0]
    assert steps.path("b1") != steps.path("dyn")
    other = pc.PrecompiledSteps(steps.dir.parent, {**FIELDS, "max_len": 128})
    assert other.path("b1") != steps.path("b1") and other.path("b1").parent == steps.dir


def test_a_stale_file_whose_guards_refuse_is_removed_with_one_line(saved, tmp_path):
    steps, tiny, args, _fn, _note = saved
    stale = pc.PrecompiledSteps(tmp_path, FIELDS)
    stale.dir.mkdir()
    stale.path("b1").write_bytes(steps.path("b1").read_bytes())
    wider = (torch.randn(2, 16, dtype=torch.float64), args[1])   # another dtype: refused
    fn, note = stale.load("b1", tiny, wider)
    assert fn is None and not stale.path("b1").exists()
    assert note.startswith("saved compiled step unusable (") and note.endswith("compiling afresh")
    assert "\n" not in note and len(note) < 200


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_corrupt_file_is_removed_with_one_line(saved, tmp_path, damage):
    steps, tiny, args, _fn, _note = saved
    bad = pc.PrecompiledSteps(tmp_path, FIELDS)
    bad.dir.mkdir()
    data = steps.path("b1").read_bytes()
    bad.path("b1").write_bytes({"truncated": data[: len(data) // 3], "garbage": b"\x80\x04junk" * 50,
                                "empty": b""}[damage])
    fn, note = bad.load("b1", tiny, args)
    assert fn is None and not bad.path("b1").exists()
    assert note.startswith("saved compiled step unusable (") and "\n" not in note
    assert bad.load("b1", tiny, args) == (None, "")     # gone: a fresh compile saves it again


def test_none_saved_is_no_message(tmp_path):
    steps = pc.PrecompiledSteps(tmp_path, FIELDS)
    assert steps.load("b1", Tiny(), (torch.randn(1, 16), torch.tensor([1.0]))) == (None, "")


def test_a_step_with_a_graph_break_is_marked_and_not_tried_again(tmp_path):
    tiny = Tiny().eval()
    steps = pc.PrecompiledSteps(tmp_path, FIELDS)
    with torch.no_grad():
        fn, note = steps.compile("dyn", tiny.broken, tiny, (torch.randn(2, 16), torch.tensor([1.0])),
                                 pc.mode_options("default"))
    assert fn is None and note.startswith("not compiled ahead of time (") and "\n" not in note
    assert steps.whole_refused("dyn") and not steps.whole_refused("b1")
    assert not steps.path("dyn").exists()


def test_bounded_least_recently_used_first(tmp_path):
    import os

    steps = pc.PrecompiledSteps(tmp_path, FIELDS, keep=2)
    steps.dir.mkdir()
    files = []
    for i in range(4):
        p = steps.dir / f"g{i}-0000.bin"
        p.write_bytes(b"x")
        os.utime(p, (1000 + i, 1000 + i))
        files.append(p)
    (steps.dir / "b1-0000.not-whole").write_text("marker")
    removed = steps.prune()
    assert set(removed) == {files[0], files[1]}
    assert files[2].exists() and files[3].exists() and (steps.dir / "b1-0000.not-whole").exists()


def test_loading_follows_the_compile_modes_cuda_graph_switch(saved, monkeypatch, tmp_path):
    """inductor reads ``triton.cudagraphs`` when a saved graph is loaded: the load runs with the
    compile mode's options in force (reduce-overhead: CUDA graphs), and leaves them as they were."""
    import torch._inductor.config as inductor_config

    saved_steps, tiny, args, _fn, _note = saved
    steps = pc.PrecompiledSteps(tmp_path, FIELDS)    # a copy: a load that fails removes it
    steps.dir.mkdir()
    data = saved_steps.path("b1").read_bytes()
    steps.path("b1").write_bytes(data)
    seen = []
    real = torch.compiler.load_compiled_function

    def spy(fh, *a, **k):
        seen.append(inductor_config.triton.cudagraphs)
        return real(fh, *a, **k)

    monkeypatch.setattr(torch.compiler, "load_compiled_function", spy)
    before = inductor_config.triton.cudagraphs
    for mode in ("reduce-overhead", "default"):
        steps.path("b1").write_bytes(data)
        steps.load("b1", tiny, args, pc.mode_options(mode))
    assert seen == [True, before] and inductor_config.triton.cudagraphs == before


def test_the_switch_and_the_graphs(monkeypatch):
    monkeypatch.setenv(pc.ENV, "off")
    assert not pc.supported()
    monkeypatch.delenv(pc.ENV)
    assert pc.supported() == hasattr(torch.compiler, "load_compiled_function")
    assert (pc.graph_of(1), pc.graph_of(2), pc.graph_of(64)) == ("b1", "dyn", "dyn")
    opts = pc.mode_options("reduce-overhead")
    assert opts.get("triton.cudagraphs") is True and callable(opts.get("guard_filter_fn"))


def test_a_step_that_fails_at_its_first_call_is_discarded_and_marked(saved, tmp_path):
    steps, _tiny, _args, _fn, _note = saved
    bad = pc.PrecompiledSteps(tmp_path, FIELDS)
    bad.dir.mkdir()
    bad.path("b1").write_bytes(steps.path("b1").read_bytes())
    note = bad.discard("b1", RuntimeError("an unexpected call\nsecond line"))
    assert not bad.path("b1").exists() and bad.whole_refused("b1")
    assert note.startswith("compiled step ahead of time failed (RuntimeError: an unexpected call")
    assert note.endswith("compiling as before") and "\n" not in note


def test_compiled_ahead_of_time_where_dynamos_switch_is_off_by_default(tmp_path, monkeypatch):
    """torch 2.11 keeps ``enable_aot_compile`` off by default: ``torch.compile``'s result then
    has no ``aot_compile``. The compile turns it on for its own call (and leaves it as it was)."""
    import torch._dynamo.config as dynamo_config

    if not hasattr(dynamo_config, "enable_aot_compile"):
        pytest.skip("this torch has no enable_aot_compile switch")
    monkeypatch.setattr(dynamo_config, "enable_aot_compile", False)
    tiny = Tiny().eval()
    args = (torch.randn(2, 16), torch.tensor([2.0]))
    steps = pc.PrecompiledSteps(tmp_path, FIELDS)
    with torch.no_grad():
        fn, note = steps.compile("b1", tiny.decode, tiny, args, pc.mode_options("default"))
        assert fn is not None and note == "", note
        assert steps.path("b1").exists() and not steps.whole_refused("b1")
        assert torch.allclose(fn(*args), tiny.decode(*args), atol=1e-6)
    assert dynamo_config.enable_aot_compile is False


def test_a_marker_of_an_earlier_format_is_not_this_ones(tmp_path, monkeypatch):
    """Markers written before a format change (say, "cannot be compiled ahead of time" from a
    tuiprof that never turned the switch on) do not stop this one trying."""
    steps = pc.PrecompiledSteps(tmp_path, FIELDS)
    now = steps.path("b1")
    monkeypatch.setattr(pc, "FORMAT", pc.FORMAT - 1)
    old = steps.path("b1")
    assert old != now and old.parent == now.parent
    old.parent.mkdir(parents=True)
    old.with_suffix(pc.NOT_WHOLE).write_text("AttributeError: no aot_compile\n")
    monkeypatch.setattr(pc, "FORMAT", pc.FORMAT + 1)
    assert not steps.whole_refused("b1")
