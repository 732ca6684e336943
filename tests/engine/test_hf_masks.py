"""The engine's HF step gets its attention masks made before the forward, as ``generate()``'s
does: the same masks, the same logits, and a compiled step whose graph is ``generate()``'s."""
from __future__ import annotations

import collections
import functools
import json
import pathlib

import pytest
import torch
from transformers import AutoModelForCausalLM, CompileConfig, Qwen3Config

from tuiprof.engine.hf_adapter import HFDecoderAdapter
from tuiprof.engine.hf_masks import make_masks

from .conftest import MAX_LEN, PROMPT_LEN

MODELS = pathlib.Path(__file__).parents[2] / "models"
# Ops that make no kernel: a graph that differs only in these computes the same
VIEWS = {"view", "_unsafe_view", "expand", "select", "unsqueeze", "slice", "t", "transpose",
         "getitem"}


def _qwen(**over) -> torch.nn.Module:
    config = json.loads((MODELS / "qwen3-tiny.json").read_text())["config"] | over
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(Qwen3Config(**config), dtype=torch.float32).eval()


def _decode(adapter: HFDecoderAdapter, batch: int, steps: int, with_masks: bool):
    """Greedy steps after a prefill: (logits per step, the masks object)."""
    cache = adapter.new_cache(batch)
    masks = adapter.decode_masks(cache, batch) if with_masks else None
    ids = torch.randint(0, 100, (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    tok = adapter.prefill(ids, cache).argmax(-1).view(-1, 1)
    pos, out = torch.tensor([PROMPT_LEN]), []
    for i in range(steps):
        given = masks.at(pos, PROMPT_LEN + i) if masks is not None else None
        if given is not None:  # what generate() would have made for this step
            want = make_masks(adapter._make_masks, adapter.model, cache,
                              pos.view(1, 1).expand(batch, 1),
                              torch.ones((batch, PROMPT_LEN + i + 1), dtype=torch.long))
            assert set(given) == set(want)
            for key in want:
                assert torch.equal(given[key], want[key]), (i, key)
        logits = adapter.decode(tok, pos, cache, given)
        out.append(logits)
        tok, pos = logits.argmax(-1).view(-1, 1), pos + 1
    return out, masks


@pytest.mark.parametrize("batch", [1, 3])
def test_plain_causal_masks_are_one_tensor_rewritten_each_step(batch):
    adapter = HFDecoderAdapter(_qwen(), MAX_LEN)
    with torch.no_grad():
        given, masks = _decode(adapter, batch, 6, with_masks=True)
        own, _ = _decode(adapter, batch, 6, with_masks=False)
    assert masks.fast and len(masks.tensors()) == 1
    assert masks.tensors()[0].shape == (batch, 1, 1, MAX_LEN)
    for a, b in zip(given, own):
        torch.testing.assert_close(a, b)


def test_sliding_window_layers_get_the_models_own_masks_each_step():
    model = _qwen(use_sliding_window=True, sliding_window=4, max_window_layers=1)
    assert "sliding_attention" in model.config.layer_types
    adapter = HFDecoderAdapter(model, MAX_LEN)
    with torch.no_grad():
        given, masks = _decode(adapter, 2, 6, with_masks=True)   # past the window
        own, _ = _decode(adapter, 2, 6, with_masks=False)
    assert not masks.fast and masks.tensors() == []
    for a, b in zip(given, own):
        torch.testing.assert_close(a, b)


def _recorder(graphs: list):
    from torch._dynamo.backends.common import aot_autograd

    def forward(gm, _inputs):
        graphs.append(collections.Counter(
            str(n.target).split(".")[1] if str(n.target).startswith("aten.") else str(n.target)
            for n in gm.graph.nodes if n.op == "call_function"))
        return gm.forward
    return aot_autograd(fw_compiler=forward)


def _computing(ops: collections.Counter) -> collections.Counter:
    return collections.Counter({k: v for k, v in ops.items() if k not in VIEWS
                                and not k.startswith("<built-in")})


def test_the_compiled_step_is_the_graph_generate_compiles():
    """The engine's compiled decode and transformers' own compiled forward in ``generate()``
    (static cache) compute the same ops: the masks are inputs of both."""
    torch._dynamo.reset()
    model = _qwen()
    adapter = HFDecoderAdapter(model, MAX_LEN)
    engine: list = []
    step = torch.compile(adapter.decode, backend=_recorder(engine))
    with torch.no_grad():
        cache = adapter.new_cache(1)
        masks = adapter.decode_masks(cache, 1)
        ids = torch.randint(0, 100, (1, PROMPT_LEN))
        tok = adapter.prefill(ids, cache).argmax(-1).view(-1, 1)
        pos = torch.tensor([PROMPT_LEN])
        for i in range(2):
            step(tok, pos, cache, masks.at(pos, PROMPT_LEN + i))
            pos = pos + 1
    theirs: list = []
    config = CompileConfig(backend=_recorder(theirs), fullgraph=False)
    config._compile_all_devices = True   # transformers compiles by itself on a GPU only
    model.generate(ids, max_new_tokens=3, min_new_tokens=3, attention_mask=torch.ones_like(ids),
                   do_sample=False, pad_token_id=0, cache_implementation="static",
                   compile_config=config)
    torch._dynamo.reset()
    assert len(engine) == 1 and len(theirs) == 1, (len(engine), len(theirs))
    mine, gen = _computing(engine[0]), _computing(theirs[0])
    assert mine == gen, (mine - gen, gen - mine)
    assert "le" not in mine   # no mask built inside the graph


def test_the_engine_settles_the_masks_in_its_prefill(tiny, prompt):
    """The masks' one check (the model's own masks, read back) runs in the prefill step, so
    no decode step carries its kernels; every decode step then rewrites one tensor."""
    from tuiprof.engine.generate import Engine

    calls = []
    real = tiny.adapter._make_masks
    engine = Engine(tiny.adapter, prompt, device="cpu", max_new_tokens=6)

    @functools.wraps(real)   # its signature: the cache argument's name
    def counting(**kw):   # (query length, steps finished when made)
        calls.append((kw["inputs_embeds"].shape[1], engine.tokens))
        return real(**kw)

    tiny.adapter._make_masks = counting
    try:
        engine.run()
    finally:
        tiny.adapter._make_masks = real
    assert engine.error is None and engine.tokens == 6
    # the prefill's own masks, then the check's: both in the prefill step (0 steps finished)
    assert calls == [(PROMPT_LEN, 0), (1, 0)], calls
    assert engine._live.masks.fast
