"""Three steps, time for tuiprof to copy them, then the program stops its own process with
SIGSTOP (as a Ctrl-Z of its own would), after writing its pid to ``argv[1]``. With ``again``:
each time it is continued it stops itself again, and it ignores SIGINT and SIGTERM (it never
ends by itself). Ignored rather than caught: two signals pending at once (the forwarded Ctrl-C
and tuiprof's SIGTERM) run their handlers one after the other, and the second can raise inside
the ``except`` block that caught the first, so a program that "catches everything" sometimes
ended after all."""
import os
import signal
import sys
import time

import tuiprof

for _ in range(3):
    with tuiprof.step("decode"):
        time.sleep(0.05)
time.sleep(2.0)
with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("stopping myself", flush=True)
if sys.argv[2:] == ["again"]:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        try:
            os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(0.01)
        except BaseException:  # noqa: BLE001 - a program that will not end
            pass
os.kill(os.getpid(), signal.SIGSTOP)
print("continued", flush=True)
