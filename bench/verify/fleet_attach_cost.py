"""What one UI over several hosts costs: ``tuiprof attach`` (the real app, on a pseudo-terminal
of its own) over K detached sessions, each a program marking 50 steps a second (a decode loop
at 20 ms a step, ``tests/programs/steps_forever.py``), each reached over TCP with its token
through a relay that counts the bytes crossing it (the protocol's traffic per host, both
ways). For K hosts: the attach process's CPU (user + system, from /proc) over a window with the
main screen shown, then with the all-processes screen (``a``: every process pulled at the
refresh rate); bytes per second per host over the same windows.

Usage: python bench/verify/fleet_attach_cost.py [--hosts 1,2,4] [--window 30] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.sessions._helpers import PtyProcess  # noqa: E402
from tests.sessions.fleet_nodes import (env, free_port, new_token, ours,  # noqa: E402
                                        private_runtime, steps_forever)
from tests.sessions.relay import Relay  # noqa: E402
from tuiprof.sessions import runtime  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK     # utime + stime


def measure(app: PtyProcess, relays: list, window: float) -> dict:
    c0, b0, t0 = cpu_s(app.proc.pid), [r.counts() for r in relays], time.monotonic()
    time.sleep(window)
    c1, b1, t1 = cpu_s(app.proc.pid), [r.counts() for r in relays], time.monotonic()
    dt = t1 - t0
    per = [((u1 - u0) / dt, (d1 - d0) / dt) for (u0, d0), (u1, d1) in zip(b0, b1)]
    return {"seconds": round(dt, 1), "cpu_pct": round(100 * (c1 - c0) / dt, 1),
            "cpu_pct_per_host": round(100 * (c1 - c0) / dt / len(relays), 1),
            "bytes_per_s_to_ui_per_host": [round(d) for _, d in per],
            "bytes_per_s_to_host_per_host": [round(u) for u, _ in per]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="1,2,4")
    p.add_argument("--window", type=float, default=30.0)
    p.add_argument("--json")
    args = p.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="fleetcost-"))
    rt = private_runtime()
    token = new_token(tmp)
    sids, relays = [], []
    results = []
    try:
        for _ in range(max(counts)):
            port = free_port()
            sids.append(steps_forever(tmp, port, token))
            relays.append(Relay(port).up())
        time.sleep(3)
        for k in counts:
            addrs = [f"h{i}=127.0.0.1:{relays[i].port}" for i in range(k)]
            app = PtyProcess([sys.executable, "-m", "tuiprof", "attach", *addrs, "--token-file",
                              str(token)], env(), cwd=tmp, cols=200, rows=50)
            try:
                app.wait_for("steps_forever.py", 60)
                time.sleep(5)
                main_screen = measure(app, relays[:k], args.window)
                all_screen = None
                if k > 1:   # one process alone has no all-processes screen
                    app.type(b"a")
                    app.wait_for("processes on", 30)
                    time.sleep(3)
                    all_screen = measure(app, relays[:k], args.window)
                app.type(b"q")
                app.proc.wait(30)
            finally:
                app.close()
            row = {"hosts": k, "main_screen": main_screen, "all_processes_screen": all_screen}
            print(json.dumps(row), flush=True)
            results.append(row)
    finally:
        for sid in sids:
            info = runtime.read_info(Path(rt) / sid) or {}
            holder = info.get("holder_pid")
            if holder and runtime.pid_alive(holder):
                subprocess.run([sys.executable, "-m", "tuiprof", "stop", sid], env=env(),
                               capture_output=True, timeout=120)
            for key in ("holder_pid", "pid"):
                pid = info.get(key)
                if pid and runtime.pid_alive(pid) and ours(pid):
                    os.kill(pid, signal.SIGKILL)
    out = {"date": time.strftime("%Y-%m-%d"), "program": "steps_forever.py (50 steps/s)",
           "window_s": args.window, "cpus": os.cpu_count(), "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
