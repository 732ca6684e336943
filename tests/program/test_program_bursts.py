"""A program's CUPTI attached for its bursts only, as the built-in engine's: switched at step
boundaries on the thread that launches the steps (never from the windows' timer thread), and
kept attached for good once the program records a CUDA graph that tuiprof cannot drop. CUPTI
is the stand-in of ``tests/cupti_standin.py`` (it refuses any call while finalized); the real
one runs in tests/gpu/test_program_gpu.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from tuiprof.engine.graphs import INDUCTOR_TREES, RANK_GRAPHS_ENV, GraphCaptures

from .conftest import PROGRAMS, REPO

DRIVER = REPO / "tests" / "program" / "bursts_driver.py"
PERIOD = 16  # the driver samples a burst of 4 steps in every 16


def _drive(tmp_path, *program, flags=()) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(DRIVER), str(tmp_path / "log"), *flags, "--",
                           "python", *map(str, program)], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_generate_detaches_between_bursts_on_the_programs_thread(tmp_path):
    out = _drive(tmp_path, PROGRAMS / "hf_generate.py", "--new-tokens", "24", "--batch", "1", "1")
    assert out["status"] == 0 and out["source"] == "transformers"
    assert out["bursts_only"] and out["detaches"] >= 2
    assert "attached for bursts only" in out["cupti"]["message"]
    # every finalize and re-registration came from the program's thread (generate()'s steps),
    # none from the windows' timer thread that marked the steps while the model loaded
    assert {t for _, t in out["switch_threads"]} == {"MainThread"}
    steps = [s for s in out["steps"] if s[1] != "window"]
    decode = [s for s in steps if s[1] == "decode"]
    traced = [s for s in decode if s[3]]
    assert traced and len(traced) < len(decode) / 2     # bursts, not every step
    assert len(decode) == 2 * 23


def test_windows_alone_never_switch_cupti(tmp_path):
    script = tmp_path / "spin.py"
    script.write_text("import time\nt = time.time()\nwhile time.time() - t < 1.0:\n    pass\n")
    out = _drive(tmp_path, script)
    assert out["status"] == 0 and out["source"] == "windows"
    assert out["detaches"] == 0 and out["switch_threads"] == [["register", "MainThread"]]
    assert len(out["steps"]) >= PERIOD                   # windows enough for several bursts


def test_a_graph_of_the_programs_own_keeps_cupti_attached(tmp_path):
    """After the program records a CUDA graph outside torch.compile's cudagraph trees, CUPTI is
    never finalized again: that graph's next replay would die (docs/performance.md#cupti-and-cuda-graphs)."""
    script = tmp_path / "own_graph.py"
    script.write_text(
        "import torch, tuiprof\n"
        "x = torch.ones(4)\n"
        "for i in range(3 * 16):\n"
        "    with tuiprof.step('decode'):\n"
        "        x = x * 1.0001\n"
        "        if i == 24:  # what torch.cuda.graph(g) calls first; no CUDA graph on a CPU\n"
        "            try:\n"
        "                torch.cuda.CUDAGraph.capture_begin(object.__new__(torch.cuda.CUDAGraph))\n"
        "            except Exception:\n"
        "                pass\n"
        "print('done')\n")
    out = _drive(tmp_path, script)
    assert out["status"] == 0 and out["source"] == "api"
    assert "CUPTI stays attached: the program records CUDA graphs of its own" in out["events"]
    assert not out["bursts_only"] and "bursts only" not in out["cupti"]["message"]
    calls = [c for c, _ in out["switch_threads"]]
    assert calls.count("finalize") >= 1 and calls[-1] == "register"  # attached from then on
    steps = [s for s in out["steps"] if s[1] == "decode"]
    assert any(s[3] for s in steps[30:])                 # bursts are still traced after it


