"""A mirror fed by SessionStore.changes() equals the store it mirrors.

The real H100 eager recording is fed token by token, with each token's kernel records arriving
three tokens late (as CUPTI's buffers deliver them) and allocator statistics after the token
ended, so rows change after they were first sent; deltas are pulled at uneven points, a reset
happens in the middle, and the NVML ring and the token series overflow their bounds. After
every pull the mirror's view must equal the store's own view.
"""
from __future__ import annotations

import pickle
import random

import pytest

from tuiprof.collect.replay import load_recording, record_start, replay_into
from tuiprof.sessions import Mirror
from tuiprof.store import NVML, SessionStore

LAG = 3  # tokens by which records arrive late


@pytest.fixture(scope="module")
def recordings(eager_path, compiled_path):
    return {"eager": load_recording(eager_path), "compiled": load_recording(compiled_path)}


def _same(store: SessionStore, mirror: Mirror) -> None:
    a, b = store.view(raw=False), mirror.view(raw=False)
    assert [t.to_dict() for t in a.tokens] == [t.to_dict() for t in b.tokens]
    assert a.nvml == b.nvml
    assert a.counters == b.counters and a.events == b.events and a.meta == b.meta
    assert a.allocs == b.allocs and a.collectors == b.collectors
    assert sorted(a.kernels) == sorted(b.kernels)
    for key, agg in a.kernels.items():
        other = b.kernels[key]
        assert (agg.stats.count, agg.stats.total, agg.stats.min, agg.stats.max) == \
               (other.stats.count, other.stats.total, other.stats.min, other.stats.max)
        assert agg.stats.median == other.stats.median and agg.configs == other.configs
    for key, stats in a.token_stats.items():
        assert {n: s.count for n, s in stats.items()} == \
               {n: s.count for n, s in b.token_stats[key].items()}
        assert stats["host_ms"].total == b.token_stats[key]["host_ms"].total
    assert sorted(a.api) == sorted(b.api) and sorted(a.memcpy) == sorted(b.memcpy)


def _pull(store, mirror, cursor, raw_tokens=0):
    delta, cursor = store.changes(cursor, raw_tokens)
    mirror.apply(pickle.loads(pickle.dumps(delta)))  # as it crosses the process boundary
    return cursor, delta


def _feed(store: SessionStore, rec, reset_after: int | None = None):
    """Replay ``rec`` token by token, records LAG tokens late and allocator statistics after
    each token, NVML samples in time; yields after every mark; the rest of the records last."""
    records = sorted(rec.records, key=record_start)
    marks = sorted(rec.marks, key=lambda m: m[2])
    cols = rec.meta["nvml_columns"]
    nvml = [dict(zip(cols, r)) for r in rec.nvml]
    for s in nvml:
        s["ts_ns"] = s.pop(cols[0])
    ends: list[int] = []
    ri = ni = 0
    open_seq = None
    for event, step, ts in marks:
        if event.endswith("_start"):
            open_seq = store.begin_token("prefill" if event.startswith("prefill") else "decode",
                                         "eager", ts, step)
            start = ts
        elif open_seq is not None:
            store.end_token(open_seq, ts, (ts - start) / 1e6, None, step)
            store.set_token_alloc(open_seq, {"num_device_alloc": step})
            ends.append(ts)
            open_seq = None
            if len(ends) > LAG:  # records of the token LAG tokens back arrive now
                upto = ends[-1 - LAG]
                j = ri
                while j < len(records) and record_start(records[j]) <= upto:
                    j += 1
                store.add_records(records[ri:j])
                ri = j
            while ni < len(nvml) and nvml[ni]["ts_ns"] <= ts:
                store.ingest(NVML, nvml[ni])
                ni += 1
        if len(ends) == reset_after and event.endswith("_end"):
            store.reset()
        yield
    store.add_records(records[ri:])


def test_mirror_follows_late_records_allocs_resets_and_bounds(recordings):
    store = SessionStore(ring_tokens=8, series_len=40, nvml_len=30)
    mirror = Mirror(series_len=40, nvml_len=30)
    rng = random.Random(7)
    cursor = None
    sent_rows = pulls = 0
    for _ in _feed(store, recordings["eager"], reset_after=15):
        if rng.random() < 0.3:
            cursor, delta = _pull(store, mirror, cursor)
            sent_rows += len(delta["tokens"])
            pulls += 1
            _same(store, mirror)
    cursor, delta = _pull(store, mirror, cursor, raw_tokens=None)
    _same(store, mirror)
    assert [s for s, _ in mirror.view().raw] == [s for s, _ in store.view().raw]
    assert len(store.view().tokens) == 40 and len(mirror.view().nvml) == 30
    # Incremental: far fewer rows crossed than a full copy per pull would send.
    assert sent_rows < pulls * 40 / 3, (sent_rows, pulls)


def _raw_sent(delta: dict) -> int:
    return sum(len(recs) for _, _, recs in delta["raw"]["add"])


