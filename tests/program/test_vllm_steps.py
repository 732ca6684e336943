"""When tuiprof does a vLLM step's bookkeeping: not between ``schedule()`` and the batch's
hand-over to the executor, nor between ``update_from_output()`` and the outputs leaving the
engine core, but while the workers compute (``get_grammar_bitmask()``, which
``EngineCore.step()`` calls after the hand-over and before it waits), in vLLM 0.32's call
order. vLLM's ``Scheduler`` is a test double here, in the shape tuiprof reads (the real engine
under tuiprof: tests/serving/test_vllm_server.py and test_vllm_offline.py)."""
from __future__ import annotations

import types
from types import SimpleNamespace as NS

from tuiprof.program.steps import StepRecorder
from tuiprof.program.vllm_steps import VllmSteps

from .conftest import rows


class Scheduler:
    """The methods of ``vllm/v1/core/sched/scheduler.py:Scheduler`` that tuiprof wraps."""

    def __init__(self) -> None:
        self.requests: dict = {}
        self.running: list = []
        self.waiting: list = []
        self.more = True

    def add_request(self, r) -> None:
        self.requests[r.request_id] = r
        self.running.append(r)

    def schedule(self):
        for r in self.running:
            r.num_computed_tokens += 1
        return NS(total_num_scheduled_tokens=len(self.running),
                  num_scheduled_tokens={r.request_id: 1 for r in self.running})

    def get_grammar_bitmask(self, scheduler_output):
        return None

    def has_requests(self) -> bool:
        return self.more

    def update_from_output(self, scheduler_output, model_output):
        outs = []
        for r in self.running:
            r.num_output_tokens += 1
            r.num_tokens += 1
            outs.append(NS(request_id=r.request_id, new_token_ids=[5], finish_reason=None))
        return {0: NS(outputs=outs)}


def _engine(prof):
    # a class of its own (tuiprof patches the methods a class defines itself)
    cls = type("Scheduler", (), {k: v for k, v in Scheduler.__dict__.items() if callable(v)})
    rec = StepRecorder(prof, prof.clock, ("vllm",))
    steps = VllmSteps(rec, requests=prof.store.requests)
    steps._patch_scheduler(types.SimpleNamespace(Scheduler=cls))
    sched = cls()
    for i in range(2):
        sched.add_request(NS(request_id=f"r{i}", num_prompt_tokens=4, num_computed_tokens=4,
                             num_output_tokens=1, num_tokens=5, arrival_time=None))
        prof.store.requests.arrived(f"r{i}", 4, "vllm")
    return steps, sched


def _stored(prof) -> int:
    return len([t for t in prof.store.view(raw=False).tokens])


def test_a_steps_bookkeeping_runs_while_the_model_does(prof):
    steps, sched = _engine(prof)
    out = sched.schedule()
    assert _stored(prof) == 0            # nothing stored before the hand-over
    sched.get_grammar_bitmask(out)       # the batch is on its way: the step is stored now
    assert _stored(prof) == 1
    row = prof.store.view(raw=False).tokens[0]
    assert row.batch == 2 and row.requests == ("r0", "r1") and row.decode_tokens == 2
    sched.update_from_output(out, None)  # more steps follow: its end waits for the next one
    assert not rows(prof)
    out2 = sched.schedule()
    sched.get_grammar_bitmask(out2)      # the first step's end, then the second's start
    done = rows(prof)
    assert len(done) == 1 and _stored(prof) == 2
    sched.more = False                   # the engine goes idle: its last step ends at once
    sched.update_from_output(out2, None)
    assert len(rows(prof)) == 2
    # every step's tokens reached its requests, in order
    view = prof.store.requests.view()
    assert {r.id: r.output_tokens for r in view.rows} == {"r0": 2, "r1": 2}
    assert all(r.decode_steps == 2 for r in view.rows)


def test_without_a_grammar_call_a_step_is_stored_before_its_tokens(prof):
    """A batch queue (``step_with_batch_queue``) may not call get_grammar_bitmask: the step
    is then stored as its output is read, still before its tokens, as scheduled."""
    steps, sched = _engine(prof)
    out = sched.schedule()
    sched.update_from_output(out, None)
    out2 = sched.schedule()
    sched.update_from_output(out2, None)
    steps._ended_later()                 # vLLM's shutdown: nothing left behind
    done = rows(prof)
    assert len(done) == 2 and [t.decode_tokens for t in done] == [2, 2]
    view = prof.store.requests.view()
    assert {r.id: (r.output_tokens, r.decode_steps) for r in view.rows} == {
        "r0": (2, 2), "r1": (2, 2)}