@pytest.mark.slow
def test_the_ranks_of_a_job_detach_between_bursts_and_trace_the_same_steps(tmp_path):
    """Each rank of a 2-rank gloo job launched by torchrun (its own process group, an
    all-reduce in every step) has CUPTI attached for its bursts only, as one process has, and
    the two ranks trace the same steps (the TP analysis compares ranks over those)."""
    script = tmp_path / "ranks.py"
    script.write_text(
        "import torch, torch.distributed as dist, tuiprof\n"
        "dist.init_process_group('gloo')\n"
        "x = torch.ones(4)\n"
        "for i in range(3 * 16):\n"
        "    with tuiprof.step('decode'):\n"
        "        dist.all_reduce(x)\n"
        "        x = x / dist.get_world_size()\n"
        "dist.destroy_process_group()\n")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(DRIVER), str(tmp_path / "log"),
                           "--json-dir", str(tmp_path), "--", "python", str(script)],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    traced = []
    for out in ranks:
        assert out["status"] == 0 and out["source"] == "api"
        assert out["bursts_only"] and out["detaches"] >= 2, out["events"]
        assert "attached for bursts only" in out["cupti"]["message"]
        decode = [s for s in out["steps"] if s[1] == "decode"]
        assert len(decode) == 3 * 16
        traced.append([i for i, s in enumerate(decode) if s[3]])
    assert traced[0] and len(traced[0]) < 3 * 16 / 2      # bursts, not every step
    assert traced[0] == traced[1]


def test_a_rank_drops_its_trees_as_one_process_does(monkeypatch):
    """A rank drops the graphs that inductor's trees recorded on this thread, as one process
    does (every rank at the same step); TUIPROF_RANK_GRAPHS=keep keeps it attached; a graph of
    the program's own keeps anyone attached."""
    captures = GraphCaptures()
    code = compile("captures.seen(sys._getframe())",
                   f"/site-packages/torch/_inductor/{INDUCTOR_TREES}", "exec")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv(RANK_GRAPHS_ENV, raising=False)
    assert captures.undroppable() == ""                 # no graph yet
    exec(code, {"captures": captures, "sys": sys})
    assert captures.undroppable() == ""                 # one process: dropped at a detach
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    exec(code, {"captures": captures, "sys": sys})
    assert captures.undroppable() == ""                 # a rank: dropped at the same step
    monkeypatch.setenv(RANK_GRAPHS_ENV, "keep")         # as before: a rank stays attached
    exec(code, {"captures": captures, "sys": sys})
    assert captures.undroppable() == "a rank of a distributed job records CUDA graphs"
    monkeypatch.setenv("WORLD_SIZE", "1")               # a job of one is one process
    exec(code, {"captures": captures, "sys": sys})
    assert captures.undroppable() == ""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv(RANK_GRAPHS_ENV)
    captures.foreign += 1                               # a graph of the program's own: never
    exec(code, {"captures": captures, "sys": sys})
    assert "of its own" in captures.undroppable()


def test_cupti_attached_keeps_a_program_attached(tmp_path):
    out = _drive(tmp_path, PROGRAMS / "custom_loop.py", "--steps", "40",
                 flags=("--cupti-attached",))
    assert out["status"] == 0 and out["detaches"] == 0 and not out["bursts_only"]


def _capture_from(filename: str) -> None:
    """A capture begun by code in ``filename`` (inductor's trees or anything else)."""
    code = compile("captures.seen(sys._getframe())", filename, "exec")
    exec(code, {"captures": CAPTURES, "sys": sys})


CAPTURES = GraphCaptures()


def test_graph_captures_tell_the_trees_graphs_from_the_programs_own():
    CAPTURES.tree_threads.clear()
    CAPTURES.foreign = 0
    _capture_from(f"/site-packages/torch/_inductor/{INDUCTOR_TREES}")
    assert CAPTURES.undroppable() == ""                  # dropped on this thread, if need be
    t = threading.Thread(target=_capture_from, args=(f"/x/torch/_inductor/{INDUCTOR_TREES}",))
    t.start()
    t.join()
    assert "another thread" in CAPTURES.undroppable()     # drop_cuda_graphs here misses them
    CAPTURES.tree_threads.clear()
    _capture_from("/home/me/my_infer.py")
    assert "of its own" in CAPTURES.undroppable()


def test_graph_captures_install_and_uninstall():
    import torch

    orig = torch.cuda.graphs.CUDAGraph.__dict__["capture_begin"]
    g = GraphCaptures()
    g.install()
    assert torch.cuda.CUDAGraph.capture_begin is not orig
    with pytest.raises(Exception):
        torch.cuda.CUDAGraph.capture_begin(object.__new__(torch.cuda.CUDAGraph))
    assert g.foreign == 1                                # seen before torch's own code ran
    assert g.captures == 1                               # counted, whoever captured
    g.uninstall()
    assert torch.cuda.graphs.CUDAGraph.__dict__["capture_begin"] is orig
