"""A session's compile with its helper process, driven as the app drives it, in a process of its
own (a clean dynamo state, real helper processes). Prints one JSON line of what happened.

    python tests/engine/compile_scenario.py dies     # `c`; the helper is killed mid-compile
    python tests/engine/compile_scenario.py quit     # `c` (cached), then `b`, then `q` mid-compile
    python tests/engine/compile_scenario.py warm     # `c` with the compile marked in the cache
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

from tuiprof.engine.load import load_engine


def wait(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie that its parent has not reaped yet counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def helper_pid(engine) -> int | None:
    job = engine._job
    h = job.helper if job is not None else None
    return h.pid if h is not None else None


def compiled(engine) -> bool:
    """Compiled mode and its line: the engine switches the mode, then says so ("compiled in …"),
    and a reader between the two would see the mode with the message of the state before."""
    return bool(engine.error) or (engine.mode == "compiled" and engine.message.startswith("compiled"))


def main(scenario: str) -> dict:
    engine = load_engine("qwen3-tiny", device="cpu", prompt=None, max_new_tokens=None,
                         loop=True, max_batch=4)
    engine.start()
    wait(lambda: engine.tokens >= 3, 60, "eager tokens")
    out: dict = {"scenario": scenario}
    engine.request_mode("compiled")
    if scenario == "warm":
        t0 = time.monotonic()
        wait(lambda: compiled(engine), 600, "compiled mode")
        out.update(mode=engine.mode, notes=list(engine.notes), message=engine.message,
                   error=engine.error, helper_s=engine.compile_helper_s,
                   cache_hits=engine.compile_cache_hits, seconds=time.monotonic() - t0,
                   helper_started=engine.compile_helper._idle is not None,
                   cache=engine.info.get("inductor_cache"))
        engine.stop()
        engine.join(30)
        return out
    wait(lambda: helper_pid(engine) is not None, 30, "the helper")
    pid = helper_pid(engine)
    out["helper_pid"] = pid
    if scenario == "dies":
        time.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        wait(lambda: compiled(engine), 600, "compiled mode")
        out.update(mode=engine.mode, notes=list(engine.notes), message=engine.message,
                   error=engine.error, helper_s=engine.compile_helper_s)
    elif scenario == "quit":
        t0 = engine.tokens
        wait(lambda: compiled(engine), 600, "compiled mode")
        out.update(mode=engine.mode, notes=list(engine.notes), message=engine.message,
                   error=engine.error, helper_s=engine.compile_helper_s,
                   eager_beside=engine.tokens - t0, first_helper_alive=alive(pid),
                   cache_hits=engine.compile_cache_hits)
        engine.request_batch(2)   # `b` in compiled mode: a helper again
        wait(lambda: helper_pid(engine) is not None and helper_pid(engine) != pid, 30,
             "the batch's helper")
        pid2 = helper_pid(engine)
        out["batch_helper_request"] = engine._job.helper.request.get("batches")
        time.sleep(1.0)
        t_stop = time.monotonic()
        engine.stop()                      # `q`
        joined = engine.join(30)
        out.update(stopped_s=round(time.monotonic() - t_stop, 2), joined=joined,
                   state=engine.state, stop_error=engine.error,
                   batch_helper_alive=alive(pid2))
        # this process's own trace may still run (dynamo cannot be interrupted); it ends at
        # inductor's gate, which the stopped helper opens with an error
        end = time.monotonic() + 120
        while engine.busy and time.monotonic() < end:
            time.sleep(0.05)
        out["compile_thread_ended"] = not engine.busy
    out["cache"] = engine.info.get("inductor_cache")
    engine.stop()
    engine.join(30)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
    sys.stderr.flush()
    os._exit(0)  # as the session process leaves: a compile thread still in C++ must not abort it
