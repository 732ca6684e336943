"""transformers' own serving paths as request sources, unchanged: the continuous-batching
manager with staggered arrivals (and a token budget that makes requests queue),
generate_batch, and a plain generate() whose rows are requests."""
from __future__ import annotations

import json
import time

import pytest
import torch

from tuiprof.program.steps import StepRecorder
from tuiprof.program.transformers_steps import TransformersSteps

from .conftest import tiny_qwen3

transformers = pytest.importorskip("transformers")
CB = getattr(transformers, "ContinuousBatchingConfig", None)


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


@pytest.fixture
def hooked(prof):
    book = prof.store.requests
    book.clock = prof.clock
    steps = TransformersSteps(StepRecorder(prof, prof.clock), requests=book)
    steps.install()
    yield steps
    steps.uninstall()


def _gen_config(new: int):
    return transformers.GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None,
                                         pad_token_id=0)


@pytest.mark.skipif(CB is None, reason="no continuous batching in this transformers")
def test_the_manager_with_staggered_arrivals_and_a_token_budget_that_queues(model, hooked,
                                                                            prof):
    # 16-token prompts and at most 16 tokens a step: one prompt a step. Four arrive together
    # (the later ones must wait for room), two more later, 30 ms apart.
    with model.continuous_batching_context_manager(
            generation_config=_gen_config(6),
            continuous_batching_config=CB(num_blocks=16, max_batch_tokens=16),
            block=True, timeout=10, warmup=False) as manager:
        for i in range(6):
            if i >= 4:
                time.sleep(0.03)
            manager.add_request(list(range(1, 17)), max_new_tokens=3 + i % 4)
        done = 0
        while done < 6:
            res = manager.get_result(timeout=30)
            assert res is not None
            done += res.is_finished()
    v = prof.store.view(raw=False)
    req = v.requests
    assert req.counts["arrived"] == 6 and req.counts["finished"] == 6 and not req.misuse
    assert req.sources == {"transformers": 6}
    rows = {r.id: r for r in req.rows}
    assert [rows[f"req_{i}"].output_tokens for i in range(6)] == [3, 4, 5, 6, 3, 4]
    for r in rows.values():
        assert r.prompt_tokens == 16 and r.status == "finished" and r.reason == "length"
        assert 0 < r.queue_ms <= r.ttft_ms <= r.e2e_ms
        assert len(r.token_ns) == r.output_tokens and list(r.token_ns) == sorted(r.token_ns)
        assert r.kv_blocks >= 1 and r.prefill_steps >= 1
    # the token budget held the later ones back while the first prefilled
    steps = [t for t in v.timeline if t.requests]
    assert max(t.prefill_tokens + t.decode_tokens for t in steps) <= 16
    assert any(t.pending for t in steps)
    assert rows["req_3"].first_step_seq > rows["req_0"].first_step_seq
    assert rows["req_3"].queue_ms > rows["req_0"].queue_ms
    assert all(t.kv_total > 0 and 0 < t.kv_used <= t.kv_total for t in steps)
    assert sum(t.decode_tokens for t in steps) + 6 == sum(r.output_tokens for r in rows.values())
    # tuiprof's time on the manager's thread and the caller's is the session's overhead: every
    # step's hook before the forward, its end, update_batch's bookkeeping before and after the
    # tokens are handed over, and each add_request
    n_steps = len([t for t in v.timeline if t.done])
    assert prof.hook_clock.spans >= 4 * n_steps + 6 and prof.hooks_s > 0


@pytest.mark.skipif(CB is None, reason="no continuous batching in this transformers")
def test_generate_batch_requests(model, hooked, prof):
    out = model.generate_batch([[1, 2, 3, 4, 5], [6, 7, 8]], generation_config=_gen_config(4),
                               continuous_batching_config=CB(num_blocks=8, max_batch_tokens=64),
                               warmup=False)
    assert len(out) == 2
    req = prof.store.view(raw=False).requests
    assert req.counts["finished"] == 2
    assert sorted(r.prompt_tokens for r in req.rows) == [3, 5]
    assert all(r.output_tokens == 4 and r.ttft_ms <= r.e2e_ms for r in req.rows)


