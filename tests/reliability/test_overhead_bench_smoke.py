"""bench/overhead/overhead.py runs on the CPU (qwen3-tiny, eager): its windows run back to back, a block
holds exactly one sampling period of ``auto`` tokens and as many ``bare`` ones, and the table
pairs them. The real measurement is a GPU run (docs/performance.md)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_overhead_bench_smoke(tmp_path, capsys):
    sys.path.insert(0, str(REPO))
    spec = importlib.util.spec_from_file_location("overhead", REPO / "bench" / "overhead" / "overhead.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "overhead.json"
    rc = bench.main(["--model", "qwen3-tiny", "--device", "cpu", "--modes", "eager",
                     "--blocks", "2", "--eager-tokens", "32", "--warmup", "4",
                     "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    res = json.loads(out.read_text())
    wins = res["windows"]
    period = bench.period("eager")                       # 256 tokens: one burst of auto
    for b in (0, 1):
        block = [w for w in wins if w["block"] == b]
        # A B, B A, A B, B A: alternating, the block ending where it began
        assert [w["config"] for w in block] == ["bare", "auto", "auto", "bare"] * (period // 64)
        assert sum(w["tokens"] for w in block if w["config"] == "auto") == period
        assert sum(w["tokens"] for w in block if w["config"] == "bare") == period
    rows = {r["config"]: r for r in res["table"]}
    assert rows["bare"]["block_ratio"] == 1.0 and rows["auto"]["blocks"] == 2
    assert 0.3 < rows["auto"]["block_ratio"] < 3.0
    # the engine kept running through every window; the listener saw auto's tokens only
    assert res["session"]["tuiprof"]["counters"]["tokens"] >= 2 * period
