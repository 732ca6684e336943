"""A real Prometheus (Debian's ``prometheus`` binary) scrapes a detached session's
``--metrics`` while a load runs; PromQL's TTFT p50 agrees with the snapshot's within one
bucket (bench/verify/prometheus_scrape.py, which this runs)."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="no prometheus binary: apt-get install prometheus (.ci/run does)")
def test_a_real_prometheus_agrees_with_the_snapshot(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "prometheus_scrape", ROOT / "bench" / "verify" / "prometheus_scrape.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.run(requests=16, work=tmp_path)
    assert out.get("ok"), out
    assert out["prometheus_finished"] == out["snapshot_finished"] == 16   # the warm-up apart
    assert out["scrapes"] >= 3
    # the keeper's final snapshot says what it served
    assert out["snapshot_feeds"]["metrics"]["scrapes"] >= 3
