"""A live native session on the CPU, for a tmux run of the app (screenshots/native-*.txt):
the test driver emits a decode loop's records in chunks, one chunk every ``ms`` milliseconds,
through tuiprof's injection library and the stand-in libcupti.

    python3 -m tests.native.live_demo DIR [CHUNKS] [MS] [graphs]

builds everything in DIR and prints the command to run (with TUIPROF_CUPTI_LIB set).
``graphs``: each decode step is one CUDA-graph launch record (what ``--cuda-graph-trace graph``
gets from CUPTI), on the stand-in's clock (the wall clock), so the sampled default's bursts
fall on some of them."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .helpers import Script, compile_native, decode_like


def main() -> None:
    d = Path(sys.argv[1]).resolve()
    d.mkdir(parents=True, exist_ok=True)
    chunks = int(sys.argv[2]) if len(sys.argv) > 2 else 120
    ms = int(sys.argv[3]) if len(sys.argv) > 3 else 500
    n = compile_native(d)
    t = time.time_ns() + 2_000_000_000
    corr = 1
    if len(sys.argv) > 4 and sys.argv[4] == "graphs":
        from .test_graphs_and_bursts import _graph_decode

        for i in range(chunks):
            s = Script()
            _graph_decode(s, 20, t0=t, corr=corr)
            s.write(d / f"chunk.{i}")
            corr += 200
            t += ms * 1_000_000
        print(f"TUIPROF_CUPTI_LIB={n.fake} python3 -m tuiprof run --cuda-graph-trace graph -- "
              f"{n.driver} drip {d / 'chunk'} {chunks} 100000 {ms}")
        return
    for i in range(chunks):
        s = Script()
        # 20 decode steps a chunk (a prefill every 10 chunks): ~0.33 ms a step on the stand-in
        t_end, _, _ = decode_like(s, 20, t0=t, corr0=corr) if i % 10 == 0 else (None, 0, 0)
        if i % 10:
            t_end, _, _ = _decode_only(s, 20, t, corr)
        s.write(d / f"chunk.{i}")
        corr += 20 * 60
        t = t + ms * 1_000_000
    print(f"TUIPROF_CUPTI_LIB={n.fake} python3 -m tuiprof run -- {n.driver} drip "
          f"{d / 'chunk'} {chunks} 100000 {ms}")


def _decode_only(s: Script, steps: int, t0: int, corr0: int):
    """Decode steps only (the generation goes on from the chunk before)."""
    before = len(s.records)
    t, prefill, step = decode_like(s, steps, t0=t0, corr0=corr0)
    # drop the prefill's records: its kernels and their launches, its copy back
    n_prefill = 2 * len(prefill) + 2
    del s.records[before:before + n_prefill]
    return t, prefill, step


if __name__ == "__main__":
    main()
