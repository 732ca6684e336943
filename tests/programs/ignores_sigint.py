"""Marks steps forever and ignores Ctrl-C (as some servers do)."""
import signal
import time

import tuiprof

signal.signal(signal.SIGINT, signal.SIG_IGN)
i = 0
while True:
    with tuiprof.step("decode"):
        time.sleep(0.02)
    if i % 10 == 0:
        print(f"step {i}", flush=True)
    i += 1
