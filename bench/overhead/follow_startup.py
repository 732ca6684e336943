"""What being followed costs a process of a program at start (CPU, whole processes,
interleaved): ``python -c CODE`` plain, and with tuiprof's start-up hook registering it with a
live session (``TUIPROF_FOLLOW`` naming a detached session's socket). CODE is ``pass`` (a
helper process that never imports torch: registration only) and ``import torch`` (a process
that gets its own session, store and server when torch is imported; CUPTI only at CUDA init).

    python bench/overhead/follow_startup.py --runs 15
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    a = p.parse_args()
    rt = tempfile.mkdtemp(prefix="tprt-", dir="/tmp")
    os.chmod(rt, 0o700)
    env = dict(os.environ, TUIPROF_RUNTIME_DIR=rt, PYTHONPATH=str(REPO))
    work = tempfile.mkdtemp()
    start = subprocess.run([sys.executable, "-m", "tuiprof", "run", "--detach", "--no-cupti",
                            "--no-nvml", "--export-dir", work, "--", "python",
                            str(REPO / "tests" / "programs" / "steps_forever.py")],
                           capture_output=True, text=True, env=env, timeout=120)
    sid = start.stdout.strip().splitlines()[-1]
    from tuiprof.sessions.follow import follow_env
    from tuiprof.cli.options import child_options
    from tuiprof.cli import parse_args
    followed = dict(env)
    followed.update(follow_env(os.path.join(rt, sid, "s.sock"), child_options(
        parse_args(["run", "--no-cupti", "--no-nvml", "--", "python", "x.py"])), env))
    try:
        for code in ("pass", "import torch"):
            times: dict = {"plain": [], "followed": []}
            for i in range(a.runs):
                for name in (("plain", "followed") if i % 2 == 0 else ("followed", "plain")):
                    t0 = time.perf_counter()
                    subprocess.run([sys.executable, "-c", code], env=followed if name ==
                                   "followed" else env, check=True)
                    times[name].append(time.perf_counter() - t0)
            pl, fo = statistics.median(times["plain"]), statistics.median(times["followed"])
            print(f"python -c {code!r}: plain {pl * 1000:.0f} ms, followed {fo * 1000:.0f} ms "
                  f"(+{(fo - pl) * 1000:.0f} ms; medians of {a.runs})")
    finally:
        subprocess.run([sys.executable, "-m", "tuiprof", "stop", sid], capture_output=True,
                       env=env, timeout=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
