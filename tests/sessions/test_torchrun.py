"""`tuiprof run -- torchrun ...` as it is, in the live app: the agent runs in the session
process, its workers are followed; a 2-rank gloo job that calls init_process_group itself has
both ranks' steps, each process knows its rank, ``g`` goes to the processes that work, ``a``
lists every process and compares the job's two ranks with the cross-rank analysis of ``--tp``
(skew, the slowest rank), and the snapshot written on ``q`` holds every process."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tuiprof.analysis.cross_rank import ranks_summary
from tuiprof.export.snapshot import read_any_snapshot
from tuiprof.store.rank_set import is_active, jobs, process_facts

from ._helpers import quit_app, runtime_dir, screen_text

REPO = Path(__file__).resolve().parents[2]
NEW_TOKENS = 4


@pytest.fixture(scope="module")
def torchrun_live(tmp_path_factory):
    from tuiprof.cli import parse_args
    from tuiprof.cli.program import live_control
    from tuiprof.cli.sessions import hold
    from tuiprof.ui.app import make_app
    from tuiprof.ui.screens.all_processes import ProcessesScreen

    mp = pytest.MonkeyPatch()
    runtime_dir(mp)
    tmp = tmp_path_factory.mktemp("torchrun")
    args = parse_args(["run", "--no-cupti", "--no-nvml", "--export-dir", str(tmp), "--",
                       "torchrun", "--standalone", "--nproc-per-node", "2",
                       str(REPO / "tests" / "programs" / "tp_job.py"), "--new-tokens",
                       str(NEW_TOKENS), "--seconds", "12"])
    main, name, stem = live_control(args)
    held = hold(args, main, name=name, kind="program", stem=stem)
    held.start()
    app = make_app(held, export_dir=tmp, auto_snapshot=True, refresh_hz=4.0)
    seen: dict = {}

    async def until(pred, seconds=180.0, what=""):
        t_end = time.monotonic() + seconds
        while not pred():
            assert time.monotonic() < t_end, (what, screen_text(app)[-3000:])
            app.refresh_view()
            await asyncio.sleep(0.2)

    def both_ranks_step() -> bool:
        rv = held.views()
        return any(all(len([t for t in v.timeline if t.done]) > NEW_TOKENS for v in job.views)
                   for _, job in jobs(rv))

    async def run():
        async with app.run_test(size=(200, 50)) as pilot:
            await until(both_ranks_step, 180, "steps")
            await pilot.press("g")                    # the agent is quiet: a worker is next
            seen["g"] = (app.rank, app.last_message, screen_text(app))
            await pilot.press("a")
            await pilot.pause()
            await until(lambda: "torch.distributed job" in screen_text(app)
                        and isinstance(app.screen, ProcessesScreen), 30, "a")
            await until(lambda: "ms/step" in screen_text(app), 30, "ms/step")
            seen["a"] = screen_text(app)
            await pilot.press("escape")
            await until(lambda: held.program_ended, 120, "end")
            await quit_app(pilot, app)

    try:
        asyncio.run(run())
    finally:
        held.stop()
        held.close()
        mp.undo()
    snaps = list(tmp.glob("tuiprof-*.json"))
    assert len(snaps) == 1
    return held, seen, read_any_snapshot(snaps[0])


def test_g_goes_to_a_rank_and_a_compares_the_jobs_ranks(torchrun_live):
    held, seen, rv = torchrun_live
    rank, message, screen = seen["g"]
    assert rank != 0 and f"showing process {rank} of" in message and "tp_job.py" in message
    assert f"process {rank}/" in screen and "rank " in screen          # the header says which
    text = seen["a"]
    assert "torchrun tp_job.py" in text and "tp_job.py" in text and "2 ranks" in text
    assert "rank 0" in text and "rank 1" in text and "tokens/s" in text


def test_both_ranks_steps_and_their_job_in_the_snapshot(torchrun_live):
    held, seen, rv = torchrun_live
    assert held.info["name"] == "torchrun tp_job.py"
    workers = [v for v in rv.views if v.meta.get("rank") is not None]
    assert sorted(v.meta["rank"] for v in workers) == [0, 1]
    for v in workers:
        m = v.meta
        assert (m["world_size"], m["backend"], m["local_rank"]) == (2, "gloo", m["rank"])
        assert m["job"].startswith("torchrun:") and m["clock_sync"]
        assert process_facts(v)["name"] == "tp_job.py" and is_active(v)
        assert process_facts(v)["ppid"] == process_facts(rv.views[0])["pid"]   # the agent's
        steps = [t for t in v.timeline if t.done]
        prefills = [t for t in steps if t.phase == "prefill"]
        assert len(prefills) >= 2 and len(steps) == len(prefills) * NEW_TOKENS
    [(key, job)] = jobs(rv)
    assert [v.meta["rank"] for v in job.views] == [0, 1]
    s = ranks_summary(job)
    assert s.mode == "eager" and [r.rank for r in s.ranks] == [0, 1]
    assert s.ranks[0].decode_tokens == s.ranks[1].decode_tokens > 0
    assert s.skew is not None and s.skew.steps > 0
    assert s.clock.get("residual_ns") is not None    # one host: one clock


def test_the_agent_is_listed_and_quiet(torchrun_live):
    held, seen, rv = torchrun_live
    agent = rv.views[0]
    assert process_facts(agent)["main"] and agent.meta.get("rank") is None
    assert process_facts(agent)["exit_status"] == 0 and not is_active(agent)
