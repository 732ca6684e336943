"""How long a large snapshot takes to load for ``view``, ``export`` and ``diff``, and how much
memory it needs: the answer to "is a 100k-step (or 500k-step) snapshot usable?".

    python bench/verify/snapshot_load.py --tokens 100000 500000 [--dir /tmp/snaps] [--rounds 3]

For each size it writes a snapshot of that many token rows (the eager H100 fixture's decode
steps repeated, renumbered and shifted in time, its raw records cut to 4 steps: what a long
headless run or a long program run writes), then times, in a fresh interpreter each:

* ``load``: :func:`tuiprof.export.snapshot.load_snapshot` (read, validate, rebuild);
* ``view``: the load, then the app's first full frame at 200x50 (Textual's headless driver);
* ``export --nsys`` and ``diff A A`` through the CLI, end to end;

and reports wall and CPU seconds (CPU time is steadier on a shared machine) and the peak
resident memory (``VmHWM``) against the file size. Medians of ``--rounds``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the eager H100 recording the tests replay (TUIPROF_FIXTURES: a folder holding another)
FIXTURE = (Path(os.environ["TUIPROF_FIXTURES"]) / "h100_qwen3-0.6b_eager_decode64.json.gz"
           if os.environ.get("TUIPROF_FIXTURES")
           else REPO / "tests" / "data" / "qwen3-0.6b_eager_decode64.json.gz")

CHILD = r"""
import sys, time
t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
what = sys.argv[1]
if what == "load":
    from tuiprof.export.snapshot import load_snapshot
    load_snapshot(sys.argv[2])
    code = 0
elif what == "view":
    # tuiprof view: the load, then the app's first full frame at 200x50 (Textual's headless
    # driver); the findings run in their worker thread as in the app, and arrive later
    import asyncio, os
    from pathlib import Path
    from tuiprof.export.snapshot import read_any_snapshot
    from tuiprof.ui.app import make_app, view_control

    app = make_app(view_control(read_any_snapshot(sys.argv[2]), "bench"), title="bench",
                   export_dir=Path("."), refresh_hz=0)

    async def first_frame():
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            app.refresh_now()
            await pilot.pause()
            hwm = next(int(line.split()[1]) for line in open("/proc/self/status")
                       if line.startswith("VmHWM:"))
            # CPU of this (the UI's) thread: the findings worker's runs beside it
            print(time.perf_counter() - t0, time.thread_time() - m0, hwm * 1024, 0, flush=True)
            os._exit(0)    # the findings worker is still analysing: not part of the frame
    asyncio.run(first_frame())
else:
    from tuiprof.cli import main
    import contextlib, io
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(sys.argv[2:])
hwm = next(int(line.split()[1]) for line in open("/proc/self/status")
           if line.startswith("VmHWM:"))   # this process's own peak (ru_maxrss inherits)
print(time.perf_counter() - t0, time.process_time() - c0, hwm * 1024, code)
"""


def write_snapshot(n: int, path: Path) -> None:
    sys.path.insert(0, str(REPO))
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.export.snapshot import dumps, snapshot_dict
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=4)
    replay_into(load_recording(FIXTURE), store)
    doc = snapshot_dict(store.view())
    first, decode = doc["tokens"][0], [t for t in doc["tokens"] if t["phase"] == "decode"]
    step = decode[1]["start_ns"] - decode[0]["start_ns"]
    t0 = first["start_ns"]

    def row(i: int) -> dict:
        t = dict(decode[i % len(decode)])
        shift = i * step + t0 - t["start_ns"]
        for k in ("start_ns", "end_ns", "first_kernel_ns", "last_kernel_end_ns"):
            if t.get(k):
                t[k] += shift
        t["seq"], t["step"] = i, i - 1
        return t

    doc["tokens"] = [first] + [row(i) for i in range(1, n)]
    path.write_bytes(dumps(doc))


def run(args: list[str]) -> tuple[float, float, int, int]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True,
                         text=True, check=True)
    wall, cpu, rss, code = out.stdout.split()[-4:]
    return float(wall), float(cpu), int(rss), int(code)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[100_000, 500_000])
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print("| steps | file MB | what | wall s (median) | CPU s | peak RSS MB | RSS / file |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for n in a.tokens:
        path = Path(a.dir) / f"tuiprof-bench-{n}.json"
        if not path.exists():
            write_snapshot(n, path)
        size = path.stat().st_size
        nsys = Path(a.dir) / f"tuiprof-bench-{n}-nsys"
        for what, args in (("load", ["load", str(path)]),
                           ("view (first frame)", ["view", str(path)]),
                           ("export --nsys", ["-", "export", str(path), "--nsys", str(nsys)]),
                           ("diff A A", ["-", "diff", str(path), str(path)])):
            rows = [run(args) for _ in range(a.rounds)]
            assert all(r[3] == 0 for r in rows), rows
            wall = statistics.median(r[0] for r in rows)
            cpu = statistics.median(r[1] for r in rows)
            rss = max(r[2] for r in rows)
            print(f"| {n:,} | {size / 1e6:,.0f} | {what} | {wall:.2f} | {cpu:.2f} | "
                  f"{rss / 1e6:,.0f} | {rss / size:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
