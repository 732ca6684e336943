"""`tuiprof run` follows the processes a program starts (real processes, CPU): an engine
process started with multiprocessing's spawn that runs generate() (its steps are found in it),
the helper that process starts in turn (a grandchild, subprocess running Python), a process
that segfaults and one that ends with os._exit(3): one line names each death, the others go
on, everything measured is kept, the snapshot holds every process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuiprof.export.snapshot import read_any_snapshot
from tuiprof.store.rank_set import is_active, is_process_set, process_facts

from ._helpers import held_program, runtime_dir

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "tests" / "programs"
NEW_TOKENS, REQUESTS = 5, 2


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    runtime_dir(mp)
    tmp = tmp_path_factory.mktemp("family")
    try:
        yield (tmp, *held_program(tmp, ["python", str(PROGRAMS / "family.py"), "--new-tokens",
                                        str(NEW_TOKENS), "--requests", str(REQUESTS)],
                                  options=("--no-cupti",)))
    finally:
        mp.undo()


def _by_name(rv, part):
    hits = [v for v in rv.views if part in (process_facts(v).get("name") or "")]
    assert len(hits) == 1, [process_facts(v).get("name") for v in rv.views]
    return hits[0]


def test_a_spawned_engine_process_has_its_generate_steps(family):
    tmp, held, rv, snap = family
    assert is_process_set(rv) and rv.world_size >= 5
    main = rv.views[0]
    assert process_facts(main)["main"] and process_facts(main)["name"] == "family.py"
    eng = _by_name(rv, "EngineCore")
    p = process_facts(eng)
    assert p["ppid"] == process_facts(main)["pid"] and p["state"] == "ended"
    steps = [t for t in eng.timeline if t.done]
    assert [t.phase for t in steps].count("prefill") == REQUESTS
    assert len(steps) == REQUESTS * NEW_TOKENS
    assert eng.meta["step_source"] == "transformers" and is_active(eng)
    assert not is_active(main)          # the main process only waits: listed, quiet


def test_a_grandchild_is_followed(family):
    tmp, held, rv, snap = family
    eng = _by_name(rv, "EngineCore")
    helper = _by_name(rv, "custom_loop.py")
    assert process_facts(helper)["ppid"] == process_facts(eng)["pid"]
    assert [t.phase for t in helper.timeline if t.done] == ["prefill"] + ["decode"] * 4


def test_a_crash_and_an_os_exit_are_one_line_each_and_their_data_is_kept(family):
    tmp, held, rv, snap = family
    crash = _by_name(rv, "crasher")
    p = process_facts(crash)
    assert p["state"] == "died" and "Segmentation fault" in p["line"] and "\n" not in p["line"]
    assert p["line"].startswith(f"pid {p['pid']} (crasher (spawn worker)) died: ")
    assert len([t for t in crash.timeline if t.done]) == 3     # measured before it died: kept
    quit_ = _by_name(rv, "quitter")
    q = process_facts(quit_)
    assert q["state"] == "ended" and q["exit_status"] == 3 and "os._exit(3)" in q["line"]
    assert len([t for t in quit_.timeline if t.done]) == 2
    assert any("Segmentation fault" in n for n in rv.meta["notices"])
    # the others went on: the engine finished every request, the program ended normally
    assert len([t for t in _by_name(rv, "EngineCore").timeline if t.done]) == REQUESTS * NEW_TOKENS
    assert process_facts(rv.views[0])["exit_status"] in (None, 0)


def test_a_forked_child_is_followed_without_kernels(family):
    """A fork child is a process of its own (registered after the fork, its own store and
    steps); CUPTI is not used there: its parent's ran (docs/multi-gpu.md)."""
    tmp, held, rv, snap = family
    fork = _by_name(rv, "forked (fork of")
    p = process_facts(fork)
    assert p["forked_from"] == process_facts(rv.views[0])["pid"] and p["state"] == "ended"
    assert len([t for t in fork.timeline if t.done]) == 2
    assert "fork child" in fork.collectors["cupti"]["message"]


