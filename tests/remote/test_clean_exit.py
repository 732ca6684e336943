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
from tuiprof.profiler import ProfilerOptions
from tuiprof.remote import RemoteControl

def main():
    # no model to load (the session ends in "error" at once): only the exit is tested
    opts = ProfilerOptions(cupti=False, nvml=False, engine_kwargs=dict(model_spec="no-such-model"))
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
