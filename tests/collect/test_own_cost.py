"""The overhead self-report's parts, each measured inside the profiled process: tuiprof's time
on the program's threads (nested hooks once, a session thread's never: its CPU is counted
instead), the session's threads' CPU (ended threads kept, the program's threads and the
built-in engine's workload threads left out), and the steps' excess over untraced ones."""
from __future__ import annotations

import threading
import time

from tuiprof.collect.own_cost import HookClock, SessionThreads, StepExcess, thread_cpu_s
from tuiprof.sampling import overhead_method


def _burn(cpu_s: float) -> float:
    t0 = time.thread_time()
    while time.thread_time() - t0 < cpu_s:
        pass
    return time.thread_time()


def test_nested_spans_count_once_and_the_program_code_between_them_not_at_all():
    clock = HookClock()
    outer = clock.enter()
    inner = clock.enter()
    assert inner == 0.0          # inside a span: the outer one counts it
    clock.leave(inner)
    clock.leave(outer)
    assert clock.spans == 1
    clock.exclude(1.0)           # outside any span: nothing to take off
    assert clock.excluded_s == 0.0
    t = clock.enter()
    clock.exclude(0.5)           # a CUPTI switch inside a hook is counted as a switch
    clock.leave(t)
    assert clock.spans == 2 and clock.excluded_s == 0.5
    assert clock.seconds == max(0.0, clock.total_s - 0.5)


def test_a_session_thread_spans_count_nothing_its_cpu_is_counted_instead():
    clock = HookClock()
    seen = {}

    def run():
        t = clock.enter()
        seen["token"] = t
        clock.leave(t)

    for name in ("tuiprof-cupti-fold", "tuiprof-engine", "uvicorn-loop"):
        th = threading.Thread(target=run, name=name)
        th.start()
        th.join()
        seen[name] = seen.pop("token")
    assert seen["tuiprof-cupti-fold"] == 0.0      # the session's own thread
    assert seen["tuiprof-engine"] > 0.0           # the built-in engine's decode: the workload
    assert seen["uvicorn-loop"] > 0.0             # a program's thread
    assert clock.spans == 2


def test_the_session_threads_cpu_keeps_ended_threads_and_leaves_the_program_out():
    threads = SessionThreads()
    assert threads.available and thread_cpu_s(threading.get_native_id()) is not None
    before = threads.cpu_s()
    own, program = {}, {}
    polled, go = threading.Event(), threading.Event()

    def work(into: dict) -> None:
        into["cpu"] = _burn(0.05)
        into["ready"] = True
        go.wait(30)

    a = threading.Thread(target=work, args=(own,), name="tuiprof-nvml")
    b = threading.Thread(target=work, args=(program,), name="server-thread")
    a.start(), b.start()
    while not (own.get("ready") and program.get("ready")):
        time.sleep(0.01)
    alive = threads.cpu_s()      # read while both run: the session's one counted
    polled.set()
    go.set()
    a.join(), b.join()
    ended = threads.cpu_s()      # the ended thread's last reading stays
    assert alive - before >= own["cpu"]
    assert ended >= alive
    # the program's thread burnt as much, and is not in it: at most the main thread's poll and
    # other session threads of this test process could add to the session's count
    assert ended - before < own["cpu"] + program["cpu"]


def test_the_steps_excess_over_untraced_ones_of_their_size_and_what_has_no_reference():
    ex = StepExcess()
    for _ in range(10):
        ex.add("decode", "eager", "untraced", 10.0, positions=4)
    for _ in range(10):   # a busier moment: bigger steps, and a burst fell in it
        ex.add("decode", "eager", "untraced", 30.0, positions=32)
    ex.add("decode", "eager", "traced", 16.0, positions=4)
    ex.add("decode", "eager", "traced", 15.0, positions=4)
    ex.add("decode", "eager", "edge", 12.0, positions=4)
    ex.add("decode", "eager", "traced", 33.0, positions=32)   # 3 over its own size, not 23
    ex.add("decode", "eager", None, 99.0)        # beside a compile: timed apart, not tuiprof's
    for _ in range(8):
        ex.add("decode", "compiled", "untraced", 3.0)
    ex.add("decode", "compiled", "rerecord", 43.0)
    ex.add("prefill", "eager", "traced", 50.0, positions=128)   # no untraced prefill
    tracing, rerecord, left_out = ex.seconds()
    assert abs(tracing - 0.016) < 1e-9 and abs(rerecord - 0.040) < 1e-9 and left_out == 1
    assert ex.attached_steps() == 6
    # a program's start-up windows ran attached (CUPTI switches at steps only): told apart
    # from the steps, neither left-out steps nor attached ones
    for _ in range(5):
        ex.add("window", "eager", "edge", 100.0)
    assert ex.seconds()[2] == 1 and ex.attached_steps() == 6 and ex.windows_attached() == 5


