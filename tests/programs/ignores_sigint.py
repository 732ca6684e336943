"""Marks steps forever and ignores Ctrl-C (as some servers do).

``ignores_sigint.py SNAPSHOT``: also slow to stop. When asked to end (tuiprof's stop reaches
its main thread as an exception) it says whether SNAPSHOT is on disk yet, then takes 2 s to end."""
import os
import signal
import sys
import time

import tuiprof

snapshot = sys.argv[1] if len(sys.argv) > 1 else None
signal.signal(signal.SIGINT, signal.SIG_IGN)
i = 0
try:
    while True:
        with tuiprof.step("decode"):
            time.sleep(0.02)
        if i % 10 == 0:
            print(f"step {i}", flush=True)
        i += 1
except BaseException as exc:   # noqa: BLE001 - the stop, whatever its type
    if snapshot is None:
        raise
    print(f"asked to end ({type(exc).__name__}); snapshot on disk: "
          f"{os.path.exists(snapshot)}", flush=True)
    time.sleep(2)
