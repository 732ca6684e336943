"""Resident memory over a long session: replay the compiled H100 recording again and again
(timestamps shifted each pass) into one store until N decode tokens, and report RSS growth
after warm-up (MiB). Target: < 100 MB for 50,000 decode tokens."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench._common import recording, rss_mb  # noqa: E402
from tuiprof.collect.replay import Recording, load_recording, replay_into  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402

def shifted(rec: Recording, dt: int) -> Recording:
    recs = []
    for r in rec.records:
        r = list(r)
        if r[0] == "K" or r[0] == "S":
            r[2] += dt
            r[3] += dt
        elif r[0] == "C":
            r[3] += dt
            r[4] += dt
        elif r[0] == "A":
            r[4] += dt
        recs.append(tuple(r))
    marks = [[e, s, t + dt] for e, s, t in rec.marks]
    nvml = [[row[0] + dt] + row[1:] for row in rec.nvml]
    return Recording(rec.meta, marks, recs, nvml, rec.alloc, rec.path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=50_000)
    ap.add_argument("--recording", default=str(recording("compiled")))
    args = ap.parse_args()
    rec = load_recording(args.recording)
    span = rec.marks[-1][2] - rec.marks[0][2] + 1_000_000
    store = SessionStore()
    t0 = time.time()
    passes = 0
    decode = 0
    base = None
    samples = []
    while decode < args.tokens:
        replay_into(shifted(rec, passes * span), store)
        passes += 1
        decode += rec.meta.get("decode_tokens", 64)
        if passes == 20:  # warm-up: rings full, aggregates created
            base = rss_mb()
        if passes % 100 == 0:
            samples.append((decode, round(rss_mb(), 1)))
    end = rss_mb()
    v = store.view(raw=False)
    print(f"decode tokens {decode} in {passes} passes, {time.time() - t0:.0f} s; "
          f"kernels folded {v.counters['kernels']:,}")
    print(f"RSS after warm-up {base:.1f} MB, at the end {end:.1f} MB: growth {end - base:.1f} MB "
          f"(target < 100 MB); samples {samples}")


if __name__ == "__main__":
    main()
