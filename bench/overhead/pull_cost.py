"""What one UI pull costs the session process: ``SessionStore.changes`` plus pickling, the work
done on the session's GIL for every refresh (4 Hz) and every findings pass (2 s).

The store holds the real H100 eager recording (``tests/data``: 65 traced tokens of
Qwen3-0.6B, ~1,850 kernels a token); then one more traced token arrives between pulls, as in a
burst. ``findings, whole`` resends the raw records of the last 16 traced tokens every time (what
the session did before raw records crossed once, ``_raw_changes``); ``findings`` is what it does
now. Medians over ``--repeat`` pulls, interleaved::

    python bench/overhead/pull_cost.py --repeat 30
"""
from __future__ import annotations

import argparse
import dataclasses
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench._common import recording  # noqa: E402


def main() -> None:
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.store import SessionStore

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--fixture", type=Path, default=recording("eager"))
    a = p.parse_args()
    rec = load_recording(a.fixture)
    store = SessionStore()
    replay_into(rec, store)
    marks = sorted(m[2] for m in rec.marks)
    lo, last = marks[-2], marks[-1]  # the last decode token's window
    one_token = [r for r in rec.records if r[0] == "K" and lo <= r[2] <= last]
    _, cursor = store.changes(None, 16)
    times: dict[str, list] = {"timer (no raw)": [], "findings, whole": [], "findings": []}
    size: dict[str, int] = {}
    for i in range(a.repeat):
        shift = (i + 1) * 10**8  # one more traced token: the last one's kernels, later
        seq = store.begin_token("decode", "eager", lo + shift, 1000 + i)
        store.end_token(seq, last + shift, (last - lo) / 1e6)
        store.add_records([(r[0], r[1], r[2] + shift, r[3] + shift) + tuple(r[4:])
                           for r in one_token])
        for name, since, n in (("findings, whole", dataclasses.replace(cursor, raw=()), 16),
                               ("findings", cursor, 16), ("timer (no raw)", cursor, 0)):
            t = time.perf_counter()
            delta, new = store.changes(since, n)
            blob = pickle.dumps(delta)
            times[name].append(time.perf_counter() - t)
            size[name] = len(blob)
            if name == "findings":
                cursor = new
    print("| pull | median ms | bytes |\n|---|---|---|")
    for name, xs in times.items():
        print(f"| {name} | {statistics.median(xs) * 1e3:.2f} | {size[name]:,} |")


if __name__ == "__main__":
    main()
