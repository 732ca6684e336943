"""bench/overhead/step_cost.py times the real step path: every hooked step reaches the store."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_step_cost_bench_records_every_step(capsys):
    sys.path.insert(0, str(REPO))
    spec = importlib.util.spec_from_file_location("step_cost", REPO / "bench" / "overhead" / "step_cost.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--steps", "300", "--rounds", "2"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:2] == ["300", "2"]
    # the warm-up's prefill and 1,000 steps, then a prefill and 300 steps a round
    assert int(cells[3]) == 1001 + 2 * 301
    assert float(cells[2].split()[0]) > 0
