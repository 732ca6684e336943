"""Steps cut from a native program's kernel stream, fed buffer by buffer as the collector does:
records held until the loop is found, then folded into exact steps; windows on the records'
clock when no loop shows."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from decode_like_stream import STEP as DL_STEP
from decode_like_stream import chunks, decode_like

from tuiprof.profiler import Profiler
from tuiprof.spec import ProfilerOptions
from tuiprof.program.steps import StepRecorder
from tuiprof.program.stream_steps import StreamSteps
from tuiprof.store import SessionStore

from .conftest import rows

LAYER = ["rmsnorm", "gemv_qkv", "rope", "attn", "gemv_o", "add", "rmsnorm", "gemv_up", "silu",
         "gemv_down", "add"]
STEP = ["embed"] + LAYER * 3 + ["rmsnorm", "gemv_lm_head", "argmax"]            # 37
PREFILL = ["embed"] + [k.replace("gemv", "gemm") for k in LAYER] * 3 + ["rmsnorm", "argmax"]


class Stream:
    """Records as CUPTI delivers them for a decode loop: a launch (API record) 2 us before each
    kernel, a D2H copy of the token and its API record after each step."""

    def __init__(self, t0: int = 1_000_000_000) -> None:
        self.t = t0
        self.corr = 0
        self.records: list = []

    def kernel(self, name: str, gap: int, dur: int = 3_000, stream: int = 7) -> None:
        self.t += gap
        self.corr += 1
        s = self.t
        self.records.append(("R", "cudaLaunchKernel", s - 2_000, s - 1_000, self.corr))
        self.records.append(("K", name, s, s + dur, 1, 1, 1, 32, 1, 1, 16, 0, stream,
                             self.corr, 0))
        self.t += dur

    def step(self, names: list, dur: int = 3_000) -> None:
        for i, n in enumerate(names):
            self.kernel(n, 40_000 if i == 0 else 1_000, dur)
        self.corr += 1
        self.records.append(("R", "cudaMemcpyAsync", self.t + 500, self.t + 3_000, self.corr))
        self.records.append(("C", 2, 4, self.t + 1_000, self.t + 2_000, 7, self.corr))
        self.t += 4_000


def auto_sink(prof, window_ms=100.0, **kw):
    """The native session's step source over ``prof``, on a clock the test moves."""
    clock = [0.0]
    rec = StepRecorder(prof, sources=("auto", "windows"))
    return clock, StreamSteps(rec, window_ms, monotonic=lambda: clock[0], meta=prof.store.meta,
                              **kw)


def feed_all(prof, sink, records, chunk=300, clock=None, tick=0.5):
    store = prof.store
    for i in range(0, len(records), chunk):
        if clock is not None:
            clock[0] += tick
        store.add_records(sink.feed([], records[i:i + chunk]))
    store.add_records(sink.drain())
    sink.recorder.close()


def test_a_decode_loop_becomes_exact_steps(prof):
    clock, sink = auto_sink(prof, 100.0)
    rec = sink.recorder
    s = Stream()
    for _ in range(10):
        s.kernel("init_weights", 1_000)
    s.step(PREFILL, dur=20_000)
    for _ in range(50):
        s.step(STEP)
    feed_all(prof, sink, s.records, clock=clock)
    toks = rows(prof)
    # the set-up kernels before the prefill (and their launches) are a window, as a Python
    # program's are before its first step
    assert [t.phase for t in toks] == ["window", "prefill"] + ["decode"] * 50
    assert [t.kernels for t in toks] == [10, len(PREFILL)] + [len(STEP)] * 50
    # every launch, and the token's copy back with its API call, in its own step
    assert [t.api_calls for t in toks] == [10, len(PREFILL) + 1] + [len(STEP) + 1] * 50
    assert [t.memcpy_count for t in toks] == [0] + [1] * 51
    assert prof.store.view(raw=False).counters["unattributed"] == 0
    auto = prof.store.meta["auto_steps"]
    assert (auto["source"], auto["kernels_per_step"], auto["decode_steps"],
            auto["prefill_steps"], auto["identical_steps"]) == ("auto", len(STEP), 50, 1, 50)
    assert auto["boundary"] == "host gap before each step" and auto["confidence_label"] == "high"
    assert rec.counts["auto"] == 51 and rec.counts["windows"] == 1


