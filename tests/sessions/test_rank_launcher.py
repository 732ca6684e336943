"""Tensor-parallel sessions end to end on the CPU: `tuiprof --tp 2` starts two real
torch.distributed ranks (gloo) of transformers' Qwen3, each a session process with its own
store; the UI process mirrors both.

One headless run (module fixture) feeds the snapshot, export and reopened-app tests; one live
session exercises lockstep keys and a rank killed mid-run.
"""
from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import sqlite3

import pytest
from rich.console import Console

from tuiprof.cli import main
from tuiprof.export.snapshot import read_any_snapshot
from tuiprof.spec import EngineSpec, ProfilerOptions
from tuiprof.sessions.rank_launcher import FIXED_BATCH, RankSetControl
from tuiprof.ui.app import make_app, view_control
from tuiprof.ui.screens.all_ranks import RanksScreen

from ._helpers import quit_app
from ._helpers import screen_text as _screen_text
from ._helpers import until as _until

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp2") / "tp2.json"
    code = main(["--model", "qwen3-tiny", "--tp", "2", "--headless", "--device", "cpu",
                 "--max-new-tokens", str(NEW_TOKENS), "--prompt-len", "8", "--json", str(out)])
    return code, out


def test_headless_tp2_snapshot_holds_both_ranks_and_their_tokens_equal_tp1(tp2_run, capsys):
    from tuiprof.engine.events import CollectingListener
    from tuiprof.engine.load import load_engine

    code, out = tp2_run
    assert code == 0
    rv = read_any_snapshot(out)
    assert rv.world_size == 2
    ids = []
    for r, view in enumerate(rv.views):
        m = view.meta
        assert (m["rank"], m["world_size"], m["tp"], m["backend"], m["device_index"]) == (r, 2, 2, "gloo", r)
        rows = [t for t in view.tokens if t.done]
        assert len(rows) == NEW_TOKENS and rows[0].phase == "prefill"
        assert all(t.host_ms > 0 for t in rows)
        ids.append([t.token_id for t in rows])
    engine = load_engine("qwen3-tiny", device="cpu", dtype="float32", prompt_len=8,
                         max_new_tokens=NEW_TOKENS)
    engine.listener = ref = CollectingListener()
    engine.run()
    assert ids[0] == ids[1] == ref.token_ids and len(set(ref.token_ids)) > 3
    assert rv.clock.residual_ns is not None and not rv.clock.applied   # one host, one clock


def test_exports_of_a_tp2_snapshot_name_both_devices(tp2_run, tmp_path, capsys):
    _, out = tp2_run
    assert main(["export", str(out), "--nsys", str(tmp_path / "nsys"), "--sqlite",
                 str(tmp_path / "tp.sqlite"), "--trace", str(tmp_path / "tp.json")]) == 0
    names = {p.name for p in (tmp_path / "nsys").iterdir()}
    assert {"rank0_nvtx_sum.csv", "rank1_nvtx_sum.csv", "all_nvtx_sum.csv"} <= names
    con = sqlite3.connect(tmp_path / "tp.sqlite")
    assert [r[0] for r in con.execute("SELECT id FROM TARGET_INFO_GPU ORDER BY id")] == [0, 1]
    assert len(con.execute("SELECT DISTINCT globalTid FROM NVTX_EVENTS").fetchall()) == 2
    trace = json.loads((tmp_path / "tp.json").read_text())
    procs = {e["pid"] for e in trace["traceEvents"] if e.get("cat") == "token"}
    assert procs == {0, 1}


def test_a_reopened_tp2_snapshot_has_the_rank_selector(tp2_run):
    _, out = tp2_run
    app = make_app(view_control(read_any_snapshot(out)), refresh_hz=0)

    async def run():
        async with app.run_test(size=(80, 24)) as pilot:
            app.refresh_now()
            assert app.rank == 0 and app.view.meta["rank"] == 0
            await pilot.press("g")
            assert app.rank == 1 and app.view.meta["rank"] == 1
            await pilot.pause()
            assert "rank 1/2" in _screen_text(app)
            await pilot.press("a")
            await pilot.pause()
            app.refresh_now()
            await pilot.pause()
            assert isinstance(app.screen, RanksScreen)
            text = _screen_text(app)
            assert "▶rank 1" in text and "rank 0" in text and "tokens/s" in text
            # why the split is empty here (gloo: no kernels), and the words, defined once; read
            # from the table itself: a late rank's longer line (the ranks' host timing decides
            # whether one is named) can push it below the 24 rows
            table = Console(width=400, file=io.StringIO(), record=True)
            table.print(app.screen.query_one("#ranks-table").content)
            assert "compute / transfer / wait need kernel records: no CUPTI" in table.export_text()
            await pilot.press("escape")
            await pilot.press("question_mark")
            await pilot.pause()
            body = Console(width=400, file=io.StringIO(), record=True)
            body.print(app.screen.query_one("#help-body").content)
            words = body.export_text()
            assert "Across ranks" in words and "wait = the rest, waiting for the late rank" in words
            await pilot.press("escape")
            await pilot.press("g")
            assert app.rank == 0

    asyncio.run(run())


def test_live_ranks_pause_together_and_a_killed_rank_is_one_line_with_data_kept(tmp_path):
    opts = ProfilerOptions(cupti=False, nvml=False, engine=EngineSpec.resolve(
        "qwen3-tiny", device="cpu", max_new_tokens=24, loop=True, prompt_len=8))
    ctl = RankSetControl(opts, {"ring_tokens": 8}, 2)
    ctl.start()
    app = make_app(ctl, export_dir=tmp_path, refresh_hz=4.0)

    def tokens(r: int) -> int:
        return ctl.ranks[r].view(raw=False, wait=True).counters.get("tokens", 0)

    async def run():
        async with app.run_test(size=(120, 40)) as pilot:
            await _until(lambda: app.view is not None and app.view.counters["tokens"] > 10, app)
            # b/B are shown disabled and say why (the ranks keep their starting batch)
            assert app.check_action("batch_up", ()) is None
            await pilot.press("b")
            assert app.last_message == FIXED_BATCH
            assert all(c.status.batch in (None, 1) for c in ctl.ranks)
            await pilot.press("space")                        # reaches rank 0 only ...
            await _until(lambda: all(c.status.state == "paused" for c in ctl.ranks), app, 30)
            n = (tokens(0), tokens(1))
            await asyncio.sleep(0.6)
            assert (tokens(0), tokens(1)) == n and n[0] == n[1]   # ... both stopped at one step
            await pilot.press("space")
            await _until(lambda: tokens(1) > n[1] + 5, app, 30)
            os.kill(ctl.ranks[1].pid, signal.SIGKILL)
            await _until(lambda: ctl.status.state == "error", app, 30)
            msg = ctl.status.message
            assert msg.startswith("rank 1: process killed by SIGKILL; the other ranks were "
                                  "stopped and everything measured is kept") and "\n" not in msg
            kept = [len(ctl.ranks[r].view(raw=False).tokens) for r in (0, 1)]
            assert min(kept) > 10
            await pilot.press("e")
            await _until(lambda: list(tmp_path.glob("tuiprof-*.json")), app, 30)
            await quit_app(pilot, app)

    asyncio.run(run())
    ctl.stop()
    ctl.close()
    assert not ctl.busy
    doc = json.loads(next(tmp_path.glob("tuiprof-*.json")).read_text())
    assert [len(r["tokens"]) > 10 for r in doc["ranks"]] == [True, True]
    assert doc["world"]["failure"].startswith("rank 1: process killed by SIGKILL")
