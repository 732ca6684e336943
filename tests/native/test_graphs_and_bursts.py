"""A native program's CUDA graphs traced at graph level (``--cuda-graph-trace graph``) and its
kernels sampled in bursts (``--sample-every``): the injection library built as in use, the
stand-in libcupti where CUPTI needs a GPU, the real socket, a real session. What CUPTI itself
does with the kinds (which records a GPU gives) is checked on the GPU machine; here, what the
library asks of CUPTI and what the session makes of the records CUPTI's layout carries."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuiprof.collect.cupti_channel import NativeCollector, graph_kernels
from tuiprof.collect.native_sampling import AUTO_NATIVE, BurstSchedule, TracedWindows
from tuiprof.store import SessionStore
from tuiprof.store.records import GRAPH_KERNEL

from .helpers import GRAPH_LAUNCH, GRAPH_TRACE, LAUNCH, MEMCPY_ASYNC, Script, compile_native

REPO = Path(__file__).resolve().parents[2]
KERNEL_KINDS = {10, 1, 2, 4, 5}   # CONCURRENT_KERNEL, MEMCPY, MEMSET, DRIVER, RUNTIME


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    return compile_native(tmp_path_factory.mktemp("native"))


# ------------------------------------------------------------------ the schedule (pure)
def test_the_schedule_keeps_sample_every_s_meaning_one_in_n():
    assert BurstSchedule.from_option(1) is None and BurstSchedule.from_option("1") is None
    assert BurstSchedule.from_option("auto").every == AUTO_NATIVE
    assert BurstSchedule.from_option("live").every == AUTO_NATIVE
    s = BurstSchedule.from_option("8")
    assert s.every == 8 and s.period_s == pytest.approx(8 * s.burst_s)
    with pytest.raises(ValueError):
        BurstSchedule(1)


def test_the_schedule_switches_once_at_each_burst_edge():
    s = BurstSchedule(4, burst_s=0.25, first_s=1.0)     # bursts at 1.0, 2.0, 3.0 … for 0.25 s
    assert s.due(0.0) is None                           # not started: nothing
    s.start(100.0)
    seen = [(t, s.due(100.0 + t)) for t in (0.0, 0.5, 0.99, 1.0, 1.1, 1.24, 1.25, 1.6, 2.0,
                                            2.1, 2.3, 3.05)]
    assert [(t, w) for t, w in seen if w is not None] == [(1.0, True), (1.25, False),
                                                          (2.0, True), (2.3, False),
                                                          (3.05, True)]
    assert "250 ms in every 1 s (1 in 4)" in s.words()


def test_traced_windows_tell_a_burst_s_steps_from_the_others():
    w = TracedWindows()
    assert not w.at(5)
    w.switched(True, 100)
    assert w.at(100) and w.at(10_000) and not w.at(99)   # a burst still running
    w.switched(False, 200)
    w.switched(True, 500)
    w.switched(False, 700)
    assert [w.at(t) for t in (99, 100, 199, 200, 400, 500, 699, 700, 10_000)] == \
        [False, True, True, False, False, True, True, False, False]
    assert w.seconds() == pytest.approx(300 / 1e9)
    assert TracedWindows(always=True).at(0)


# ------------------------------------------------------- graph-level records (parsing)
def test_a_graph_launch_record_becomes_one_kernel_shaped_unit_of_work():
    recs = [("R", "cudaGraphLaunch", 900, 950, 40), ("G", 1000, 1800, 40, 12, 7),
            ("G", 0, 0, 41, 12, 7)]      # CUPTI could not time that one: no unit of work
    out = graph_kernels(recs)
    assert out[:2] == recs[:2] and out[3] == recs[2] and len(out) == 4
    assert out[2] == ("K", GRAPH_KERNEL, 1000, 1800, 0, 0, 0, 0, 0, 0, 0, 0, 7, 40, 12)
    from tuiprof.analysis.kernels import kernel_info

    assert kernel_info(GRAPH_KERNEL).short == "CUDA graph launch (its kernels untraced)"


def _graph_decode(s: Script, steps: int, t0: int = 1_000_000, corr: int = 1) -> int:
    """A prompt launched kernel by kernel, then ``steps`` decode steps of one graph launch and
    the token's copy back each, as llama.cpp's decode runs with graph-level trace."""
    t = t0
    for i in range(40):                                   # the prompt, eager
        s.api(LAUNCH, t, t + 1_000, corr)
        s.kernel(f"prompt_k{i % 10}", t + 2_000, t + 30_000, corr)
        t += 31_000
        corr += 1
    for _ in range(steps):
        t += 60_000                                       # the host reads the token back
        s.api(GRAPH_LAUNCH, t, t + 5_000, corr)
        s.graph(12, t + 6_000, t + 1_200_000, corr)
        corr += 1
        t += 1_200_000
        s.api(MEMCPY_ASYNC, t + 500, t + 4_000, corr)
        s.memcpy(2, 4, t + 1_000, t + 2_000, corr)
        corr += 1
        t += 4_000
    return t


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.update(extra)
    return env


def test_graph_level_asks_cupti_for_graph_records_first_and_finds_a_step_per_launch(
        native, tmp_path):
    s = Script()
    _graph_decode(s, 48)
    script = s.write(tmp_path / "s.bin")
    log = tmp_path / "switches.log"
    out = tmp_path / "snap.json"
    proc = subprocess.run([sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml",
                           "--json", str(out), "--sample-every", "1", "--cuda-graph-trace",
                           "graph", "--", str(native.driver), "run", str(script), "2000", "0"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=_env(TUIPROF_CUPTI_LIB=str(native.fake), FAKE_CUPTI_LOG=str(log)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    switches = log.read_text().split("\n")
    # graph-level is chosen before any kernel kind: CUPTI then traces graphs at graph level
    assert switches[0] == f"on {GRAPH_TRACE}" and "on 10" in switches
    doc = json.loads(out.read_text())
    auto = doc["meta"]["auto_steps"]
    assert (auto["source"], auto["decode_steps"], auto["prefill_steps"],
            auto["kernels_per_step"]) == ("auto", 48, 1, 1)
    assert doc["meta"]["cuda_graph_trace"] == "graph"
    assert "one record a launch" in doc["meta"]["tracing"]
    toks = [t for t in doc["tokens"] if t["done"] and t["phase"] == "decode"]
    assert len(toks) == 48 and {t["kernels"] for t in toks} == {1}
    assert {t["graphs"] for t in toks} == {1}                 # the launch, in its own step
    names = {k["name"] for k in doc["kernels"] if k["phase"] == "decode"}
    assert names == {GRAPH_KERNEL}
    text = json.dumps(doc["findings"])
    assert "CUDA graph launch(es) a step" in text and "--cuda-graph-trace node" in text


# ------------------------------------------------------------- bursts (the channel)
class Manual:
    """A schedule the test drives: the next switch it wants, once."""

    every = 4

    def __init__(self) -> None:
        self.want: bool | None = None

    def start(self, now: float) -> None:
        pass

    def due(self, now: float):
        w, self.want = self.want, None
        return w

    def words(self) -> str:
        return "sampled (test)"


def _wait(cond, limit: float = 20.0) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _one_burst(native, tmp_path, **env_extra) -> tuple:
    """A sampled driver through one burst: (the kinds on at its start, the kinds switched on,
    off, the collector)."""
    s = Script()
    s.kernel("k", 10, 20, 1)
    log = tmp_path / "switches.log"
    sched = Manual()
    c = NativeCollector(SessionStore(), cupti_lib=str(native.fake),
                        include=str(native.build.cupti.include), program="driver",
                        schedule=sched)
    c.start()
    env = dict(os.environ, **c.env(str(native.build.path)), FAKE_CUPTI_LOG=str(log),
               **env_extra)
    proc = subprocess.Popen([str(native.driver), "wait", str(s.write(tmp_path / "s.bin")), "4"],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert _wait(lambda: c.connected.is_set())
        first = proc.stdout.readline() + proc.stdout.readline()   # "driver: wait", the report
        kinds = set(map(int, first.split("kinds")[1].split(";")[0].split()))
        assert not c.traced_at(c.clock())
        sched.want = True
        assert _wait(lambda: c.bursts == 1)
        t_on = c.clock()
        assert c.traced_at(t_on)
        sched.want = False
        assert _wait(lambda: not c.traced_at(c.clock()))
        assert c.traced_at(t_on)                              # still traced, looking back
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(20)
        c.stop()
    lines = log.read_text().split("\n") if log.exists() else []
    on = [int(x.split()[1]) for x in lines if x.startswith("on ")]
    off = {int(x.split()[1]) for x in lines if x.startswith("off ")}
    return kinds, on, off, c


def test_a_sampled_program_starts_untraced_and_switches_its_kernel_kinds_in_bursts(
        native, tmp_path):
    kinds, on, off, c = _one_burst(native, tmp_path)
    assert not kinds & KERNEL_KINDS and 49 in kinds    # memory records on, kernels off
    assert KERNEL_KINDS <= set(on) and off == KERNEL_KINDS
    assert c.stats()["bursts"] == 1


def test_the_idle_cost_probes_switch_what_they_say(native, tmp_path):
    """What CUPTI attached costs between bursts is probed on the GPU by switches of the
    library: memory records in bursts only, and no kind switched at all (TRACE answered)."""
    kinds, on, off, _ = _one_burst(native, tmp_path, TUIPROF_CUPTI_MEMORY_BURSTS="1")
    assert not kinds & (KERNEL_KINDS | {49})          # nothing on between bursts
    assert KERNEL_KINDS | {49} <= set(on) and off == KERNEL_KINDS | {49}
    (tmp_path / "switches.log").unlink()
    kinds, on, off, c = _one_burst(native, tmp_path, TUIPROF_CUPTI_NO_BURSTS="1")
    assert 49 in kinds and not set(on) - {49} and not off   # (MEMORY2 on at the start)
    assert c.stats()["bursts"] == 1
    (tmp_path / "switches.log").unlink()
    kinds, on, off, c = _one_burst(native, tmp_path, TUIPROF_CUPTI_LAZY="1")
    assert not kinds and on[0] == 49 and KERNEL_KINDS <= set(on)   # attached at the burst
    (tmp_path / "switches.log").unlink(missing_ok=True)
    kinds, on, off, c = _one_burst(native, tmp_path, TUIPROF_CUPTI_LAZY="1",
                                   TUIPROF_CUPTI_NO_BURSTS="1")
    assert not kinds and not on and not off and c.stats()["bursts"] == 1   # never attached


def test_every_step_traced_keeps_todays_kinds_and_marks_its_steps_traced(native, tmp_path):
    from .helpers import decode_like

    s = Script()
    decode_like(s, 32)
    out = tmp_path / "snap.json"
    proc = subprocess.run([sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml",
                           "--json", str(out), "--sample-every", "1", "--",
                           str(native.driver), "run", str(s.write(tmp_path / "s.bin")), "2000",
                           "0"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=_env(TUIPROF_CUPTI_LIB=str(native.fake)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["meta"]["sample_every"] == 1 and doc["meta"]["tracing"].startswith("every step")
    toks = [t for t in doc["tokens"] if t["done"] and t["phase"] == "decode"]
    assert len(toks) == 32 and all(t["sampled"] for t in toks)
    line = next(x for x in proc.stdout.splitlines() + proc.stderr.splitlines()
                if x.startswith("fake-cupti:"))
    assert KERNEL_KINDS <= set(map(int, line.split("kinds")[1].split(";")[0].split()))


def test_the_default_samples_a_native_program_and_says_so(native, tmp_path):
    from .helpers import decode_like

    s = Script()
    decode_like(s, 8)
    out = tmp_path / "snap.json"
    proc = subprocess.run([sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml",
                           "--json", str(out), "--", str(native.driver), "run",
                           str(s.write(tmp_path / "s.bin")), "2000", "0"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=_env(TUIPROF_CUPTI_LIB=str(native.fake)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["meta"]["sample_every"] == AUTO_NATIVE
    assert "between bursts no kernel is seen" in doc["meta"]["tracing"]
    line = next(x for x in proc.stdout.splitlines() + proc.stderr.splitlines()
                if x.startswith("fake-cupti:"))
    # the program's kernels came before any burst: the stand-in emits as soon as it starts,
    # with the kernel kinds off (what CUPTI would not record)
    assert not KERNEL_KINDS & set(map(int, line.split("kinds")[1].split(";")[0].split()))


def test_graph_trace_is_refused_for_a_python_program(tmp_path):
    (tmp_path / "x.py").write_text("print('ran')\n")
    proc = subprocess.run([sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml",
                           "--cuda-graph-trace", "graph", "--", "python3", "x.py"],
                          capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, env=_env())
    assert proc.returncode != 0 and "--cuda-graph-trace applies to native binaries" in \
        proc.stderr and "Traceback" not in proc.stderr and "ran" not in proc.stdout


def test_graph_launches_are_the_decode_loop_over_prompt_forwards_that_repeat_too():
    """llama-bench's shape under graph-level trace: prompt forwards launched kernel by kernel
    (as many kernels each, repeated), then runs of one graph launch a token. The launches are
    single entries, fewer than the prompts' kernels, yet they are the decode loop."""
    from tuiprof.analysis.period import detect

    prompt = [f"mul_mat_q_{i % 30}" for i in range(538)]
    names = prompt * 6 + [GRAPH_KERNEL] * 129 + prompt + [GRAPH_KERNEL] * 129
    starts = [i * 1000 for i in range(len(names))]
    ends = [t + 500 for t in starts]
    c = detect(names, starts, ends, [7] * len(names), list(range(len(names))))
    assert c.usable and c.loop.anchor == GRAPH_KERNEL and c.loop.period == 1
    assert (c.decode, c.prefill) == (258, 2)


