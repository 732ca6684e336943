"""A headless run on a loaded machine: the session process serves before it has started the
program, so the run's first copy can say the program is not running yet. Taken for "ended",
the run wrote the empty session (no steps, no requests, "the program ended its process
itself") while the program ran on: seen as a rare failure of test_requests_api under a loaded
suite. The run must wait for the program."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "tests" / "programs"

# Only the timing of a loaded machine is imitated: the session process, serving already, takes
# 1.5 s to start the program (the interval a busy machine stretches).
SLOW_START = '''
import time
from tuiprof.program.program_session import ProgramSession

_start = ProgramSession.start

def start(self, *args, **kwargs):
    time.sleep(1.5)
    return _start(self, *args, **kwargs)

ProgramSession.start = start
'''


def test_a_run_waits_for_a_program_its_session_starts_late(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_START)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO),
                                                       os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "snap.json"
    proc = subprocess.run([sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml",
                           "--json", str(out), "--", "python", str(PROGRAMS / "api_server.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ended its process itself" not in proc.stderr + proc.stdout
    doc = json.loads(out.read_text())
    assert doc["meta"]["program"]["exit_status"] == 0
    assert len(doc.get("requests", ())) == 6, proc.stderr[-2000:]
    assert doc["meta"]["step_source"] == "api"
