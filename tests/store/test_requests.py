"""Requests as a record kind of the store: each request's timeline from the calls a source
makes, the aggregates over every request, misuse counted once and never raised, bounded
memory over a 10,000-request soak, and the mirror in another process seeing the same rows."""
from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import pytest

from tuiprof.sessions.mirror import Mirror
from tuiprof.store import SessionStore
from tuiprof.store.requests import RequestBook

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from requests_data import MS, serving_store  # noqa: E402


def test_a_requests_timeline_from_the_calls_of_a_source():
    v = serving_store().view()
    req = {r.id: r for r in v.requests.rows}
    a, c, d = req["a"], req["c"], req["d"]
    assert [r.id for r in v.requests.rows] == ["a", "b", "c", "d"]   # finished, then in flight
    assert (a.queue_ms, a.ttft_ms, a.e2e_ms) == (10.0, 30.0, 111.0)
    assert a.ttft_ms <= a.e2e_ms and a.output_tokens == 5 and a.status == "finished"
    assert a.itls_ms() == [50.0, 11.0, 10.0, 10.0]        # the spike: c's prefill beside it
    assert a.model_ns == 98 * MS                            # steps 10-30, 32-80, 81-111
    assert list(a.steps) == [0, 1, 2, 3, 4] and a.prefill_steps == 1 and a.decode_steps == 4
    assert a.shared == 2 * 4                                # others in its 4 decode steps
    assert c.status == "decode" and c.first_step_seq == 1 and not c.finish_ns
    assert d.status == "queued" and d.first_step_ns == 0
    steps = v.timeline
    assert steps[1].requests == ("c", "a", "b") and steps[1].prefills == 1
    assert (steps[1].prefill_tokens, steps[1].decode_tokens) == (64, 2)
    assert (steps[5].pending, steps[5].kv_used, steps[5].kv_total) == (1, 4, 64)
    st = v.requests.stats
    assert st["ttft_ms"].count == 2 and st["e2e_ms"].max == 111.0
    assert st["itl_ms"].count == 8 and st["itl_ms"].quantile(0.99) == 50.0
    assert st["outside_ms"].median == pytest.approx(12.5)  # a: 13 ms, b: 12 ms outside
    assert v.requests.counts["tokens"] == 15 and v.requests.sources == {"api": 4}


def test_a_process_whose_steps_run_elsewhere_says_nothing_of_time_outside_them():
    """vLLM's API server: its requests are whole, their time in the model's steps is its
    engine core's to say (joined there), not all of it 'outside model steps' here."""
    from tuiprof.analysis.requests import outside_ms  # noqa: PLC0415

    book = RequestBook()
    book.steps_elsewhere = True
    book.arrived("x", 4, "vllm", t=0)
    book.advance(20 * MS, [("x", 1)], [])
    book.advance(30 * MS, [("x", 1)], [("x", "length", "finished")])
    (row,) = book.view().rows
    assert row.e2e_ms == 30.0 and row.model_ns == -1 and outside_ms(row) is None
    assert book.view().stats["outside_ms"].count == 0


def test_misuse_is_counted_reported_once_and_never_raises():
    st = SessionStore()
    book = st.requests
    book.tokens("ghost", 1)                 # never arrived
    book.tokens("ghost", 1)
    book.arrived("x", 3, "api", t=1)
    book.arrived("x", 3, "api", t=2)        # twice while in flight
    book.finished("x", "stop", t=5)
    book.finished("x", "stop", t=6)         # twice
    book.tokens("x", 1, t=7)                # after its finish
    book.arrived(["not", "hashable"], 1)    # a list as an id
    assert book.misuse == {"unknown_id": 2, "arrived_twice": 1, "finished_twice": 1,
                           "token_after_finish": 1, "bad_id": 1}
    events = [e for e in st.view().events if e[2] == "requests"]
    assert len(events) == 5                  # one per kind, the first one
    assert "never raised" in events[0][3]
    x = st.view().requests.get("x")
    assert x.finish_ns == 5 and x.output_tokens == 0


