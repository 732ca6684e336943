"""The session commands against what they read and are given: ``tuiprof ls`` over an info file
that holds anything, ``tuiprof stop ""``, ``run --detach`` with a directory or an interval that
cannot be used, and the program's log: one private mode in every kind of run."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuiprof import cli
from tuiprof.sessions import runtime

from ._helpers import held_program, runtime_dir

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "tests" / "programs"


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _tuiprof(*argv: str, cwd=None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuiprof", *argv], capture_output=True,
                          text=True, timeout=timeout, env=_env(), cwd=cwd)


@pytest.fixture
def rt(monkeypatch):
    runtime_dir(monkeypatch)


def _ended_session(**info) -> Path:
    """A session directory as an ended session leaves it (nothing to connect to)."""
    sid, d = runtime.new_session_dir()
    runtime.write_info(d, {"id": sid, "kind": "program", "name": "prog.py", "state": "ended",
                           "exit_status": 0, "started": "2026-11-29 05:00:00", "steps": 3,
                           **info})
    return d


def test_ls_escapes_every_field_and_shows_an_odd_count_as_it_is(rt, capsys):
    """A session's info with a non-integer ``steps`` raised ValueError (a traceback), and its
    ``started`` reached stdout raw: an ESC[2J cleared the terminal."""
    d = _ended_session(started="\x1b[2J\x1b]0;pwned\x07 05:00", steps="12 steps",
                       requests=[1], pid="\x1b[31m7", name="ok\x1b[2J")
    assert cli.main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    row = next(ln for ln in out.splitlines() if ln.startswith(d.name))
    assert "\\x1b[2J" in row and "12 steps" in row and "\\x1b[31m7" in row, row


def test_ls_groups_whole_counts(rt, capsys):
    _ended_session(steps=12345, requests=6.0)
    assert cli.main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "12,345" in out and " 6 " in out


@pytest.mark.parametrize("command", ["stop", "attach"])
def test_an_empty_session_id_is_an_error(rt, capsys, command):
    """With exactly one session, ``tuiprof stop ""`` stopped it: an empty prefix matched it."""
    d = _ended_session()
    assert cli.main([command, ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "empty session id" in err, err
    assert d.is_dir() and (d / runtime.INFO).is_file()
    assert cli.main(["stop", " "]) == 2 and d.is_dir()


def test_detach_refuses_an_export_dir_that_does_not_exist(rt, tmp_path, capsys):
    missing = tmp_path / "no" / "such"
    code = cli.main(["run", "--detach", "--no-cupti", "--no-nvml", "--export-dir", str(missing),
                     "--", "python", str(PROGRAMS / "exits.py")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no such directory" in err, err
    assert not (tmp_path / "no").exists()
    assert runtime.session_dirs() == []              # nothing started
    afile = tmp_path / "afile"
    afile.write_text("")
    assert cli.main(["run", "--detach", "--export-dir", str(afile), "--", "python",
                     str(PROGRAMS / "exits.py")]) == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("every", ["nan", "inf", "-inf", "-1"])
def test_detach_refuses_a_snapshot_interval_that_is_not_a_number_of_minutes(rt, tmp_path,
                                                                             capsys, every):
    code = cli.main(["run", "--detach", "--no-cupti", "--no-nvml", "--export-dir",
                     str(tmp_path), f"--snapshot-every={every}", "--", "python",
                     str(PROGRAMS / "exits.py")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--snapshot-every" in err, err
    assert runtime.session_dirs() == []


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_programs_log_is_private_in_a_live_run(rt, tmp_path):
    """Live and detached runs left it 0644 (created by touch), headless runs 0600."""
    held, _rv, _snap = held_program(tmp_path, ["python", str(PROGRAMS / "exits.py")],
                                    options=("--no-cupti",))
    log = Path(held.info["log"])
    assert "giving up" in log.read_text()
    assert _mode(log) == 0o600


def test_the_programs_log_is_private_in_a_detached_run(rt, tmp_path):
    out = _tuiprof("run", "--detach", "--no-cupti", "--no-nvml", "--export-dir", str(tmp_path),
                   "--", "python", str(PROGRAMS / "exits.py"))
    assert out.returncode == 0, out.stderr
    sid = out.stdout.strip().splitlines()[-1]
    d = runtime.runtime_root() / sid
    t_end = time.monotonic() + 120
    while (runtime.read_info(d) or {}).get("state") != "ended":
        assert time.monotonic() < t_end, runtime.read_info(d)
        time.sleep(0.2)
    info = runtime.read_info(d)
    assert "giving up" in Path(info["log"]).read_text()
    assert _mode(info["log"]) == 0o600
    assert _mode(d / "keeper.log") == 0o600
    assert _tuiprof("stop", sid).returncode == 0


def test_the_programs_log_is_private_in_a_headless_run_even_over_an_old_file(tmp_path):
    out_json = tmp_path / "run.json"
    old = tmp_path / "run.log"
    old.write_text("an earlier run's output\n")
    os.chmod(old, 0o644)
    out = _tuiprof("run", "--headless", "--no-cupti", "--no-nvml", "--json", str(out_json),
                   "--", "python", str(PROGRAMS / "exits.py"), cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    assert json.loads(out_json.read_text())["meta"]["program"]["exit_status"] == 3
    assert "giving up" in old.read_text() and "earlier" not in old.read_text()
    assert _mode(old) == 0o600
