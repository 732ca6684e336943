"""Batched decode on the CPU: the batch is one forward over every sequence (not a loop), its
outputs equal each sequence run alone, and the engine switches batch in-session, falling back
to the last batch that fitted when memory runs out (a real allocation failure under an OS
memory limit)."""
from __future__ import annotations

import re
import resource

import pytest
import torch

from tuiprof.engine.events import CollectingListener
from tuiprof.engine.generate import Engine
from tuiprof.engine.switching import extend_prompt

from ._helpers import ActionListener, run_engine
from .conftest import PROMPT_LEN

STEPS = 10
BATCH = 4


def _greedy(adapter, prompt: torch.Tensor, steps: int) -> list[list[int]]:
    """Per-sequence greedy tokens of ``prompt [B, T]`` decoded together (adapter level)."""
    cache = adapter.new_cache(prompt.shape[0])
    with torch.no_grad():
        tok = adapter.prefill(prompt, cache).argmax(-1)
        out = [tok.tolist()]
        pos = torch.tensor([prompt.shape[1]])
        for _ in range(steps - 1):
            tok = adapter.decode(tok.view(-1, 1), pos, cache).argmax(-1)
            pos += 1
            out.append(tok.tolist())
    return [list(seq) for seq in zip(*out)]


@pytest.fixture(scope="module", params=["qwen3-tiny", "nanochat-tiny"])
def model(request, tiny):
    from tuiprof.engine.load import load_model

    return tiny if request.param == "qwen3-tiny" else load_model(
        request.param, device="cpu", seed=0, max_len=64)


def test_batch_is_one_forward_and_equals_each_sequence_alone(model):
    adapter = model.adapter
    prompts = extend_prompt(torch.randint(0, adapter.vocab_size, (1, PROMPT_LEN),
                                          generator=torch.Generator().manual_seed(1)),
                            BATCH, adapter.vocab_size, seed=1)
    assert len({tuple(r) for r in prompts.tolist()}) == BATCH        # different prompts
    module = getattr(adapter, "model", None) or adapter.module
    first = next(m for m in module.modules() if isinstance(m, torch.nn.Linear))
    rows: list[int] = []
    hook = first.register_forward_hook(lambda m, a, o: rows.append(a[0].shape[0]))
    try:
        together = _greedy(adapter, prompts, STEPS)
    finally:
        hook.remove()
    assert rows == [BATCH] * STEPS            # one forward per step, over all 4 sequences
    alone = [_greedy(adapter, prompts[i:i + 1], STEPS)[0] for i in range(BATCH)]
    assert together == alone
    assert len({tuple(s) for s in together}) > 1   # the sequences really differ


def test_engine_reports_every_sequence_of_a_step(tiny, prompt):
    prompts = extend_prompt(prompt, BATCH, tiny.adapter.vocab_size, seed=0)
    listener = run_engine(tiny.adapter, prompts, max_new_tokens=STEPS)
    assert all(e.batch == BATCH for e in listener.events)
    assert [e.phase for e in listener.events] == ["prefill"] + ["decode"] * (STEPS - 1)
    per_seq = [list(s) for s in zip(*[e.token_ids for e in listener.events])]
    assert per_seq == _greedy(tiny.adapter, prompts, STEPS)
    alone = run_engine(tiny.adapter, prompt, max_new_tokens=STEPS)   # row 0 is the prompt
    assert per_seq[0] == alone.token_ids and all(e.token_ids is None for e in alone.events)


def test_batch_switch_restarts_from_the_prompts_at_the_new_batch(tiny, prompt):
    engine: Engine | None = None
    listener = ActionListener({3: lambda: engine.request_batch(2)})
    engine = Engine(tiny.adapter, prompt, device="cpu", max_new_tokens=STEPS, listener=listener)
    engine.run()
    assert engine.error is None and engine.batch == 2
    evs = listener.events
    assert [(e.phase, e.batch, e.cycle) for e in evs[:6]] == [
        ("prefill", 1, 0), ("decode", 1, 0), ("decode", 1, 0), ("decode", 1, 0),
        ("prefill", 2, 1), ("decode", 2, 1)]
    at2 = [e.token_ids for e in evs if e.batch == 2]
    assert [list(s) for s in zip(*at2)] == _greedy(
        tiny.adapter, extend_prompt(prompt, 2, tiny.adapter.vocab_size, seed=0), STEPS)


def test_batch_requests_stay_within_limits(tiny, prompt):
    engine = Engine(tiny.adapter, prompt, device="cpu", max_batch=8)
    assert engine.request_batch(64) == "switching to batch 8 at the next token"
    assert engine.request_batch(0) == "switching to batch 1 at the next token"


def _vm_data() -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(r"VmData:\s+(\d+) kB", fh.read())[1]) * 1024


def test_growing_past_memory_falls_back_to_the_last_batch_that_fitted(tiny, prompt):
    """An OS limit on this process's data memory (RLIMIT_DATA) makes the cache allocation
    for a huge batch fail for real; the engine stays at its batch and says so in one line."""
    per_seq = tiny.adapter.cache_bytes(1)
    big = 2 ** max(1, (512 * 2 ** 20 // per_seq).bit_length())   # a cache of >= 512 MiB
    engine: Engine | None = None
    listener = ActionListener({4: lambda: engine.request_batch(2),
                               9: lambda: engine.request_batch(big)})
    engine = Engine(tiny.adapter, prompt, device="cpu", max_new_tokens=None, listener=listener,
                    max_batch=big)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (_vm_data() + 256 * 2 ** 20, hard))
    try:
        engine.start()
        assert engine.join(60)
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    assert engine.error is None and engine.state == "done"
    notes = [m for _s, m in listener.states if m.startswith("out of memory")]
    assert len(notes) == 1 and "\n" not in notes[0], listener.states
    assert notes[0].startswith(f"out of memory at batch {big} (tried to allocate ")
    assert notes[0].endswith("back to batch 2, the last that fitted")
    assert engine.batch == 2 and engine.want_batch == 2
    assert {e.batch for e in listener.events[9:]} == {2}     # decoding went on at batch 2
    assert len(listener.events) == 1 + 4 + 1 + 64 - PROMPT_LEN   # the batch-2 cycle ran out