def test_a_plain_generate_makes_each_row_a_request(model, hooked, prof):
    ids = torch.randint(4, 1024, (3, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[2, :2] = 0                                   # row 2: a 4-token prompt, left-padded
    out = model.generate(ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5,
                         do_sample=False, pad_token_id=0)
    assert out.shape == (3, 11)
    v = prof.store.view(raw=False)
    rows = sorted(v.requests.rows, key=lambda r: r.id)
    assert [r.id for r in rows] == ["generate0/0", "generate0/1", "generate0/2"]
    assert [r.prompt_tokens for r in rows] == [6, 6, 4]
    assert all(r.output_tokens == 5 and r.status == "finished" for r in rows)
    steps = [t for t in v.timeline if t.done]
    assert rows[0].first_token_ns == steps[1].start_ns    # the prefill's token: at step 1
    assert v.requests.sources == {"generate": 3}


def test_a_generate_row_that_hits_its_end_token_finishes_there(model, hooked, prof):
    ids = torch.randint(4, 1024, (2, 6), generator=torch.Generator().manual_seed(2))
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                         do_sample=False, pad_token_id=0)
    new = ref[0, 6:].tolist()
    k = next(i for i in range(1, 6) if new[i] not in new[:i])   # a token new to row 0
    eos = new[k]
    prof.store.reset()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                   do_sample=False, pad_token_id=0, eos_token_id=eos)
    rows = {r.id: r for r in prof.store.view(raw=False).requests.rows}
    r0 = rows["generate1/0"]
    assert r0.output_tokens == k + 1 and r0.reason == "eos" and len(r0.token_ns) == k + 1


def test_a_failure_to_record_generate_rows_is_said_once_and_generate_goes_on(model, hooked, prof,
                                                                               monkeypatch):
    """tuiprof's bookkeeping of a generate()'s rows fails (an output it cannot read): the
    program's generate() returns its tokens unchanged, and one event says that requests may be
    missing, not one an attempt."""
    from tuiprof.program.transformers_requests import GenerateRequests

    ids = torch.randint(4, 1024, (2, 6), generator=torch.Generator().manual_seed(3))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=5, min_new_tokens=5,
              do_sample=False, pad_token_id=0)
    ref = model.generate(ids, **kw)
    prof.store.reset()

    def broken(self, *a, **k):
        raise ValueError("an output tuiprof cannot read")

    monkeypatch.setattr(GenerateRequests, "done", broken)
    monkeypatch.setattr(GenerateRequests, "flush_due", broken)
    for _ in range(2):
        assert torch.equal(model.generate(ids, **kw), ref)
    said = [e[3] for e in prof.store.view(raw=False).events if e[2] == "requests"]
    assert said == ["requests: could not record generate() rows (ValueError: an output tuiprof "
                    "cannot read); the program goes on, its requests there may be missing"]
    assert prof.store.requests.lost["generate() rows"] >= 4   # every failure counted


def test_the_app_middleware_times_the_first_text_and_the_last_bytes_it_writes():
    """The server's response, seen by the hooks: the first body message that carries generated
    text (a chat stream's role chunk carries none) and the last one, timed as the app hands
    them to the server to write."""
    import asyncio

    from tuiprof.program.transformers_requests import ArrivalMiddleware, TransformersRequests
    from tuiprof.store.requests import RequestBook

    ticks = iter(range(100, 10_000, 10))
    book = RequestBook()
    book.clock = lambda: next(ticks)
    reqs = TransformersRequests(book, book.clock)
    sent = []

    def sse(obj) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    async def app(scope, receive, send):     # a streaming chat endpoint, as serve's
        reqs.http_arrived("r1")
        reqs.added("r1", [1, 2, 3], book.clock())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for body in (sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
                     sse({"choices": [{"delta": {"content": "hi"}}]}),
                     sse({"choices": [{"delta": {"content": " there"}}]}),
                     sse({"choices": [], "usage": {"prompt_tokens": 3}}), b"data: [DONE]\n\n"):
            await send({"type": "http.response.body", "body": body, "more_body": True})
        book.finished("r1", "stop")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    mw = ArrivalMiddleware(app, clock=book.clock, requests=reqs)
    asyncio.run(mw({"type": "http", "headers": []}, receive, send))
    assert len(sent) == 7                  # every message passed, unchanged
    row = book.view().get("r1")
    # the clock's ticks: 100 the app's entry (its arrival), 110 queued; the body messages
    # timed until the first text: 120 (the role chunk), 130 (the first text); those between
    # read no clock; 140 finished; 150 the end
    assert row.arrival_ns == 100 and row.queued_ns == 110
    assert row.wire_first_ns == 130 and row.wire_end_ns == 150 and row.finish_ns == 140
    assert row.after_engine_ms is None      # no token handed over in this stand-in engine
    book.tokens("r2", 1)                    # nothing else was recorded
    assert [r.id for r in book.view().rows] == ["r1"]


def test_the_middleware_without_requests_only_notes_the_arrival():
    import asyncio

    from tuiprof.program.transformers_requests import ARRIVAL, ArrivalMiddleware

    seen = []

    async def app(scope, receive, send):
        seen.append(ARRIVAL.get())
        await send({"type": "http.response.body", "body": b"x", "more_body": False})

    async def send(message):
        seen.append(message["body"])

    asyncio.run(ArrivalMiddleware(app, clock=lambda: 7)({"type": "http"}, None, send))
    assert seen == [7, b"x"]