@pytest.mark.parametrize("seed,sizes,tick,shape", [
    (0, (1, 900), 0.05, {}),                                      # as on the H100
    (1, (1, 20), 0.01, {}),                                       # many small buffers
    (0, (1, 900), 0.05, {"host_gap_us": (10, 30), "stall_every": 10}),
])
def test_decode_like_in_buffers_of_any_size_is_cut_exactly(seed, sizes, tick, shape):
    """decode_like.cu's records (a host that stalls now and then inside a step, timestamps
    with jitter) reaching the session in buffers of any size, the loop searched for while they
    come: 512 decode steps of its 26 kernels, by name and in order, one prefill."""
    prof = Profiler(SessionStore(ring_tokens=600), ProfilerOptions(cupti=False, nvml=False))
    clock, sink = auto_sink(prof, 100.0)
    recs, firsts, _ = decode_like(512, seed=seed, **shape)
    for buf in chunks(recs, seed=seed, sizes=sizes):
        clock[0] += tick
        prof.store.add_records(sink.feed([], buf))
    prof.store.add_records(sink.drain())
    sink.recorder.close()
    view = prof.store.view()
    toks = [t for t in view.tokens if t.done]
    assert [t.phase for t in toks] == ["window", "prefill"] + ["decode"] * 512
    raw = dict(view.raw)
    names = [[r[1] for r in sorted(raw[t.seq], key=lambda r: r[2]) if r[0] == "K"]
             for t in toks[2:]]
    assert sum(1 for n in names if n != DL_STEP) == 0
    assert [t.api_calls for t in toks[2:]] == [len(DL_STEP) + 1] * 512   # launches and copy
    assert view.counters["unattributed"] == 0
    auto = prof.store.meta["auto_steps"]
    assert (auto["decode_steps"], auto["prefill_steps"], auto["identical_steps"],
            auto["confidence_label"]) == (512, 1, 512, "high")


def test_records_are_folded_as_steps_close_not_at_the_end(prof):
    clock, sink = auto_sink(prof, 100.0)
    s = Stream()
    s.step(PREFILL)
    for _ in range(30):
        s.step(STEP)
    half = len(s.records) // 2
    clock[0] = 5.0
    prof.store.add_records(sink.feed([], s.records[:half]))
    toks = rows(prof)
    assert len(toks) >= 10 and [t.kernels for t in toks[1:]] == [len(STEP)] * (len(toks) - 1)


def test_no_loop_means_windows_on_the_records_clock(prof):
    clock, sink = auto_sink(prof, 10.0, hold_s=0.05)
    rnd = random.Random(5)
    s = Stream()
    for i in range(3000):                 # 100 ms of kernels with no repeating sequence ...
        s.kernel(rnd.choice("abcdefghijklmnop"), 30_000)
    s.t += 10_000_000_000                 # ... then 10 s idle ...
    for i in range(300):                  # ... then 10 ms more
        s.kernel(rnd.choice("abcdefghijklmnop"), 30_000)
    feed_all(prof, sink, s.records, chunk=200, clock=clock, tick=2.0)
    toks = rows(prof)
    assert {t.phase for t in toks} == {"window"}
    assert 10 <= len(toks) <= 14          # ~100 ms + ~10 ms in 10 ms windows, no idle ones
    assert sum(t.kernels for t in toks) == 3300
    assert prof.store.meta["auto_steps"]["source"] == "windows"
    assert not prof.store.meta["auto_steps"]["found"]


def test_windows_until_the_loop_shows_then_its_steps(prof):
    clock, sink = auto_sink(prof, 20.0, hold_s=0.1)
    rnd = random.Random(2)
    s = Stream()
    for _ in range(4000):                 # 400 ms of loading kernels: windows
        s.kernel(rnd.choice("abcdefghijklmnopqrstuvwxyz"), 95_000)
    s.t += 2_000_000                      # the prompt prepared and copied
    s.step(PREFILL)
    for _ in range(40):
        s.step(STEP)
    feed_all(prof, sink, s.records, chunk=400, clock=clock, tick=2.0)
    toks = rows(prof)
    phases = Counter(t.phase for t in toks)
    assert phases["decode"] == 40 and phases["prefill"] == 1 and phases["window"] >= 15
    assert [t.kernels for t in toks if t.phase != "window"] == [len(PREFILL)] + [len(STEP)] * 40
    assert sum(t.kernels for t in toks) == 4000 + len(PREFILL) + 40 * len(STEP)
    starts = [t.start_ns for t in toks]
    assert starts == sorted(starts)       # one timeline: windows, then the loop's steps


def test_a_pause_between_steps_is_no_steps_time(prof):
    rec = StepRecorder(prof, sources=("auto", "windows"))
    sink = StreamSteps(rec, 100.0, meta=prof.store.meta)
    s = Stream()
    s.step(PREFILL)
    for burst in range(3):               # requests 1 s apart, the decode goes on each time
        for _ in range(12):
            s.step(STEP)
        s.t += 1_000_000_000
    feed_all(prof, sink, s.records)
    decode = [t for t in rows(prof) if t.phase == "decode"]
    assert len(decode) == 36 and all(t.kernels == len(STEP) for t in decode)
    assert max(t.end_ns - t.start_ns for t in decode) < 1_000_000   # no step holds the wait
    assert all(t.api_calls == len(STEP) + 1 and t.memcpy_count == 1 for t in decode)


