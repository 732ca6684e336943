"""Three marked steps, a line of output, then the process ends without any cleanup:
``python ends_itself.py os._exit|SIGKILL|segfault``."""
import ctypes
import os
import signal
import sys
import time

import tuiprof

how = sys.argv[1]
for i in range(3):
    with tuiprof.step("decode"):
        print(f"step {i}")
if how != "os._exit":
    time.sleep(3.0)   # a killed or crashing program has no last word: its copy is taken before
print(f"last words before {how}", file=sys.stderr)
if how == "os._exit":
    os._exit(7)
if how == "SIGKILL":
    os.kill(os.getpid(), signal.SIGKILL)
ctypes.string_at(0)   # reads address 0: SIGSEGV