def test_the_public_api_is_a_no_op_without_a_session_and_feeds_the_store_under_one():
    import tuiprof
    from tuiprof import marks

    assert marks._requests is None
    assert tuiprof.request_arrived("q", prompt_tokens=4) is None
    tuiprof.request_token("q")
    tuiprof.request_finished("q", reason="stop")
    book = RequestBook()
    marks._requests = book
    try:
        tuiprof.request_arrived("q", prompt_tokens=4)
        tuiprof.request_token("q", n=2)
        tuiprof.request_finished("q", reason="stop")
        tuiprof.request_finished("q", reason="stop")      # misuse: counted, not raised
        tuiprof.request_arrived("r", prompt_tokens="many")  # a bad count: swallowed
    finally:
        marks._requests = None
    r = book.view().get("q")
    assert (r.prompt_tokens, r.output_tokens, r.reason, r.source) == (4, 2, "stop", "api")
    assert book.misuse == {"finished_twice": 1}


def test_ten_thousand_requests_keep_memory_flat():
    """The last ``keep`` requests whole, the rest as aggregates: the store's memory after
    10,000 requests is what it was after 5,000 (every bounded structure full by then)."""
    st = SessionStore(requests_keep=256)
    book = st.requests

    def serve(lo: int, hi: int) -> None:
        t = lo * 10 * MS
        for i in range(lo, hi):
            book.arrived(i, 32, "api", t=t)
            for k in range(1, 9):
                book.tokens(i, 1, t=t + k * MS)
            book.finished(i, "length", t=t + 9 * MS)
            t += 10 * MS

    tracemalloc.start()
    serve(0, 5000)
    mid, _ = tracemalloc.get_traced_memory()
    serve(5000, 10000)
    end, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    v = st.view()
    assert len(v.requests.rows) == 256 and v.requests.counts["finished"] == 10000
    assert v.requests.stats["itl_ms"].count == 70000
    # flat: the 5,000 requests after the first 5,000 add less than 32 bytes each (what is
    # left is a dict's table between two compactions, not per-request growth)
    assert end - mid < 5000 * 32, (mid, end)
    assert len(book._gone) <= 1024 and not book._live


def test_requests_in_flight_are_capped():
    book = RequestBook(keep=8, max_in_flight=100)
    for i in range(250):
        book.arrived(i, 1, "api", t=i)
    assert len(book.view().rows) == 100 and book.misuse["dropped_in_flight"] == 150


def test_reset_forgets_finished_requests_and_keeps_those_in_flight():
    st = serving_store()
    st.reset()
    v = st.view()
    assert [r.id for r in v.requests.rows] == ["c", "d"]
    assert v.requests.counts["finished"] == 0 and v.requests.stats["ttft_ms"].count == 0
    st.requests.tokens("c", 1, t=200 * MS)      # still known: no misuse
    assert not st.requests.misuse


def test_a_mirror_gets_the_same_requests_through_deltas():
    st = SessionStore(requests_keep=3)
    m = Mirror()
    cursor = None
    book = st.requests
    for i in range(6):
        book.arrived(f"r{i}", 8, "api", t=i * MS)
        book.tokens(f"r{i}", 1, t=i * MS + 5)
        if i % 2:
            book.finished(f"r{i - 1}", "stop", t=i * MS + 9)
        delta, cursor = st.changes(cursor)
        m.apply(delta)
        want = st.view().requests
        got = m.view().requests
        assert [(r.id, r.status, list(r.token_ns)) for r in got.rows] == \
               [(r.id, r.status, list(r.token_ns)) for r in want.rows]
        assert got.counts == want.counts
    delta, cursor = st.changes(cursor)
    assert delta["requests"] is None             # nothing changed: nothing sent