def test_a_python_program_in_windows_hears_of_the_loop_in_its_kernels(prof):
    """The detector on a Python program that marks no steps: its windows' kernels (the raw
    ring) are searched, and the no-step-boundaries finding says what a step would be."""
    from tuiprof.analysis import find
    from tuiprof.program.steps import WINDOW

    prof.store.meta.update({"source": "program", "step_source": "windows", "window_ms": 2})
    rec = StepRecorder(prof, sources=("windows",))
    s = Stream()
    s.step(PREFILL)
    for _ in range(40):
        s.step(STEP)
    t0 = s.records[0][2]
    for w in range(8):                     # 8 windows of 2 ms over the run
        step = rec.begin("windows", WINDOW, start_ns=t0 + w * 2_000_000)
        rec.end("windows", end_ns=t0 + (w + 1) * 2_000_000 - 1, step=step)
    rec.close()
    prof.store.add_records(s.records)
    f = next(f for f in find(prof.store.view()) if f.id == "no-step-boundaries")
    loop = f.numbers["kernel_loop"]
    assert loop["kernels_per_step"] == len(STEP) and loop["confidence_label"] == "high"
    assert f"its kernels repeat a loop of {len(STEP)} kernels" in f.evidence
    assert "docs/native.md" in f.advice


def test_graph_level_steps_are_cut_live_despite_the_pauses_between_runs_of_launches(prof):
    """Graph-level trace, sampled: between bursts only the graph launches arrive, one a decode
    step, in runs with the program's waits between them. Such a wait is no layer boundary of a
    longer step (a launch is a step's whole graph), so the live search cuts a step per launch
    at once instead of waiting for 20,000 launches."""
    from tuiprof.store.records import GRAPH_KERNEL

    clock, sink = auto_sink(prof)
    t, corr, store = 1_000_000_000, 0, prof.store
    for run in range(6):
        recs = []
        for _ in range(20):                       # 20 tokens, one graph launch each
            t += 60_000
            corr += 1
            recs.append(("R", "cudaGraphLaunch", t - 5_000, t - 1_000, corr))
            recs.append(("K", GRAPH_KERNEL, t, t + 1_200_000, 0, 0, 0, 0, 0, 0, 0, 0, 7, corr,
                          12))
            t += 1_200_000
        t += 400_000_000                          # the program waits before its next run
        clock[0] += 1.5
        store.add_records(sink.feed([], recs))
    assert sink.loop is not None and sink.loop.anchor == GRAPH_KERNEL   # found before the end
    assert sink.counts["decode"] >= 60            # steps already cut, live
    store.add_records(sink.drain())
    sink.recorder.close()
    assert sink.counts["decode"] == 120


def test_a_server_whose_batches_change_gets_a_step_per_graph_launch_with_its_batch(prof):
    """llama-server's shape: every step one CUDA-graph launch (its kernels share the launch's
    correlation id), the batched GEMV's column count following the slots in use (1, 2, … 8 and
    back), the sampler's kernels launched one by one after each launch. No kernel sequence
    repeats, yet each launch is a step, and its batch is the GEMV's columns."""
    clock, sink = auto_sink(prof)
    t, corr, store = 1_000_000_000, 0, prof.store
    gemv = ("_Z13mul_mat_vec_qIL9ggml_type8ELi{}ELb0ELb0ELb0EEvPKvS2_PKi31ggml_cuda_mm_fusion_"
            "args_devicePfj5uint3jjjS7_jjjS7_jjjj")   # as CUPTI named it on the H200
    batches = [1, 2, 3, 5, 8, 8, 7, 8, 6, 4, 8, 8, 2, 1, 3, 8, 8, 8, 5, 2] * 2
    recs = []
    for step, b in enumerate(batches):
        corr += 1
        t += 80_000
        recs.append(("R", "cudaGraphLaunch", t - 8_000, t - 1_000, corr))
        for layer in range(4 + step % 3):        # the graph's shape changes too
            for name in ("_Z12rms_norm_f32ILi1024EEvPKfPf", gemv.format(b), "k_bin_bcast_add"):
                recs.append(("K", name, t, t + 4_000, 1, 1, 1, 128, 1, 1, 32, 0, 7, corr, 5))
                t += 5_000
        corr += 1
        recs.append(("R", "cudaLaunchKernel", t + 1_000, t + 2_000, corr))
        recs.append(("K", f"sampler_{step % 4}", t + 3_000, t + 6_000, 1, 1, 1, 32, 1, 1, 16, 0,
                     7, corr, 0))
        t += 6_000
    for i in range(0, len(recs), 97):
        clock[0] += 0.5
        store.add_records(sink.feed([], recs[i:i + 97]))
    assert sink.by_launch                          # found live, before the end
    store.add_records(sink.drain())
    sink.recorder.close()
    toks = rows(prof)
    assert [t.batch for t in toks] == batches
    assert [t.kernels for t in toks] == [3 * (4 + s % 3) + 1 for s in range(len(batches))]
    assert prof.store.meta["auto_steps"]["loop"].startswith("a step per CUDA-graph launch")


