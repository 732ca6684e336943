"""bench/verify/soak.py runs on the CPU (qwen3-tiny, eager, a few hundred ms per row): it produces its
rows, its CSV and its Markdown table. The real soak is a GPU run (docs/reliability.md)."""
from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_soak_smoke(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("soak", REPO / "bench" / "verify" / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    out = tmp_path / "soak.csv"
    rc = soak.main(["--model", "qwen3-tiny", "--mode", "eager", "--tokens", "60", "--interval",
                    "0.5", "--warmup", "0.5", "--keys", "2", "--csv", str(out),
                    "--json", str(tmp_path / "soak.json"), "--max-rss-growth-mb", "500"])
    text = capsys.readouterr().out
    assert rc == 0, text
    rows = list(csv.DictReader(out.open()))
    assert len(rows) >= 2 and int(rows[-1]["tokens"]) > int(rows[0]["tokens"])  # numbers, not text
    assert all(r["state"] in ("decode", "prefill") and r["mode"] == "eager" for r in rows)
    # The session process (model, collectors, store) and the UI process are measured apart.
    assert float(rows[0]["rss_mb"]) > 0 and float(rows[0]["ui_rss_mb"]) > 0
    assert int(rows[-1]["keys"]) == 2
    assert "| resident memory, MB (session process) |" in text
    assert "| resident memory of the UI process, MB |" in text and "key → handler latency" in text
    from tuiprof.export.snapshot import read_snapshot
    assert read_snapshot(tmp_path / "soak.json").counters["tokens"] >= 60
