"""A long-running loop that marks its steps with tuiprof.step (a server's decode loop, without
a model): runs until Ctrl-C (or N steps), then shuts down cleanly.

Usage: python steps_forever.py [STEPS]
"""
import sys
import time

import tuiprof

n = int(sys.argv[1]) if len(sys.argv) > 1 else 0
print("serving", flush=True)
i = 0
try:
    while not n or i < n:
        with tuiprof.step("decode"):
            time.sleep(0.02)
        i += 1
except KeyboardInterrupt:
    print("shutting down", flush=True)
    raise
print("done", flush=True)