def test_raw_records_cross_once_as_they_arrive(recordings):
    """Findings pull the raw records of the last 16 traced tokens every 2 s. Each record crosses
    to the mirror once, as it arrives (records come tokens late, so a token's list grows after
    it was first sent); the mirror's raw tail still equals the store's after every pull, and a
    pull with nothing new sends no record (before, all ~60,000 records of an eager burst window:
    6 MB pickled under the session's GIL every 2 s)."""
    store, mirror = SessionStore(ring_tokens=24), Mirror()
    rng = random.Random(3)
    cursor = None
    sent = pulls = 0
    for _ in _feed(store, recordings["eager"], reset_after=30):
        roll = rng.random()
        if roll < 0.4:
            n = 16  # the app's findings (FINDINGS_RAW_TOKENS)
            cursor, delta = _pull(store, mirror, cursor, raw_tokens=n)
            sent += _raw_sent(delta)
            pulls += 1
            assert mirror.view().raw == store.view(raw_tokens=n).raw
            cursor, delta = _pull(store, mirror, cursor, raw_tokens=n)
            assert _raw_sent(delta) == 0 and mirror.view().raw == store.view(raw_tokens=n).raw
        elif roll < 0.6:
            cursor, _ = _pull(store, mirror, cursor)  # the UI timer's pull keeps what is held
    cursor, delta = _pull(store, mirror, cursor, raw_tokens=None)  # an export: every entry
    assert mirror.view().raw == store.view().raw
    total = sum(len(r) for _, r in store.view().raw)
    assert pulls > 20 and total > 0
    # No record crossed twice: at most every record of the recording, once.
    assert 0 < sent + _raw_sent(delta) <= len(recordings["eager"].records), sent


def test_unchanged_aggregates_are_not_sent_again(recordings):
    store = SessionStore()
    replay_into(recordings["compiled"], store)
    delta, cursor = store.changes(None)
    assert delta["full"] and delta["records"] and delta["parts"][1].kernels
    delta, cursor = store.changes(cursor)
    assert not delta["records"] and delta["tokens"] == [] and delta["series"]["nvml"] == []
    assert not delta["parts"][1].kernels       # token statistics only
    assert delta["events"] is None
    store.reset()
    delta, _ = store.changes(cursor)
    assert delta["full"] and delta["records"] and delta["tokens"] == []


def test_every_decode_token_reaches_the_mirror_done_on_a_cpu():
    """A real tiny model on the CPU, no CUPTI: nothing but ``end_token`` changes a row after it
    was first sent, and here every row is first sent while still open (a pull right after each
    ``begin_token``, the worst timing of the UI's puller). The mirrored series must still hold
    every token, done, with its host time; the latency chart and the comparison's median follow
    (on a CPU the chart showed one point and the median one arbitrary token)."""
    from tuiprof.profiler import Profiler
    from tuiprof.spec import EngineSpec, ProfilerOptions
    from tuiprof.ui.derive import compare, latency_series

    store, mirror = SessionStore(), Mirror()
    cursor = None

    class PullingProfiler(Profiler):
        def _begin(self, args):
            nonlocal cursor
            super()._begin(args)
            cursor, _ = _pull(store, mirror, cursor)

    prof = PullingProfiler(store, ProfilerOptions(cupti=False, nvml=False, engine=EngineSpec.resolve(
        "qwen3-tiny", device="cpu", max_new_tokens=12, prompt_len=8)))
    prof.start()
    assert prof.wait(120) and prof.status.state == "done", prof.status
    prof.stop()
    cursor, _ = _pull(store, mirror, cursor)
    _same(store, mirror)
    rows = mirror.view(raw=False).tokens
    assert len(rows) == 12 and all(r.done and r.host_ms > 0 for r in rows)
    view = mirror.view(raw=False)
    assert len(latency_series(view).seq) == 12
    decode = sorted(r.host_ms for r in rows if r.phase == "decode")
    eager, _ = compare(view)
    assert len(decode) == 11 and eager.ms_token == pytest.approx(decode[5])


def test_a_row_sent_while_open_is_sent_again_when_it_finishes():
    """Without CUPTI records (CPU, or a token outside a traced burst) nothing else marks the
    row changed: the mirror kept it open (host time 0) for ever."""
    from tuiprof.sessions.mirror import Mirror
    from tuiprof.store import SessionStore

    store, mirror = SessionStore(), Mirror()
    seq = store.begin_token("decode", "eager", 100, 0)
    delta, cursor = store.changes(None)
    mirror.apply(delta)
    store.end_token(seq, 200, 1.5, None, 7)
    store.begin_token("decode", "eager", 300, 1)
    delta, cursor = store.changes(cursor)
    mirror.apply(delta)
    first = mirror.view().tokens[0]
    assert (first.seq, first.done, first.host_ms, first.token_id) == (0, True, 1.5, 7)
