"""`tuiprof run --headless -- python prog.py` follows the processes a program starts, at any
depth (subprocess running Python, three levels), and the snapshot holds every one; with
--no-follow it holds the main process only."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NESTED = REPO / "tests" / "programs" / "nested.py"


def _run(tmp_path, *options):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TUIPROF_RUNTIME_DIR=str(tmp_path / "rt"))
    out = tmp_path / "snap.json"
    proc = subprocess.run([sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml",
                           "--no-cupti", "--json", str(out), *options, "--", "python",
                           str(NESTED), "2"], capture_output=True, text=True, timeout=240,
                          env=env, cwd=tmp_path)
    return proc, json.loads(out.read_text())


def test_nested_children_are_followed_headless(tmp_path):
    (tmp_path / "rt").mkdir(mode=0o700)
    proc, doc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert doc["format"] == "tuiprof-ranks-snapshot"
    procs = [r["meta"]["process"] for r in doc["ranks"]]
    by_pid = {p["pid"]: p for p in procs}
    leaf = next(r for r in doc["ranks"] if r["meta"]["process"]["name"] == "nested.py"
                and r["meta"].get("step_source") == "api")
    assert [t["phase"] for t in leaf["tokens"]] == ["prefill", "decode", "decode", "decode"]
    chain, p = [], leaf["meta"]["process"]
    while p is not None and len(chain) < 10:   # leaf -> its parent -> ... -> the main one
        chain.append(p["name"])
        p = by_pid.get(p["ppid"])
    assert chain == ["nested.py", "nested.py", "nested.py"] and procs[0]["main"]
    assert "processes of the program:" in proc.stdout and "nested: depth 0" in proc.stdout
    assert not list((tmp_path / "rt").iterdir())          # the session's directory is gone


def test_no_follow_keeps_to_the_main_process(tmp_path):
    (tmp_path / "rt").mkdir(mode=0o700)
    proc, doc = _run(tmp_path, "--no-follow")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert doc.get("format") == "tuiprof-snapshot" and "nested: depth 0" in proc.stdout


ORPHAN = """import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(6)"])
print("main: done", flush=True)
"""


def test_a_process_that_outlives_the_program_is_reported(tmp_path):
    """The session ends when the program's main process ends; a process of it still running
    then is an orphan, named in one line (and in the snapshot)."""
    (tmp_path / "rt").mkdir(mode=0o700)
    (tmp_path / "orphan.py").write_text(ORPHAN)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TUIPROF_RUNTIME_DIR=str(tmp_path / "rt"))
    proc = subprocess.run([sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml",
                           "--no-cupti", "--json", str(tmp_path / "o.json"), "--", "python",
                           str(tmp_path / "orphan.py")], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "o.json").read_text())
    line = next(n for n in doc["world"]["notices"] if "still run" in n)
    assert "1 of its processes still run: pid " in line and "(python -c)" in line
    assert doc["ranks"][1]["meta"]["process"]["state"] == "orphan"
    assert "orphan" in proc.stdout


def test_a_headless_runs_followed_processes_sample_as_its_main_process_does():
    """A followed process collects with the main process's resolved options: "auto" samples
    bursts headless as live (every step traced made an eager program 2.2 times slower on the
    H200), every step with --step-range or --sample-every 1."""
    from tuiprof.cli import parse_args
    from tuiprof.cli.options import child_options
    from tuiprof.sessions.child_session import profiler_options

    def every(*opts):
        args = parse_args(["run", *opts, "--", "python", "x.py"])
        return profiler_options(child_options(args), True).sample_every

    assert every("--headless") == "auto"           # sampled, as the live app
    assert every("--headless", "--sample-every", "1") in (1, "1")
    assert every("--step-range", "step") == 1
    assert every() == "auto"                       # the live app samples
    assert every("--headless", "--sample-every", "8") in (8, "8")
