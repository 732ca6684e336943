"""``--metrics``: the store's never-reset histograms and totals, the collector's OpenMetrics
text over a real HTTP server on 127.0.0.1, bounded series over a 10,000-request soak, and the
port checked before a run."""
from __future__ import annotations

import math
import socket
import urllib.request

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tuiprof.cli import main  # noqa: E402
from tuiprof.errors import TuiprofError  # noqa: E402
from tuiprof.export import metrics  # noqa: E402
from tuiprof.export.feeds import Source  # noqa: E402
from tuiprof.sessions.mirror import Mirror  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402
from tuiprof.store.stats import Buckets  # noqa: E402

from .fleet_data import free_port, serve  # noqa: E402


def _samples(text: str) -> dict:
    """{(sample name, frozenset of labels): value} of an exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _one(samples: dict, name: str, **labels) -> float:
    hits = [v for (n, ls), v in samples.items() if n == name
            and all((k, v2) in ls for k, v2 in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_buckets_are_cumulative_and_quantile_is_prometheus_s():
    b = Buckets((1, 2, 5))
    b.add_many([0.5, 1, 1.5, 2, 4, 9])
    assert b.cumulative() == [(1, 2), (2, 4), (5, 5), (math.inf, 6)]
    assert b.total == pytest.approx(18.0) and b.count == 6
    # rank 3 of 6 falls in (1, 2], halfway through its 2 values: 1.5
    assert b.quantile(0.5) == pytest.approx(1.5)
    assert Buckets((1,)).quantile(0.5) is None


def test_counts_only_grow_through_a_reset_and_rings_rolling_over():
    store = SessionStore(series_len=8, requests_keep=4)
    serve(store, 20)
    v1 = store.view(raw=False)
    store.reset()                       # the r key: what a person reads starts again
    serve(store, 5, t0=v1.tokens[-1].end_ns + 10**6, first=20)
    v2 = store.view(raw=False)
    assert v2.requests.counts["finished"] == 5          # the readers' figures were reset
    assert v2.requests.totals["finished"] == 25         # a scraper's were not
    assert v2.requests.buckets["ttft_ms"].count == 25
    steps = sum(b.count for b in v2.fleet["steps"].values())
    assert steps == v2.fleet["totals"]["steps"] == 100   # 8 rows kept, 100 counted
    assert len(v2.tokens) == 8 and len(v2.requests.finished) == 4
    for name, b in v2.requests.buckets.items():
        old = v1.requests.buckets[name]
        assert all(c2 >= c1 for (_, c1), (_, c2) in zip(old.cumulative(), b.cumulative()))
    assert v2.fleet["totals"]["prefill_tokens"] == 25 * 16
    assert v2.fleet["totals"]["decode_tokens"] == 25 * 3


def test_a_mirror_carries_the_counts():
    store = SessionStore()
    serve(store, 6)
    m = Mirror()
    delta, _ = store.changes(None)
    m.apply(delta)
    v, mv = store.view(raw=False), m.view(raw=False)
    assert mv.fleet["totals"] == v.fleet["totals"]
    assert mv.requests.totals == v.requests.totals
    assert (mv.requests.buckets["e2e_ms"].cumulative()
            == v.requests.buckets["e2e_ms"].cumulative())
    assert metrics.render(Source(lambda raw: [mv], host="h")) == \
        metrics.render(Source(lambda raw: [v], host="h"))


def test_the_exposition_says_what_the_store_holds():
    store = SessionStore()
    serve(store, 10)
    v = store.view(raw=False)
    s = _samples(metrics.render(Source.of(store)))
    assert _one(s, "tuiprof_requests_finished_total") == 10
    assert _one(s, "tuiprof_steps_total") == 40
    assert _one(s, "tuiprof_prefill_tokens_total") == 160
    assert _one(s, "tuiprof_decode_tokens_total") == 30
    assert _one(s, "tuiprof_requests_in_flight") == 0
    assert _one(s, "tuiprof_request_ttft_seconds_count") == 10
    assert _one(s, "tuiprof_request_ttft_seconds_sum") == pytest.approx(
        v.requests.stats["ttft_ms"].total / 1000)
    assert _one(s, "tuiprof_request_itl_seconds_count") == 30   # 4 tokens a request
    # each bucket: the finished requests whose TTFT is at most its edge
    ttfts = [r.ttft_ms for r in v.requests.finished]
    for edge in (0.01, 0.015, 0.02, 0.03):
        assert _one(s, "tuiprof_request_ttft_seconds_bucket", le=repr(edge)) == \
            sum(1 for x in ttfts if x <= edge * 1000 + 1e-9)
    assert _one(s, "tuiprof_step_seconds_count", phase="decode", mode="eager") == 30
    gemm = _one(s, "tuiprof_kernel_seconds_total", category="GEMM/GEMV")
    assert gemm == pytest.approx(sum(1 for t in v.tokens if t.sampled) * 1e-3)
    ew = _one(s, "tuiprof_kernel_seconds_total", category="elementwise")
    assert gemm == pytest.approx(2 * ew)            # 1 ms and 0.5 ms a traced step
    assert _one(s, "tuiprof_batch") == 1
    lv = {k for (n, ls), _ in s.items() if n == "tuiprof_steps_total" for k in ls}
    assert lv == {("host", socket.gethostname()), ("pid", str(__import__("os").getpid())),
                  ("role", "engine"), ("rank", ""), ("gpu", "")}


def test_a_10000_request_soak_keeps_the_series_flat():
    """Cardinality: request ids never become labels, so the series of a scrape are the same
    after 100 requests as after 10,000; every counter only grows."""
    store = SessionStore(requests_keep=64)
    src = Source.of(store)
    counts, prev, t = [], None, None
    for block in range(10):
        t = serve(store, 1000, first=block * 1000, **({"t0": t} if t else {}))
        text = metrics.render(src)
        assert "req-" not in text
        s = _samples(text)
        counts.append(len(s))
        if prev is not None:
            for key, value in prev.items():
                if key[0].endswith(("_total", "_count", "_bucket", "_sum")):
                    assert s[key] >= value, key
        prev = s
    assert len(set(counts)) == 1, counts
    assert _one(prev, "tuiprof_requests_finished_total") == 10_000
    assert _one(prev, "tuiprof_request_ttft_seconds_count") == 10_000


def test_a_real_http_scrape_and_a_port_in_use(tmp_path):
    store = SessionStore()
    serve(store, 3)
    port = free_port()
    srv = metrics.start(metrics.check(f"127.0.0.1:{port}"), Source.of(store))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert _one(_samples(text), "tuiprof_requests_finished_total") == 3
        serve(store, 2, t0=store.view(raw=False).tokens[-1].end_ns + 10**6, first=3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            s = _samples(r.read().decode())
        assert _one(s, "tuiprof_requests_finished_total") == 5   # read at each scrape
        assert _one(s, "tuiprof_scrape_duration_seconds") > 0
        with pytest.raises(TuiprofError, match=f"--metrics 127.0.0.1:{port}: cannot listen"):
            metrics.check(f"127.0.0.1:{port}")
    finally:
        srv.close()
    with pytest.raises(TuiprofError, match="give HOST:PORT"):
        metrics.check("127.0.0.1")


def test_a_port_in_use_stops_every_session_kind_before_it_starts(tmp_path, capsys):
    port = free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        for argv in (["--model", "qwen3-tiny", "--device", "cpu", "--headless"],
                     ["serve", "--model", "qwen3-tiny", "--device", "cpu", "--headless"],
                     ["run", "--detach", "--", "python", "-c", "pass"],
                     ["run", "--headless", "--", "python", "-c", "pass"]):
            assert main([*argv, "--metrics", f"127.0.0.1:{port}",
                         "--json", str(tmp_path / "x.json")] if "--" not in argv else
                        [*argv[:argv.index("--")], "--metrics", f"127.0.0.1:{port}",
                         *argv[argv.index("--"):]]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "cannot listen there" in err[0], err
    assert not list(tmp_path.iterdir())    # nothing started, nothing written


def test_kernel_time_stays_counted_through_a_reset():
    """Kernel time comes from aggregates that r resets; the collector keeps it a counter."""
    store = SessionStore()
    t = serve(store, 4)
    col = metrics.SessionCollector(Source.of(store))

    def kernel_s() -> float:
        for fam in col.collect():
            if fam.name == "tuiprof_kernel_seconds":
                return sum(s.value for s in fam.samples)
        return 0.0

    before = kernel_s()
    store.reset()
    assert kernel_s() == before            # nothing new, nothing lost
    serve(store, 4, t0=t, first=4)
    assert kernel_s() == pytest.approx(2 * before)


def test_nvml_and_gpm_gauges_from_a_real_h100_recording():
    """The NVML columns a real GPU gave (a recording of an H100 session, replayed through the
    store) reach the exposition under their names and units: the sampler's keys and the
    feed's must stay the same."""
    from pathlib import Path  # noqa: PLC0415

    from tuiprof.collect.replay import load_recording, replay_into  # noqa: PLC0415

    rec = load_recording(Path(__file__).resolve().parents[1] / "data"
                         / "qwen3-0.6b_eager_decode64.json.gz")
    store = SessionStore()
    replay_into(rec, store)
    last = store.view(raw=False).nvml[-1]
    s = _samples(metrics.render(Source.of(store)))
    assert _one(s, "tuiprof_gpu_sm_clock_hertz") == last["sm_clock_mhz"] * 1e6 > 0
    assert _one(s, "tuiprof_gpu_memory_used_bytes") == last["mem_used_bytes"] > 0
    assert _one(s, "tuiprof_gpu_power_watts") == pytest.approx(last["power_mw"] / 1000)
    assert _one(s, "tuiprof_gpu_utilization_ratio") == pytest.approx(last["util_gpu"] / 100)
    gpm = [k for k in last if k.startswith("gpm_")]
    for key, name, scale, _ in metrics.NVML_GAUGES:
        if key in gpm:
            assert _one(s, f"tuiprof_{name}") == pytest.approx(last[key] * scale)