def test_a_forkserver_child_starts_its_collectors_at_its_first_cuda_call(family):
    """The forkserver (a new interpreter, quiet) forks the child; neither touched CUDA, so the
    child's CUPTI and NVML start at its first CUDA call (here the call fails on a CPU-only
    torch after tuiprof's hook ran): the collectors' lines are theirs, not the fork's."""
    tmp, held, rv, snap = family
    server = _by_name(rv, "forkserver")
    assert not is_active(server) and process_facts(server)["state"] in ("ended", "running")
    child = _by_name(rv, "served")
    p = process_facts(child)
    assert p["forked_from"] == process_facts(server)["pid"]
    assert child.meta["cuda"] is True                       # the hook ran before the call
    assert "fork child" not in child.collectors["cupti"]["message"]
    assert len([t for t in child.timeline if t.done and t.phase == "decode"]) == 2


def test_every_processs_output_is_in_the_log(family):
    tmp, held, rv, snap = family
    log = Path(held.info["log"]).read_text()
    for line in ("engine: request 1 ->", "tokens of sequence 0", "crasher: about to crash",
                 "quitter: leaving with os._exit(3)", "crasher exit code -11", "forked: done",
                 "quitter exit code 3"):
        assert line in log, log[-2000:]


def test_the_snapshot_holds_every_process_and_reopens_with_the_process_selector(family):
    from tuiprof.ui.app import view_control

    tmp, held, rv, snap = family
    doc = json.loads(Path(snap).read_text())
    assert doc["format"] == "tuiprof-ranks-snapshot" and doc["world"]["launcher"] == "processes"
    assert len(doc["ranks"]) == rv.world_size
    names = [r["meta"]["process"]["name"] for r in doc["ranks"]]
    assert "family.py" in names and any("EngineCore" in n for n in names)
    back = read_any_snapshot(snap)
    ctl = view_control(back)
    active = [i for i, v in enumerate(back.views) if is_active(v)]
    assert ctl.cycle(0) == active[0] and ctl.cycle(active[-1]) == active[0]
    # per process, as for ranks: the exports of a reopened snapshot
    out = tmp / "nsys"
    from tuiprof.cli import main
    assert main(["export", str(snap), "--nsys", str(out)]) == 0
    assert (out / "rank1_nvtx_sum.csv").exists() or any(out.iterdir())
    # diff per process: the first one that worked by default, or the one named
    assert main(["diff", str(snap), str(snap)]) == 0
    assert main(["diff", str(snap), str(snap), "--rank", str(active[-1])]) == 0
    assert main(["diff", str(snap), str(snap), "--rank", "99"]) == 2


def test_the_start_up_hook_changes_nothing_the_program_sees(tmp_path, monkeypatch):
    """A child started under tuiprof sees the sys.path, the sitecustomize module and the
    environment (but for tuiprof's variables) it sees without: the program's own
    sitecustomize runs, and is the one it finds."""
    from tuiprof.sessions.follow import follow_env

    theirs = tmp_path / "site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    probe = ("import json, os, sys\n"
             "try:\n    import sitecustomize; site = sitecustomize.__file__\n"
             "except ImportError:\n    site = None\n"
             "print(json.dumps({'path': sys.path, 'site': site, 'ran': os.environ.get("
             "'THEIRS_RAN'), 'mods': sorted(m for m in sys.modules if m.startswith('tuiprof'))}))\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("TUIPROF_")}

    def run(extra_path: str, follow: bool) -> dict:
        env = dict(base, PYTHONPATH=os.pathsep.join(p for p in (extra_path, str(REPO)) if p))
        if follow:
            env.update(follow_env("/nonexistent/s.sock", {}, env))
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 0 and out.stderr == "", out.stderr
        return json.loads(out.stdout)

    for extra in ("", str(theirs)):
        plain, under = run(extra, False), run(extra, True)
        assert under["path"] == plain["path"]
        assert under["site"] == plain["site"] and under["ran"] == plain["ran"]
    assert plain["site"] == str(theirs / "sitecustomize.py") and plain["ran"] == "1"