def test_the_method_names_what_is_not_counted():
    assert overhead_method(False, "eager") == \
        "threads' CPU + hooks / wall; not counted: GIL handoffs"
    bursts = overhead_method(True, "eager")
    assert "hooks + switches + traced steps / wall" in bursts
    assert bursts.endswith("not counted: GIL handoffs")
    every = overhead_method(True, "eager", left_out=40, every_step=True, attached=40)
    assert "not counted: GIL handoffs, tracing (every step: x1.62 eager, x1.29 compiled" in every
    assert "traced steps" not in every
    some = overhead_method(True, "eager", left_out=12, attached=40)
    assert "traced steps / wall" in some and "CUPTI in 12 of 40 attached steps" in some
    attached = overhead_method(True, "compiled", left_out=40, attached=40)
    assert "CUPTI in CUDA calls (+8-23 % compiled, H100)" in attached
    assert "no untraced step" in overhead_method(True, "eager", left_out=3, attached=3)
    windows = overhead_method(True, "eager", left_out=3, attached=24, windows=217)
    assert windows.endswith("not counted: GIL handoffs, CUPTI in 3 of 24 attached steps (no "
                            "untraced peer), CUPTI in 217 time windows"), windows
    assert overhead_method(False, "eager", windows=5).endswith("GIL handoffs")
    assert all(len(t) <= 140 for t in (bursts, every, attached, some))
    # the header shows what is not counted (the part after "; "): short
    assert all(len(t.split("; ", 1)[1]) <= 80 for t in (bursts, every, attached, some))


def test_spans_of_many_threads_add_up_and_ended_threads_fold_into_one_total():
    clock = HookClock()
    go = threading.Event()

    def run():
        for _ in range(3):
            t = clock.enter()
            inner = clock.enter()          # nested: counted by the outer span only
            time.sleep(0.001)
            clock.leave(inner)
            clock.leave(t)
        go.wait(30)

    threads = [threading.Thread(target=run, name=f"server-{i}") for i in range(4)]
    for th in threads:
        th.start()
    while clock.spans < 12:                # read on this thread while they run
        time.sleep(0.005)
    alive = clock.total_s
    assert alive >= 12 * 0.001
    go.set()
    for th in threads:
        th.join()
    assert clock.spans == 12 and clock.total_s == alive   # folded: nothing lost
    assert len(clock._threads) == 0                       # ended threads' records kept as sums
    clock.reset()
    assert clock.spans == 0 and clock.seconds == 0.0
    t = clock.enter()
    clock.leave(t)
    assert clock.spans == 1


def test_a_recorded_step_costs_two_spans_and_its_listener_hooks_nest_in_them():
    import argparse

    from tuiprof.cli.program import program_options
    from tuiprof.cli.run import run_defaults
    from tuiprof.profiler import Profiler
    from tuiprof.program.step_gpu_time import StepTimer
    from tuiprof.program.steps import DECODE, PREFILL, StepRecorder
    from tuiprof.store import SessionStore

    class NoEvents(StepTimer):
        def start(self):
            return None

    args = argparse.Namespace(**run_defaults())
    prof = Profiler(SessionStore(ring_tokens=64), program_options(args, headless=False))
    rec = StepRecorder(prof, prof.clock, ("transformers",), timer=NoEvents())
    rec.enter_scope("transformers")
    rec.begin("transformers", PREFILL, positions=4)
    rec.launched("transformers")
    for _ in range(10):
        rec.begin("transformers", DECODE)
        rec.launched("transformers")
    rec.exit_scope("transformers")
    # begin and launched a step, the scope's end once: the profiler's own hooks ran inside
    assert prof.hook_clock.spans == 2 * 11 + 1
    assert prof.hooks_s > 0 and prof.store.view().counters.get("tokens") == 11
    prof.token_launched(None)              # called by an engine directly: a span of its own
    assert prof.hook_clock.spans == 24
