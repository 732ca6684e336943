"""``tuiprof run --headless --json OUT -- python tests/programs/X.py`` as a user runs it: the
scripts know nothing of tuiprof (or only tuiprof.step); each snapshot is checked for steps,
phases, batch, exit status and the output kept."""
from __future__ import annotations

import pytest

from tuiprof.ui.static import StaticViewControl

from .conftest import PROGRAMS, tuiprof_run


def _steps(doc: dict, phase: str | None = None) -> list:
    return [t for t in doc["tokens"] if t["done"] and (phase is None or t["phase"] == phase)]


def test_hf_generate_batch_1_then_2(tmp_path):
    proc, doc = tuiprof_run(tmp_path, str(PROGRAMS / "hf_generate.py"), "--batch", "1", "2",
                            "--new-tokens", "5")
    assert proc.returncode == 0, proc.stderr[-2000:]
    meta = doc["meta"]
    assert meta["step_source"] == "transformers" and meta["program"]["exit_status"] == 0
    assert meta["model"] == "hf_generate.py: Qwen3ForCausalLM"
    got = [(t["phase"], t["batch"], t["positions"], t["cycle"]) for t in
           _steps(doc) if t["phase"] != "window"]
    assert got == ([("prefill", 1, 8, 0)] + [("decode", 1, 1, 0)] * 4
                   + [("prefill", 2, 16, 1)] + [("decode", 2, 2, 1)] * 4)
    assert "window" not in [t["phase"] for t in _steps(doc)][-10:]   # windows stopped
    # the program's own output: on the terminal, in the snapshot and in the log beside it
    assert "batch 2: generated (2, 13)" in proc.stdout
    assert any(line.startswith("batch 2: generated (2, 13)") for line in doc["output"])
    assert "batch 1: generated (1, 13)" in (tmp_path / "snap.log").read_text()
    # tokens/s counts every sequence of a step
    assert "8 decode steps (batch 1-2, 1.5 on average)" in proc.stdout
    assert "tuiprof: the program exited with status 0" in proc.stderr
    # where the steps came from: the marked ones by phase, the windows before them apart
    windows = sum(t["phase"] == "window" for t in _steps(doc))
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("steps from"))
    assert line.startswith("steps from transformers: 10 (8 decode, 2 prefill)"), line
    assert (f"{windows} windows" in line) if windows else ("window" not in line), line


def test_custom_loop_with_tuiprof_step(tmp_path):
    proc, doc = tuiprof_run(tmp_path, str(PROGRAMS / "custom_loop.py"), "--batch", "3",
                            "--steps", "4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert doc["meta"]["step_source"] == "api"
    got = [(t["phase"], t["batch"], t["step"]) for t in _steps(doc) if t["phase"] != "window"]
    assert got == [("prefill", 3, -1)] + [("decode", 3, i) for i in range(4)]
    assert doc["output"][-1].startswith("tokens of sequence 0: [")


def test_a_program_that_raises_keeps_what_was_measured(tmp_path):
    proc, doc = tuiprof_run(tmp_path, str(PROGRAMS / "raises.py"))
    assert proc.returncode == 1
    prog = doc["meta"]["program"]
    assert prog["ended"] == "raised" and prog["exit_status"] == 1
    assert prog["error"] == "ValueError: bad shape at step 2: expected [2, 64]"
    assert prog["traceback"][-1] == prog["error"]
    assert not any("runpy" in line or "tuiprof" in line for line in prog["traceback"])
    assert len(_steps(doc, "decode")) == 3                      # the failing step included
    assert "Traceback (most recent call last):" in proc.stderr  # as python prints it
    assert doc["output"][-1] == prog["error"]
    assert "the program raised ValueError" in proc.stderr.splitlines()[-1]


def test_sys_exit_status_is_tuiprofs(tmp_path):
    proc, doc = tuiprof_run(tmp_path, str(PROGRAMS / "exits.py"))
    assert proc.returncode == 3
    assert doc["meta"]["program"]["exit_status"] == 3
    assert len(_steps(doc, "decode")) == 2
    assert doc["output"] == ["working 0", "working 1", "giving up"]
    assert proc.stderr.rstrip().endswith("tuiprof: the program exited with status 3")
    # reopened with `tuiprof view`: how it ended is on the status line, its output behind `l`
    ctl = StaticViewControl.from_path(tmp_path / "snap.json")
    assert ctl.status.extra["program"]["exit_status"] == 3 and ctl.has_output()


def test_a_chatty_program_loses_nothing(tmp_path):
    proc, doc = tuiprof_run(tmp_path, str(PROGRAMS / "prints_a_lot.py"), "5000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (tmp_path / "snap.log").read_text()
    assert log.count("\nline ") + log.startswith("line ") == 5000      # every line, in the log
    # stdout and stderr come through two pipes: each stream keeps its order, not their mix
    assert log.count("warning") == 5 and "progress 100%\ndone without a newline" in log
    assert proc.stdout.count("\nline ") + proc.stdout.startswith("line ") == 5000
    assert "progress 100%\ndone without a newline" in proc.stdout
    out = doc["output"]
    assert len(out) == 1000 and doc["counters"]["output_lines"] == 5000 + 5 + 2
    assert "progress 0%" not in out                                   # the bar's last state
    assert out.index("progress 100%") < out.index("done without a newline")
    assert all("\x1b" not in line and "\r" not in line for line in out)
    assert doc["meta"]["step_source"] == "windows"
    assert "no-step-boundaries" in [f["id"] for f in doc["findings"]]


def test_python_dash_m(tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "main.py").write_text(
        "import sys, tuiprof\n"
        "with tuiprof.step('decode', tokens=2):\n"
        "    print('argv', sys.argv[1:], __name__)\n")
    proc, doc = tuiprof_run(tmp_path, "-m", "mypkg.main", "--flag", "x")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert doc["output"] == ["argv ['--flag', 'x'] __main__"]
    assert [t["batch"] for t in _steps(doc, "decode")] == [2]


@pytest.mark.parametrize("cmd,says", [
    (["./x.sh"], "cannot run './x.sh': no such file"),
    (["python", "missing.py"], "no such Python script: missing.py"),
    (["python", "-X", "dev", "x.py"], "python option -X is not supported"),
    (["python", "-c", "print(1)"], "python -c is not supported under tuiprof run"),
])
def test_what_cannot_run_is_one_line(tmp_path, cmd, says):
    proc, doc = tuiprof_run(tmp_path, *cmd[1:]) if cmd[0] == "python" else (None, None)
    if proc is None:  # not a Python interpreter
        import os
        import subprocess
        import sys

        from .conftest import REPO
        proc = subprocess.run([sys.executable, "-m", "tuiprof", "run", "--headless", "--", *cmd],
                              capture_output=True, text=True, cwd=tmp_path,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 2 and doc is None
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr


def test_engine_options_are_refused_with_a_program(tmp_path):
    proc, _ = tuiprof_run(tmp_path, str(PROGRAMS / "exits.py"), options=("--model", "qwen3-tiny"))
    assert proc.returncode == 2
    assert "--model: options of tuiprof's own engine" in proc.stderr