def _server_launches(steps: int, kernels: int, t: int = 1_000_000_000, corr: int = 0,
                     eager: tuple = ()) -> list:
    """llama-server's stream: a graph launch a step (733 kernels on the H200, here
    ``kernels``), the GEMV's columns following the slots in use; the steps in ``eager`` ran
    their kernels one by one (llama.cpp runs a step eagerly when its graph's shape changed)."""
    gemv = "_Z13mul_mat_vec_qIL9ggml_type8ELi{}ELb0ELb0ELb0EEvPKvS2_PKi"
    layer = ("_Z8k_get_rowsIfEvPKv", "_Z12rms_norm_f32ILi1024EEvPKfPf", gemv,
             "k_bin_bcast_add", "_Z8k_get_rowsIfEvPKv")
    recs = []
    for step in range(steps):
        b = 8 - step % 3
        corr += 1
        t += 60_000
        graphed = step not in eager
        recs.append(("R", "cudaGraphLaunch" if graphed else "cudaLaunchKernel", t - 8_000,
                     t - 1_000, corr))
        for i in range(kernels):
            name = layer[0] if i == 0 else layer[1 + i % 3].format(b)
            if i == kernels - 1:
                name = layer[4]                  # the head's name once more in the step
            if not graphed and i:
                corr += 1
                recs.append(("R", "cudaLaunchKernel", t - 800, t - 200, corr))
            recs.append(("K", name, t, t + 4_000, 1, 1, 1, 128, 1, 1, 32, 0, 7, corr,
                         5 if graphed else 0))
            t += 5_000
    return recs


def test_a_server_s_steps_found_after_many_kernels_are_cut_from_the_first_held(prof):
    """On the H200 the search ran once a second while llama-server made ~100,000 kernels a
    second: the step per launch was found with far more kernels held than the search looks
    at (its newest 20,000), and the older ones became windows (142 steps of ~257). Every
    launch held is a step."""
    clock, sink = auto_sink(prof)
    recs = _server_launches(200, 250)            # 50,000 kernels in 1 s of record time
    store = prof.store
    for i in range(0, len(recs), 1_000):
        clock[0] += 0.02                         # the next search a second later
        store.add_records(sink.feed([], recs[i:i + 1_000]))
    assert sink.by_launch
    store.add_records(sink.drain())
    sink.recorder.close()
    toks = rows(prof)
    assert len(toks) == 200 and {t.kernels for t in toks} == {250}
    assert [t.batch for t in toks] == [8 - s % 3 for s in range(200)]
    assert prof.store.meta["auto_steps"]["windows"] == 0


def test_a_server_s_steps_run_eagerly_between_launches_are_steps_of_their_own(prof):
    """llama.cpp runs a step kernel by kernel while its graph's shape settles (a slot joined
    or left): on the H200 those steps were taken into the launch before them (steps of 4 and 5
    steps' kernels). Each is a step of its own, cut at the launch's first kernel."""
    clock, sink = auto_sink(prof)
    recs = _server_launches(60, 40, eager=(20, 21, 22, 40))
    store = prof.store
    for i in range(0, len(recs), 97):
        clock[0] += 0.5
        store.add_records(sink.feed([], recs[i:i + 97]))
    store.add_records(sink.drain())
    sink.recorder.close()
    toks = rows(prof)
    assert [t.kernels for t in toks] == [40] * 60
    assert [t.batch for t in toks] == [8 - s % 3 for s in range(60)]
    assert sum(t.graph_kernels for t in toks) == 56 * 40


def test_the_headless_summary_names_a_step_per_launch_in_words(capsys):
    """Headless, a server's steps per graph launch are said as such (on the H200 the line read
    "a decode loop of None kernels … confidence None by launch")."""
    from types import SimpleNamespace

    from tuiprof.cli.common import print_steps

    loop = "a step per CUDA-graph launch (no kernel sequence repeats: its batches change)"
    view = SimpleNamespace(token_stats={}, meta={
        "step_source": "auto", "step_sources": {"auto": 274, "windows": 8},
        "auto_steps": {"found": True, "loop": loop, "confidence_label": "by launch",
                       "kernels_per_step": None}})
    print_steps(view)
    out = capsys.readouterr().out
    assert f"steps: {loop}" in out and "None" not in out
