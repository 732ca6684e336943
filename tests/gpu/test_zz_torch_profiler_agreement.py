"""tuiprof's kernel durations agree with torch.profiler's (run on the GPU machine).

In its own file, run last: after torch.profiler (Kineto) has used CUPTI in a process, a later
CUDA-graph capture in that process failed to compile on the H100 and fell back to eager.
"""
from __future__ import annotations

from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from tuiprof.profiler import Profiler, ProfilerOptions  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402

TOKENS = 24


@pytest.fixture(scope="module")
def eager():
    store = SessionStore(ring_tokens=TOKENS + 2)
    prof = Profiler(store, ProfilerOptions(engine_kwargs=dict(
        model_spec="qwen3-0.6b", mode="eager", max_new_tokens=TOKENS + 1, loop=False)))
    prof.start()
    assert prof.wait(600)
    prof.stop()
    return store.view(), prof


def test_kernel_totals_agree_with_torch_profiler(eager):
    view, prof = eager
    from tuiprof.analysis import demangle

    ours = defaultdict(int)
    ours_n = defaultdict(int)
    for seq, recs in view.raw:
        for r in recs:
            if r[0] == "K":
                name = demangle(r[1])  # torch.profiler reports demangled names
                ours[name] += r[3] - r[2]
                ours_n[name] += 1
    # the same workload again, under torch.profiler (CUDA activities), after CUPTI was released
    from tuiprof.engine import load_engine

    eng = load_engine("qwen3-0.6b", mode="eager", max_new_tokens=TOKENS + 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        eng.start()
        eng.join(600)
    theirs = defaultdict(float)
    theirs_n = defaultdict(int)
    for ev in p.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            theirs[ev.name] += ev.device_time * 1e3  # µs -> ns
            theirs_n[ev.name] += 1
    top = sorted(ours, key=lambda k: -ours[k])[:10]
    print("ours:", [n[:50] for n in top[:5]], "\ntheirs:",
          [n[:50] for n in sorted(theirs, key=lambda k: -theirs[k])[:5]])
    checked = 0
    for name in top:
        match = [k for k in theirs if k == name]
        if not match:
            continue
        a = ours[name] / ours_n[name]
        b = theirs[name] / theirs_n[name]
        print(f"{name[:60]:60s} tuiprof {a:9.0f} ns/launch  torch.profiler {b:9.0f}  "
              f"({100 * (a / b - 1):+.1f}%)")
        assert abs(a / b - 1) < 0.05, name
        checked += 1
    assert checked >= 5
