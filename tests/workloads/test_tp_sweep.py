"""`tuiprof sweep --tp`: the scaling table and the snapshots it writes (from two-rank stores
as a 2-GPU session leaves them; the sessions themselves are exercised in tests/sessions)."""
from __future__ import annotations

import csv
import json

import pytest
from ranks_data import rank_store, two_ranks

from tuiprof.analysis.cross_rank import find_ranks, ranks_summary
from tuiprof.cli import main
from tuiprof.store.rank_set import RanksView
from tuiprof.sweep.tp import ModeResult, TPRun, markdown, scaling_rows, write_outputs


def _run(tp: int, rv: RanksView) -> TPRun:
    s = ranks_summary(rv, "eager")
    return TPRun("qwen3-0.6b", tp, load_s=20.0, modes={"eager": ModeResult("eager", rv, s, find_ranks(rv, s))},
                 final=rv)


def test_scaling_rows_and_the_tp2_snapshot_carry_the_tp1_reference(tmp_path):
    tp1 = RanksView((rank_store(0, 12, compute_us=5000, comm_us=0, step_us=6000).view(),))
    runs = [_run(1, tp1), _run(2, two_ranks())]
    rows = scaling_rows(runs)
    one, two = rows
    assert (one["tp"], one["speedup"], two["tp"]) == (1, None, 2)
    assert one["ms_per_step"] == pytest.approx(5.5)
    assert two["ms_per_step"] == pytest.approx((4.5 + 4.53) / 2)
    assert two["speedup"] == pytest.approx(5.5 / 4.515) and two["efficiency"] == pytest.approx(5.5 / 4.515 / 2)
    assert (two["comm_share_min"], two["comm_share_max"]) == pytest.approx((0.9 / 4.53, 1.5 / 4.5))
    assert (two["late_rank"], two["transfer_ms"], two["wait_ms_max"]) == (1, pytest.approx(0.9),
                                                                         pytest.approx(0.6))
    assert "| qwen3-0.6b | eager | 2 | 4.515 |" in markdown(rows)
    paths = write_outputs(runs, tmp_path)
    with open(tmp_path / "tp_scaling.csv") as fh:
        assert [r["tp"] for r in csv.DictReader(fh)] == ["1", "2"]
    doc = json.loads((tmp_path / "tp2-qwen3-0.6b.json").read_text())
    assert doc["world"]["tp_reference"]["ms_per_token"] == pytest.approx(5.5)
    assert "tp-scaling" in {f["id"] for f in doc["findings"]}
    assert len(paths) == 3


def test_sweep_needs_seq_lens_batches_or_tp(capsys):
    assert main(["sweep", "--models", "gpt2-tiny"]) == 2
    err = capsys.readouterr().err
    assert "needs --seq-lens" in err and "--batches" in err and "--tp (a tensor-parallel" in err
