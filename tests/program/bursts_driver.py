"""Runs a program under a ProgramSession whose CUPTI is the stand-in (CUPTI cannot run on a
CPU), sampling a burst of 4 steps in every 16, and prints what the collector did as JSON on
the last line. Its own process: the program's output capture takes fds 1 and 2.

Usage: python bursts_driver.py LOG [--cupti-attached] [--json-dir DIR] -- python PROGRAM [ARGS...]

``--json-dir``: the JSON goes to DIR/rank<RANK>.json instead (a driver per rank, under torchrun).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cupti_standin

from cupti_standin import attached_collector  # noqa: E402

from tuiprof.program.launch import parse_program  # noqa: E402
from tuiprof.program.program_session import ProgramSession  # noqa: E402
from tuiprof.profiler import Profiler  # noqa: E402
from tuiprof.spec import ProfilerOptions  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402


def main() -> None:
    split = sys.argv.index("--")
    log, flags, program = sys.argv[1], sys.argv[2:split], sys.argv[split + 1:]
    if "RANK" in os.environ:  # one driver per rank of a job: a log each
        log += f".rank{os.environ['RANK']}"
    store = SessionStore(ring_tokens=256)
    prof = Profiler(store, ProfilerOptions(nvml=False, alloc_every=0, sample_every=4,
                                           detach_between_bursts="--cupti-attached" not in flags))
    standins = []

    def start_cupti(device_index=0, nvml_in_background=False, markers=None):
        prof.cupti, cupti = attached_collector(store, prof._sample_every("eager"), markers)
        prof.cupti.bursts_only = False  # as after start(): the profiler engages bursts
        standins.append(cupti)

    prof.start_collectors = start_cupti  # the stand-in instead of every collector
    session = ProgramSession(prof, parse_program(program), log, window_ms=20)
    session.start()
    c = prof.cupti
    result = session.run()
    detaches, switches = c.detaches, list(standins[0].threads)  # before the stop's finalize
    session.finish(result)
    view = store.view()
    doc = json.dumps({
        "status": result.status, "error": result.error, "detaches": detaches,
        "switch_threads": switches, "bursts_only": c.bursts_only,
        "steps": [[t.seq, t.phase, t.mode, t.sampled] for t in view.tokens],
        "source": store.meta.get("step_source"), "events": [e[3] for e in view.events],
        "cupti": view.collectors.get("cupti"), "switch_s": view.overhead.get("switch_s"),
        "rank": store.meta.get("rank"),
    })
    if "--json-dir" in flags:
        out = Path(flags[flags.index("--json-dir") + 1]) / f"rank{os.environ.get('RANK', 0)}.json"
        out.write_text(doc)
    else:
        print(doc)


if __name__ == "__main__":
    main()
