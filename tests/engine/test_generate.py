"""The generation engine on qwen3-tiny (CPU, eager): cache correctness and thread commands."""
from __future__ import annotations

import time

import pytest
import torch

from tuiprof.engine.events import CollectingListener
from tuiprof.engine.generate import Engine

from ._helpers import run_engine, wait_for
from .conftest import MAX_LEN, PROMPT_LEN

STEPS = 20


@pytest.fixture(scope="module")
def reference(tiny, prompt) -> list[int]:
    """Greedy tokens recomputed over the whole sequence each step, without any cache."""
    seq = prompt.clone()
    out = []
    with torch.no_grad():
        for _ in range(STEPS):
            nxt = tiny.adapter.forward(seq)[:, -1].argmax(-1)
            out.append(int(nxt))
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    return out


def test_reference_is_not_degenerate(reference):
    assert len(set(reference)) >= 8  # random weights that still give varied tokens


def test_static_cache_decode_matches_full_recompute(tiny, prompt, reference):
    a = tiny.adapter
    with torch.no_grad():
        a.reset_cache()
        tok = a.prefill(prompt).argmax(-1).view(1, 1)
        got = [int(tok)]
        pos = torch.tensor([PROMPT_LEN])
        for _ in range(STEPS - 1):
            tok = a.decode(tok, pos).argmax(-1).view(1, 1)
            pos += 1
            got.append(int(tok))
    assert got == reference


def test_engine_tokens_and_events(tiny, prompt, reference):
    ticks = iter(range(10**9))
    listener = run_engine(tiny.adapter, prompt, max_new_tokens=STEPS, clock=lambda: next(ticks) * 10)
    evs = listener.events
    assert listener.token_ids == reference
    assert [e.index for e in evs] == list(range(STEPS))
    assert [e.step for e in evs] == [-1] + list(range(STEPS - 1))
    assert [e.phase for e in evs] == ["prefill"] + ["decode"] * (STEPS - 1)
    assert {e.mode for e in evs} == {"eager"} and {e.cycle for e in evs} == {0}
    assert all(e.gpu_ms is None and e.host_ms > 0 for e in evs)
    # the injected clock is read four times per token: the step's start, its model forward's
    # start and end (the window given with token_launched), the step's end
    assert [(e.start_ns, e.end_ns) for e in evs[:2]] == [(0, 30), (40, 70)]
    assert listener.model_windows[:2] == [(10, 20), (50, 60)]
    assert len(listener.model_windows) == STEPS
    assert listener.started == STEPS
    assert [s for s, _ in listener.states] == ["prefill", "decode", "done"]


def test_a_full_cache_ends_the_cycle(tiny, prompt):
    listener = run_engine(tiny.adapter, prompt, max_new_tokens=None)
    assert len(listener.events) == 1 + MAX_LEN - PROMPT_LEN
    assert listener.states[-1] == ("done", f"{1 + MAX_LEN - PROMPT_LEN} tokens")


def test_loop_restarts_from_the_prompt(tiny, prompt, reference):
    listener = CollectingListener()
    engine = Engine(tiny.adapter, prompt, device="cpu", max_new_tokens=6, loop=True,
                    listener=listener)
    engine.start()
    wait_for(lambda: len(listener.events) >= 15)
    engine.stop()
    assert engine.join(10)
    evs = listener.events
    by_cycle = [[e.token_id for e in evs if e.cycle == c] for c in (0, 1)]
    assert by_cycle == [reference[:6], reference[:6]]
    assert [e.step for e in evs[:13]] == ([-1, 0, 1, 2, 3, 4] * 2 + [-1])
    assert [e.index for e in evs] == list(range(len(evs)))
    assert engine.state == "stopped" and engine.cycle >= 2


def test_pause_resume_stop_from_another_thread(tiny, prompt):
    listener = CollectingListener()
    engine = Engine(tiny.adapter, prompt, device="cpu", max_new_tokens=None, loop=True,
                    listener=listener)
    engine.start()
    wait_for(lambda: len(listener.events) >= 5)
    engine.pause()
    wait_for(lambda: engine.state == "paused")
    n = len(listener.events)
    time.sleep(0.3)
    assert len(listener.events) == n and listener.started == n  # nothing ran while paused
    engine.resume()
    wait_for(lambda: len(listener.events) >= n + 5)
    assert engine.alive
    engine.stop()
    assert engine.join(10) and not engine.alive
    states = [s for s, _ in listener.states]
    assert states[-1] == "stopped" and "paused" in states
    assert states[states.index("paused") + 1] in ("decode", "prefill")


def test_stop_while_paused_ends_the_thread(tiny, prompt):
    engine = Engine(tiny.adapter, prompt, device="cpu", max_new_tokens=None, loop=True)
    engine.start()
    engine.pause()
    wait_for(lambda: engine.state == "paused")
    engine.stop()
    assert engine.join(10) and engine.state == "stopped"


def test_seeded_sampling_is_reproducible(tiny, prompt, reference):
    a = run_engine(tiny.adapter, prompt, max_new_tokens=12, temperature=1.0, top_k=8, seed=5)
    b = run_engine(tiny.adapter, prompt, max_new_tokens=12, temperature=1.0, top_k=8, seed=5)
    c = run_engine(tiny.adapter, prompt, max_new_tokens=12, temperature=1.0, top_k=8, seed=6)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
    assert len(a.token_ids) == 12 and len(set(a.token_ids)) > 1


class _Broken:
    """An adapter whose third decode step fails."""

    vocab_size, max_len = 16, 32

    def __init__(self) -> None:
        self.calls = 0

    def new_cache(self, batch):
        return None

    def reset_cache(self, cache=None) -> None:
        pass

    def prefill(self, input_ids, cache=None):
        return torch.nn.functional.one_hot(torch.tensor([3]), 16).float()

    def decode(self, token, pos, cache=None):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("kernel exploded\nsecond line")
        return torch.nn.functional.one_hot(pos % 16, 16).float()


def test_an_error_ends_the_thread_with_one_line(prompt):
    listener = CollectingListener()
    engine = Engine(_Broken(), prompt[:, :4], device="cpu", listener=listener)
    engine.start()
    assert engine.join(10)
    assert engine.state == "error"
    assert listener.states[-1] == ("error", "RuntimeError: kernel exploded")
    assert listener.token_ids == [3, 4, 5]  # everything measured before the failure


def test_invalid_arguments(tiny, prompt):
    with pytest.raises(ValueError, match="mode must be"):
        Engine(tiny.adapter, prompt, device="cpu", mode="fast")
    with pytest.raises(ValueError, match="no room"):
        Engine(tiny.adapter, torch.zeros((1, MAX_LEN), dtype=torch.long), device="cpu")
