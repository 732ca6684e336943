"""Quitting the live app leaves nothing behind that Python complains about.

The session process ends with ``os._exit`` (a torch.compile may still run); a named semaphore it
made stayed registered with the resource tracker it shares with the UI process, and the user
saw multiprocessing's "leaked semaphore objects" warning at exit. inductor's compile makes one
through tqdm's lock; the hook here makes the same lock without a compile."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

UI_SIDE = '''
import time
from tuiprof.spec import EngineSpec, ProfilerOptions
from tuiprof.sessions import RemoteControl

def main():
    # a model that cannot load (the session ends in "error" at once): only the exit is tested
    opts = ProfilerOptions(cupti=False, nvml=False, engine=EngineSpec.resolve(
        "qwen3-tiny", device="cpu", dtype="no-such-dtype"))
    ctl = RemoteControl(opts, {}, hook="tqdm_lock_hook:make")
    ctl.start()
    t_end = time.monotonic() + 60
    while ctl.status.state != "error" and time.monotonic() < t_end:
        ctl.view(raw=False, wait=True)
        time.sleep(0.05)
    ctl.stop()
    ctl.close()
    print("state", ctl.status.state)

if __name__ == "__main__":
    main()
'''

HOOK = '''
def make(prof):
    import tqdm
    tqdm.tqdm(disable=True)   # tqdm's multiprocessing lock: a named semaphore
'''


@pytest.mark.slow
def test_no_leaked_semaphore_warning_at_exit(tmp_path):
    (tmp_path / "ui_side.py").write_text(UI_SIDE)
    (tmp_path / "tqdm_lock_hook.py").write_text(HOOK)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)]),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(tmp_path / "ui_side.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "state error" in proc.stdout, proc.stdout
    assert "leaked semaphore" not in proc.stderr, proc.stderr[-2000:]


UNCLOSED = '''
import os, sys, time
from tuiprof.spec import EngineSpec, ProfilerOptions
from tuiprof.sessions import RemoteControl

def main():
    opts = ProfilerOptions(cupti=False, nvml=False, engine=EngineSpec.resolve(
        "qwen3-tiny", device="cpu", max_new_tokens=8, loop=True, prompt_len=8))
    ctl = RemoteControl(opts, {}, orphan_snapshot_dir=sys.argv[1])
    ctl.start()
    t_end = time.monotonic() + 90
    while ctl.view(raw=False, wait=True).counters.get("tokens", 0) < 5:
        assert time.monotonic() < t_end, ctl.status.message
        time.sleep(0.05)
    print("pid", ctl.pid, flush=True)
    # neither stop() nor close(): the program ends with its session process generating

if __name__ == "__main__":
    main()
'''


@pytest.mark.slow
def test_a_session_never_closed_does_not_keep_the_ui_process_from_exiting(tmp_path):
    """multiprocessing joins every child at exit: a session process nobody closed (an app that
    crashed, a failed test holding its control) kept the interpreter waiting forever, and CI
    timed out. It is told the UI is gone, writes what it measured, and ends."""
    (tmp_path / "ui_side.py").write_text(UNCLOSED)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(tmp_path / "ui_side.py"), str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pid = int(proc.stdout.split("pid ")[1].split()[0])
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    snaps = list(tmp_path.glob("tuiprof-*-orphan-*.json"))   # nothing measured is lost
    assert len(snaps) == 1 and '"tokens"' in snaps[0].read_text()
