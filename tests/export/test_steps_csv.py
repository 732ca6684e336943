"""tuiprof export --steps-csv: every step of a session as a CSV row, read back with the csv
module (the format's own reader), for one process and for every rank."""
from __future__ import annotations

import csv

from tuiprof.cli import main
from tuiprof.export.snapshot import write_snapshot
from tuiprof.export.steps_csv import COLUMNS, write_steps_csv


def test_the_cli_writes_one_row_per_step_of_both_modes(both_modes_view, tmp_path, capsys):
    snap = write_snapshot(both_modes_view, tmp_path / "s.json")
    out = tmp_path / "steps.csv"
    assert main(["export", str(snap), "--steps-csv", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    rows = list(csv.DictReader(out.open()))
    done = [t for t in both_modes_view.timeline if t.done]
    assert len(rows) == len(done) and tuple(rows[0]) == COLUMNS
    assert {r["mode"] for r in rows} == {"eager", "compiled"}
    assert [int(r["seq"]) for r in rows] == [t.seq for t in done]
    decode = [r for r in rows if r["phase"] == "decode" and r["mode"] == "eager"]
    assert decode and all(int(r["traced"]) == 1 and int(r["kernels"]) > 1000 for r in decode)
    assert all(float(r["host_ms"]) > 0 for r in rows)


def test_every_rank_has_its_rows(tmp_path):
    from ranks_data import two_ranks

    rv = two_ranks()
    path = write_steps_csv(rv, tmp_path / "tp.csv")
    rows = list(csv.DictReader(path.open()))
    assert {r["rank"] for r in rows} == {"0", "1"}
    for r in (0, 1):
        mine = [x for x in rows if x["rank"] == str(r)]
        assert len(mine) == len([t for t in rv[r].tokens if t.done])
