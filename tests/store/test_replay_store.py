"""Replaying the H100 recordings through the store gives the numbers computed straight from the files."""
from __future__ import annotations

import statistics
from collections import defaultdict

import pytest
from recordings import TS_INDEX, windows

from tuiprof.collect.replay import load_recording, replay_into
from tuiprof.store import SessionStore


def _direct_kernel_totals(raw):
    """Per (name, phase): count and total duration, attributing by start time to the windows."""
    wins = windows(raw)
    tot = defaultdict(lambda: [0, 0])
    for r in raw["records"]:
        if r[0] != "K":
            continue
        phase = "other"
        for s, e, step in wins:
            if s <= r[2] <= e:
                phase = "prefill" if step == -1 else "decode"
                break
        t = tot[(r[1], phase)]
        t[0] += 1
        t[1] += r[3] - r[2]
    return tot


@pytest.mark.parametrize("which", ["eager", "compiled"])
def test_per_kernel_totals_match_the_recording(which, request):
    raw = request.getfixturevalue(f"{which}_raw")
    view = request.getfixturevalue(f"{which}_view")
    expect = _direct_kernel_totals(raw)
    got = {(a.name, a.phase): [a.stats.count, a.stats.total] for a in view.kernels.values()}
    assert got == {k: v for k, v in expect.items()}
    assert view.counters["kernels"] == sum(1 for r in raw["records"] if r[0] == "K")


@pytest.mark.parametrize("which", ["eager", "compiled"])
def test_per_token_figures(which, request):
    view = request.getfixturevalue(f"{which}_view")
    f = request.getfixturevalue(f"{which}_facts")
    dec = [t for t in view.tokens if t.phase == "decode"]
    assert len(dec) == f.decode_steps == 64            # tests/data/record.sh: 64 decode steps
    assert tuple(t.kernels for t in dec) == f.kernels_per_step
    assert statistics.median(t.host_ms for t in dec) == pytest.approx(f.step_ms_median, abs=0.05)
    assert statistics.median(t.kernel_ns for t in dec) / 1e6 == pytest.approx(f.kernel_ms_median,
                                                                              abs=0.05)
    pre = [t for t in view.tokens if t.phase == "prefill"]
    assert len(pre) == 1 and pre[0].kernels == f.prefill_kernels > 0


def test_every_record_attributed_to_its_token(eager_raw, eager_view):
    wins = windows(eager_raw)
    raw_by_seq = dict(eager_view.raw)
    tokens = sorted(eager_view.tokens, key=lambda t: t.start_ns)
    assert len(tokens) == len(wins)
    for (s, e, step), tok in zip(wins, tokens):
        assert (tok.start_ns, tok.end_ns) == (s, e)
        recs = raw_by_seq[tok.seq]
        assert all(s <= r[TS_INDEX[r[0]]] <= e for r in recs)
        expect = sum(1 for r in eager_raw["records"] if s <= r[TS_INDEX[r[0]]] <= e)
        assert len(recs) == expect
    assert eager_view.counters["unattributed"] == 0


def test_memcpy_memset_per_token(eager_raw, eager_view):
    dec = [t for t in eager_view.tokens if t.phase == "decode"]
    # each decode step copies the new token to the host and writes it back
    n_c = sum(1 for r in eager_raw["records"] if r[0] == "C")
    n_s = sum(1 for r in eager_raw["records"] if r[0] == "S")
    assert sum(t.memcpy_count for t in eager_view.tokens) == n_c
    assert sum(t.memset_count for t in eager_view.tokens) == n_s
    assert all(t.memcpy_bytes.get("d2h", 0) > 0 for t in dec)


def test_ring_buffer_keeps_only_last_n_tokens(eager_path, eager_facts):
    store = SessionStore(ring_tokens=8, series_len=16)
    replay_into(load_recording(eager_path), store)
    view = store.view()
    n = eager_facts.tokens
    assert len(view.raw) == 8
    assert [s for s, _ in view.raw] == list(range(n - 8, n))
    assert len(view.tokens) == 16
    # aggregates still cover every token
    assert view.counters["kernels"] == eager_facts.kernels
    assert sum(a.stats.count for a in view.kernels.values()) == eager_facts.kernels
    # tokens that left the window were folded into the running per-token statistics (the
    # prefill has its own key)
    left = eager_facts.kernels_per_step[:eager_facts.decode_steps - 16]
    folded = view.token_stats[("decode", "eager")]["kernels"]
    assert (folded.count, folded.min, folded.max) == (len(left), min(left), max(left))


def test_a_replayed_recording_keeps_its_gpu(eager_raw, eager_view):
    """A tuiprof recording's meta "device" is "cuda"; the GPU's name (and so its peaks for the
    roofline) is its "device_name", which the replayed session keeps."""
    from tuiprof.analysis.gpus import gpu_spec

    assert eager_raw["meta"]["device"] == "cuda"
    assert eager_view.meta["device_name"] == eager_raw["meta"]["device_name"] == "NVIDIA H100 80GB HBM3"
    spec = gpu_spec(eager_view.meta)
    assert spec.name.startswith("H100") and "assumed" not in spec.source


def test_dropped_records_are_counted(eager_path):
    store = SessionStore()
    replay_into(load_recording(eager_path), store)
    store.note_dropped(17)
    store.note_dropped(0)
    store.note_dropped(3)
    assert store.view().counters["dropped"] == 20


def test_reset_forgets_statistics(eager_path):
    store = SessionStore()
    replay_into(load_recording(eager_path), store)
    store.reset()
    v = store.view()
    assert v.kernels == {} and v.tokens == [] and v.counters["kernels"] == 0
    assert v.events[-1][2] == "reset"