def _k(start: int, end: int, corr: int, graph: int) -> tuple:
    """A parsed kernel record (tuiprof/store/records.py's layout)."""
    return ("K", "k", start, end, 1, 1, 1, 128, 1, 1, 32, 0, 7, corr, graph)


def test_a_burst_drops_what_straddled_its_edges_and_kernels_running_over_one_another():
    """A kernel starting before its burst or ending after it never reaches the steps, nor a
    chain of kernels on one stream running over one another beyond any real run; kernels one
    after another stay, whatever their correlation ids (the H200 gave a burst's launches one)."""
    from tuiprof.collect.native_sampling import BurstFilter

    w = TracedWindows()
    w.switched(True, 1_000)
    f = BurstFilter(w)
    seq = [_k(1_100 + 100 * i, 1_190 + 100 * i, 8, 3) for i in range(5)]   # one after another
    recs = [_k(900, 950, 7, 3)] + seq + [_k(1_600, 1_650, 9, 0)]
    assert f.filter(recs) == recs[1:]                # only the straddler goes
    bad = [_k(2_000, 9_000 + i, 10, 3) for i in range(6)]   # six at once, 7 us each
    two = [_k(10_000, 10_500, 11, 3), _k(10_100, 10_400, 11, 3)]   # two branches at once
    assert f.filter(bad + two) == two
    assert f.filter([_k(8_000, 9_500, 10, 3), _k(9_600, 9_700, 12, 3)]) == [
        _k(9_600, 9_700, 12, 3)]                     # the chain's rest, in the next buffer
    w.switched(False, 20_000)
    assert f.filter([_k(19_900, 20_100, 13, 3), _k(21_000, 21_100, 14, 3)]) == []
    assert (f.straddled, f.overlapping, f.overlapped) == (3, 1, 7)
    assert f.dropped[-1]["kernels"] == 6 and f.dropped[-1]["starts"] == 1


