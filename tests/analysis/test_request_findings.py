"""The request findings fire with their numbers on a server session where they hold, and stay
quiet where they do not; the sweep's cells and its SLO finding."""
from __future__ import annotations

import sys
from pathlib import Path

from tuiprof.analysis.findings import find
from tuiprof.analysis.request_rules import best_load, serve_cell, sweep_finding
from tuiprof.analysis.requests import story, window
from tuiprof.store import SessionStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from requests_data import MS, serving_store  # noqa: E402


def _ids(view) -> dict:
    return {f.id: f for f in find(view)}


def _server(startup_ms: int = 0, steps: int = 12, gap_ms: int = 0, kv_full: bool = False,
            pending: int = 0, batch: int = 4) -> SessionStore:
    """``batch`` requests arrive at 0; the first step starts ``startup_ms`` later; each step is
    10 ms, ``gap_ms`` apart (nothing running between them)."""
    st = SessionStore()
    book = st.requests
    ids = [f"q{i}" for i in range(batch)]
    t0 = 1000 * MS    # a clock never reads 0 (0 means "not reached" in a request's row)
    for rid in ids:
        book.arrived(rid, 16, "api", t=t0)
    t = t0 + startup_ms * MS
    for i in range(steps):
        seq = st.begin_token("prefill" if i == 0 else "decode", "eager", t, i, batch=batch)
        pre, dec = (tuple(ids), ()) if i == 0 else ((), tuple(ids))
        st.set_step_requests(seq, prefill=pre, decode=dec, prefill_tokens=64 if i == 0 else 0,
                             decode_tokens=len(dec), pending=pending, running=batch,
                             kv_used=64 if kv_full else 8, kv_total=64)
        st.end_token(seq, t + 10 * MS, 10.0)
        for rid in ids:
            book.tokens(rid, 1, t=t + 10 * MS)
        t += (10 + gap_ms) * MS
    for rid in ids:
        book.finished(rid, "length", t=t)
    return st


def test_a_calm_server_has_no_request_findings():
    got = _ids(_server().view())
    assert not {"requests-waiting", "outside-model-steps", "kv-cache-full",
                "batch-underfilled", "itl-neighbour-prefill"} & set(got)


def test_start_up_before_the_first_step_is_named():
    f = _ids(_server(startup_ms=6500).view())["requests-waiting"]
    assert "start-up" in f.title and "6.5 s" in f.title
    assert f.numbers["queue_max_ms"] == 6500.0


def test_time_outside_model_steps_with_its_numbers():
    # 12 steps of 10 ms, 500 ms apart: most of a request's life no step runs
    f = _ids(_server(gap_ms=500).view())["outside-model-steps"]
    assert f.title == "6.0 s of 6.1 s a request is outside model steps", f.title
    assert f.numbers["share"] > 0.9


def test_kv_cache_full_and_an_underfilled_batch():
    got = _ids(_server(kv_full=True, pending=3).view())
    assert "KV cache full in 12 of 12 steps" in got["kv-cache-full"].title
    assert "batch-underfilled" not in got          # full KV: the batch could not grow
    st = SessionStore()
    ids = [f"q{i}" for i in range(4)]
    for rid in ids:
        st.requests.arrived(rid, 8, "api", t=0)
    for i in range(10):   # 4 requests once, then 1 a step while 3 wait
        dec = tuple(ids) if i == 0 else (ids[0],)
        seq = st.begin_token("decode", "eager", i * 10 * MS, i, batch=len(dec))
        st.set_step_requests(seq, decode=dec, decode_tokens=len(dec), pending=3,
                             running=len(dec), kv_used=8, kv_total=64)
        st.end_token(seq, (i * 10 + 9) * MS, 9.0)
    f = _ids(st.view())["batch-underfilled"]
    assert "9 of 10 steps advanced 1.0 requests (up to 4 seen) with 3.0 waiting" in f.title


def test_itl_spikes_from_a_neighbours_prefill_and_the_ttft_split():
    st = serving_store()
    # two more mixed steps so that there are two of each kind
    book = st.requests
    book.arrived("e", 64, "api", t=131 * MS)
    seq = st.begin_token("prefill", "eager", 132 * MS, 6, batch=2)
    st.set_step_requests(seq, prefill=("e",), decode=("c",), prefill_tokens=64, decode_tokens=1)
    st.end_token(seq, 180 * MS, 48.0)
    got = _ids(st.view())
    f = got["itl-neighbour-prefill"]
    assert f.numbers["mixed_step_p50_ms"] == 48.0 and f.numbers["decode_step_p50_ms"] == 10.0
    assert "48.0 ms vs 10.0 ms" in f.title
    split = got["ttft-split"]
    assert split.numbers["queue_p50_ms"] == 10.0 and split.numbers["dominated_by"] == "prefill"


def test_a_requests_story_and_the_window():
    v = serving_store().view()
    s = story(v, "b")
    assert s.waited_ms == 9.0 and s.steps_before == 0 and s.prefill_steps == 1
    assert s.decode_steps == 4 and s.outside_ms == 12.0
    c = story(v, "c")
    assert c.behind == [] and c.shared_mean == 1.5
    w = window(v)
    assert w.finished == 2 and w.in_flight == 2
    assert w.quantiles["itl_ms"] == (11.0, 50.0, 50.0)
    assert story(v, "nope") is None


def test_sweep_cells_goodput_and_the_highest_rate_meeting_the_slo():
    v = serving_store().view()
    cell = serve_cell(v.requests.rows, "rate", 2.0, slo_ttft_ms=29.5, slo_itl_ms=30.0)
    assert cell.requests == 2 and cell.attainment == 0.5     # b: TTFT 29 ms; a: 30 ms
    assert cell.goodput_rps == 1 / (cell.duration_s)
    ok = serve_cell(v.requests.rows, "rate", 1.0, slo_ttft_ms=100, slo_itl_ms=30.0)
    assert best_load([ok, cell]) is ok
    f = sweep_finding([ok, cell], 100.0, 30.0)
    assert f.id == "slo-max-load" and "1 req/s" in f.title
    none = sweep_finding([cell], 1.0, None)
    assert none.title.startswith("No rate met the SLO")
    assert sweep_finding([cell], None, None) is None
