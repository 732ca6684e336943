"""`tuiprof run -- torchrun ...` as it is: the agent runs in the session process, its workers
are followed; a 2-rank gloo job that calls init_process_group itself has both ranks' steps,
each process knows its rank, and the two ranks are one job that the cross-rank analysis of
``--tp`` compares (skew, the slowest rank)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tuiprof.analysis.cross_rank import ranks_summary
from tuiprof.store.rank_set import jobs, process_facts

from ._helpers import held_program, runtime_dir

REPO = Path(__file__).resolve().parents[2]
NEW_TOKENS, REQUESTS = 4, 2


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    runtime_dir(mp)
    tmp = tmp_path_factory.mktemp("torchrun")
    try:
        yield held_program(tmp, ["torchrun", "--standalone", "--nproc-per-node", "2",
                                 str(REPO / "tests" / "programs" / "tp_job.py"),
                                 "--new-tokens", str(NEW_TOKENS), "--requests", str(REQUESTS)],
                           options=("--no-cupti",))
    finally:
        mp.undo()


def test_both_ranks_steps_and_their_job(torchrun_job):
    held, rv, snap = torchrun_job
    assert held.info["name"] == "torchrun tp_job.py"
    workers = [v for v in rv.views if v.meta.get("rank") is not None]
    assert sorted(v.meta["rank"] for v in workers) == [0, 1]
    for v in workers:
        m = v.meta
        assert (m["world_size"], m["backend"], m["local_rank"]) == (2, "gloo", m["rank"])
        assert m["job"].startswith("torchrun:") and m["clock_sync"]
        assert process_facts(v)["name"] == "tp_job.py"
        assert process_facts(v)["ppid"] == process_facts(rv.views[0])["pid"]   # the agent's
        steps = [t for t in v.timeline if t.done]
        assert len(steps) == REQUESTS * NEW_TOKENS
        assert [t.phase for t in steps].count("prefill") == REQUESTS
    [(key, job)] = jobs(rv)
    assert [v.meta["rank"] for v in job.views] == [0, 1]
    s = ranks_summary(job)
    assert s.mode == "eager" and [r.rank for r in s.ranks] == [0, 1]
    assert all(r.decode_tokens == REQUESTS * (NEW_TOKENS - 1) for r in s.ranks)
    assert s.skew is not None and s.skew.steps >= REQUESTS * (NEW_TOKENS - 1)
    assert s.clock.get("residual_ns") is not None    # one host: one clock


def test_the_agent_is_listed_and_quiet(torchrun_job):
    held, rv, snap = torchrun_job
    agent = rv.views[0]
    assert process_facts(agent)["main"] and agent.meta.get("rank") is None
    assert process_facts(agent)["exit_status"] == 0
