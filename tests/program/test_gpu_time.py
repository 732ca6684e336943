"""Every program step gets its GPU time from a CUDA-event pair, read later without waiting.

A CUDA event cannot exist on a CPU: ``Device`` below is a test double of the event object
only (record on the current stream, ``query``, ``synchronize``, ``elapsed_time``), with a
device clock the test moves. Everything else is real: the step recorder, transformers'
``generate()``, the Profiler and its store."""
from __future__ import annotations

import time

import pytest

from tuiprof import marks
from tuiprof.program.step_gpu_time import StepTimer
from tuiprof.program.steps import StepRecorder

from .conftest import rows, tiny_qwen3


class Device:
    """The GPU as the events see it: each record is reached after ``lag`` more device ms,
    and the device is at ``now``; ``auto``: it keeps up with every record at once."""

    def __init__(self, lag: float = 1.0, auto: bool = False) -> None:
        self.now = 0.0
        self.queued = 0.0
        self.lag = lag
        self.auto = auto
        self.waits = 0
        self.recorded: list[int] = []   # host time of every record, in order

    def event(self) -> "Event":
        return Event(self)


class Event:
    def __init__(self, dev: Device) -> None:
        self.dev, self.at = dev, None

    def record(self) -> None:
        dev = self.dev
        dev.queued += dev.lag
        self.at = dev.queued
        dev.recorded.append(time.perf_counter_ns())
        if dev.auto:
            dev.now = dev.queued

    def query(self) -> bool:
        return self.dev.now >= self.at

    def synchronize(self) -> None:
        self.dev.waits += 1
        self.dev.now = max(self.dev.now, self.at)

    def elapsed_time(self, end: "Event") -> float:
        assert self.query() and end.query(), "read before the device reached it"
        return end.at - self.at


def test_api_steps_get_their_gpu_time_at_a_later_step_without_waiting(prof):
    dev = Device(lag=1.5)
    rec = StepRecorder(prof, timer=StepTimer(make_event=dev.event))
    marks._sink = rec
    try:
        with marks.step("decode"):
            pass
        with marks.step("decode"):   # step 0's events are queued, the device not there yet
            pass
        assert [t.gpu_ms for t in rows(prof)] == [None, None]
        dev.now = dev.queued          # the device catches up
        with marks.step("decode"):    # read at this boundary: steps 0 and 1
            pass
        got = [t.gpu_ms for t in rows(prof)]
        assert got[:2] == [1.5, 1.5] and got[2] is None
        assert dev.waits == 0         # never waited for the device while the program ran
    finally:
        marks._sink = None
    rec.close()                       # the program ended: the last one is read (waiting now)
    assert [t.gpu_ms for t in rows(prof)] == [1.5, 1.5, 1.5]
    # the mode is "compiled" once anything in this process was compiled (an earlier test)
    ts = prof.store.view(raw=False).token_stats[("decode", rows(prof)[0].mode)]
    # no CUPTI in this session: every step ran untraced, the reference for tracing's cost
    assert ts["gpu_ms"].count == 3 and ts["untraced_gpu_ms"].count == 3
    assert all(t.attached is False for t in rows(prof))


def test_a_launched_steps_times_are_read_while_it_computes_not_before_it_launches(prof):
    """A source that reports the launch (generate()'s logits processors) gets the earlier
    steps' times read there, while the device computes: the next step's begin, which comes
    before its launch on the program's critical path, reads none."""
    dev = Device(auto=True)
    timer = StepTimer(make_event=dev.event)
    rec = StepRecorder(prof, timer=timer)
    polls = []
    real = timer.poll
    timer.poll = lambda wait=False: polls.append(wait) or real(wait)
    rec.begin("api", "decode")
    rec.launched("api")
    rec.device_done("api")
    n = len(polls)
    rec.begin("api", "decode")       # step 0 launched: nothing read before step 1 launches
    assert len(polls) == n
    rec.launched("api")               # read here: step 0's time reaches the store
    assert len(polls) == n + 1
    rec.device_done("api")
    rec.close()                       # the program ended: read, waiting
    assert [t.gpu_ms for t in rows(prof)] == [1.0, 1.0] and polls[-1] is True
    rec.begin("api", "decode")
    rec.begin("api", "decode")       # its step never reported launched: read at this begin
    assert polls[n + 2:] == [False, False]


def test_the_pool_is_bounded_and_a_step_beyond_it_goes_untimed(prof):
    dev = Device()
    timer = StepTimer(pairs=2, make_event=dev.event)
    rec = StepRecorder(prof, timer=timer)
    for _ in range(6):                # the device never catches up while the host runs on
        rec.begin("api", "decode")
    rec.end("api")
    assert timer.skipped == 4 and len(timer._pending) == 2 and timer._made == 2
    dev.now = dev.queued
    rec.close()
    got = [t.gpu_ms for t in rows(prof)]
    assert got == [1.0, 1.0, None, None, None, None]
    assert timer.timed == 2


def test_on_a_cpu_nothing_is_recorded(prof):
    rec = StepRecorder(prof)          # the real CUDA path: CUDA is not initialised here
    for _ in range(3):
        rec.begin("api", "decode")
    rec.close()
    assert [t.gpu_ms for t in rows(prof)] == [None] * 3
    assert rec.timer._made == 0 and not rec.timer.failed


transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


class Stamp(transformers.StoppingCriteria):
    """A stopping criterion that notes when generate() runs its criteria (never stops)."""

    def __init__(self) -> None:
        self.at: list[int] = []

    def __call__(self, input_ids, scores, **kwargs):
        self.at.append(time.perf_counter_ns())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def test_a_generate_step_ends_its_gpu_time_at_its_stopping_criteria(prof):
    from tuiprof.program.transformers_steps import TransformersSteps

    model = tiny_qwen3()
    dev = Device(auto=True)
    rec = StepRecorder(prof, clock=time.perf_counter_ns, timer=StepTimer(make_event=dev.event))
    steps = TransformersSteps(rec)
    steps.install()
    stamp = Stamp()
    try:
        ids = torch.randint(0, 1024, (2, 8), generator=torch.Generator().manual_seed(0))
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                       min_new_tokens=5, do_sample=False, pad_token_id=0,
                       stopping_criteria=transformers.StoppingCriteriaList([stamp]))
    finally:
        steps.uninstall()
    rec.close()
    got = rows(prof)
    assert [t.phase for t in got] == ["prefill"] + ["decode"] * 4
    assert all(t.gpu_ms is not None and t.gpu_ms > 0 for t in got)
    # each step's second event: after its stopping criteria ran, before the next step began
    # (not at the next step's start, where the loop has already waited for the device)
    ends = dev.recorded[1::2]
    for i, t in enumerate(got):
        assert ends[i] > stamp.at[i]
        if i + 1 < len(got):
            assert ends[i] < got[i + 1].start_ns