@pytest.mark.parametrize("one_id", [True, False], ids=["one-correlation-id", "one-a-launch"])
def test_a_graph_launch_caught_by_a_switch_never_reaches_the_kernel_times(one_id):
    """The H200's llama-server under the sampled default: a burst's kernels were right, then
    one graph launch came back with each of its kernels ~89 ms long (the launch takes 1.2 ms)
    and every kernel of the pane read 1.23 ms a launch. Records in CUPTI's layout, parsed and
    filtered as the channel does with each buffer, every launch of the burst under one
    correlation id as the H200 gave them (or one a launch, as CUPTI documents): that launch and
    what ran past the burst's end never reach the store, every other kernel does, each with its
    own time."""
    on, off = 10_000_000_000, 10_250_000_000
    names = [f"ggml_k{i}" for i in range(11)]

    corr = [1017]

    def launch(s: Script, t: int, shape: str = "right") -> int:
        """One graph launch of 11 kernels of 100 us each, one after another."""
        corr[0] += 0 if one_id else 1
        for i, n in enumerate(names):
            a, b = t + i * 110_000, t + i * 110_000 + 100_000
            if shape == "switch":      # CUPTI's times for a launch a switch caught
                a = t - 88_000_000
            s.kernel(n, a, b, corr[0], graph=5)
        return t + len(names) * 110_000 + 50_000

    s1, s2, s3 = Script(), Script(), Script()
    t = on + 200_000
    for _ in range(20):
        t = launch(s1, t)
    t = launch(s2, on + 120_000_000, "switch")   # inside the burst, every kernel ~89 ms
    t = launch(s2, t)
    last = launch(s3, off - 500_000)    # running as the burst ended: its records come after
    s3.kernel(names[0], off + 100_000, off + 200_000, corr[0], graph=5)
    c = NativeCollector(SessionStore(), cupti_lib="unused", program="llama-server",
                        schedule=BurstSchedule(32))
    c._layout.sizes.update({k: d.itemsize for k, d in s1.dt.items()})
    c._strings.update({i + 1: n for i, n in enumerate(s1.names)})
    c.traced.switched(True, on)
    for s in (s1, s2):
        c._buffer(b"".join(s.records))
    c.traced.switched(False, off)
    s3.names = s1.names
    c._buffer(b"".join(s3.records))
    assert last > off
    kept = {a.name: a for a in c.store.view().kernels.values() if a.name in names}
    assert [kept[n].stats.count for n in names] == [22] * 4 + [21] * 7   # 4 ended in the burst
    assert max(a.stats.max for a in kept.values()) == 100_000   # no kernel longer than its own
    st = c.stats()
    assert st["burst_overlapping"] == 1 and st["burst_overlapped"] == 11
    assert st["burst_straddled"] == 8
    assert st["burst_dropped"][0]["kernels"] == 11 and st["burst_dropped"][0]["starts"] == 1