def test_a_warm_up_request_is_kept_apart_from_every_count():
    """A load generator's warm-up request was counted as one of the load's (97 requests for
    ``--requests 96``): marked before it arrives, or while in flight, it is kept whole but
    apart from the counts, the statistics, the sources and the rows the analysis reads."""
    import tuiprof
    from tuiprof import marks
    from tuiprof.analysis.requests import window

    st = SessionStore()
    book = st.requests
    marks._requests = book
    try:
        tuiprof.request_warmup("warmup0")            # before it arrives
    finally:
        marks._requests = None
    book.arrived("warmup0", 8, "transformers", t=1 * MS)
    book.tokens("warmup0", 4, t=5 * MS)
    book.finished("warmup0", "length", t=6 * MS)
    book.arrived("late", 8, "transformers", t=7 * MS)   # marked while in flight
    book.tokens("late", 2, t=8 * MS)
    book.warmup("late")
    book.finished("late", "length", t=9 * MS)
    for i in range(3):
        book.arrived(f"r{i}", 8, "transformers", t=(10 + i) * MS)
        book.tokens(f"r{i}", 5, t=(20 + i) * MS)
        book.finished(f"r{i}", "length", t=(30 + i) * MS)
    req = st.view().requests
    assert [r.id for r in req.rows] == ["r0", "r1", "r2"]
    assert [r.id for r in req.warmup] == ["warmup0", "late"]
    assert all(r.warmup for r in req.warmup) and not any(r.warmup for r in req.rows)
    assert req.warmup[0].output_tokens == 4 and req.warmup[0].status == "finished"
    assert (req.counts["arrived"], req.counts["finished"], req.counts["tokens"],
            req.counts["warmup"]) == (3, 3, 15, 2)
    assert req.stats["e2e_ms"].count == 3 and req.sources == {"transformers": 3}
    assert window(st.view(), seconds=1e9).finished == 3
    # a mirror in another process sees the same split
    m = Mirror()
    delta, _ = st.changes(None)
    m.apply(delta)
    got = m.view().requests
    assert [r.id for r in got.rows] == ["r0", "r1", "r2"]
    assert [r.id for r in got.warmup] == ["warmup0", "late"] and got.counts == req.counts


def test_a_warm_up_is_marked_in_the_snapshot_and_read_back_apart(tmp_path):
    import json

    from tuiprof.export.snapshot import read_snapshot, write_snapshot

    st = serving_store()
    st.requests.warmup("w")
    st.requests.arrived("w", 4, "api", t=200 * MS)
    st.requests.finished("w", "stop", t=201 * MS)
    path = write_snapshot(st.view(), tmp_path / "s.json")
    doc = json.loads(path.read_text())
    marked = [r["id"] for r in doc["requests"] if r.get("warmup") is True]
    assert marked == ["w"] and doc["request_stats"]["counts"]["warmup"] == 1
    assert not any("warmup" in r for r in doc["requests"] if r["id"] != "w")
    v = read_snapshot(path)
    assert [r.id for r in v.requests.warmup] == ["w"]
    assert "w" not in {r.id for r in v.requests.rows}
    assert write_snapshot(v, tmp_path / "again.json").read_bytes() == path.read_bytes()


def test_a_proxied_request_learns_the_steps_that_reach_the_store_after_it_finished():
    """A native program's steps come from its kernel stream, behind its requests: on an H200
    a llama-server's 33 proxied requests all finished before any of their steps reached the
    store, and each read 100 % "outside model steps". The steps that ran while a finished
    request was in flight join it when they come, and its time outside the steps enters the
    aggregates once the stream has passed its finish (a later step or an empty window)."""
    book = RequestBook()
    book.arrived("p1", source="proxy", t=100 * MS)
    book.finished("p1", t=200 * MS, output_tokens=4)
    book.arrived("p2", source="proxy", t=150 * MS)
    book.finished("p2", t=260 * MS, output_tokens=4)
    row = book.view().rows[0]
    assert row.outside and list(row.steps) == [] and row.model_ns == 0   # nothing yet
    # the view is whole meanwhile: both rows' time outside so far
    assert book.view().stats["outside_ms"].count == 2
    book.step_interval(120 * MS, 140 * MS, 0)    # steps of p1's (and p2's) interval, late
    book.step_interval(160 * MS, 190 * MS, 1)
    assert book.stats["outside_ms"].count == 0   # the stream has not passed their finish
    book.step_interval(250 * MS, 270 * MS, 2)    # begins after p1's finish: p1 is whole
    p1, p2 = book.view().rows
    assert list(p1.steps) == [0, 1] and p1.model_ns == 50 * MS
    assert list(p2.steps) == [1, 2] and p2.model_ns == 30 * MS + 10 * MS
    assert book.stats["outside_ms"].count == 1 and book.stats["outside_ms"].max == 50.0
    book.steps_until(300 * MS)                   # an empty window after p2's finish
    st = book.stats["outside_ms"]
    assert st.count == 2 and sorted([st.min, st.max]) == [50.0, 70.0]
    assert book.counts["finished"] == 2          # counted at their finish, as always
