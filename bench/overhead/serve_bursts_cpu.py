"""Which steps of a real ``transformers serve --continuous-batching`` run with CUPTI attached at
a session's sampling, on a CPU: the server runs under a ProgramSession whose CUPTI is the
stand-in of the tests (``tests/cupti_standin.py``: the calls a collector makes while attached and
detached, no GPU), a load comes from ``serve_external.py``'s client, and the steps' CUPTI state
(attached, traced) and the overhead report's counts are printed: the time windows of the
program's start run attached (CUPTI switches at the launching thread's steps only), the serving
steps as the sampling says (a burst's window and a due prefill in every period).

    python bench/overhead/serve_bursts_cpu.py --model-dir DIR [--sample-every auto|leave|N]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def serve(out: str, sample_every: str, argv: list) -> None:
    """The session's side, in a process of its own (the program's output capture takes fds 1
    and 2): runs the server until SIGINT, then writes what the steps were to ``out``."""
    from cupti_standin import attached_collector  # noqa: PLC0415

    from tuiprof.program.launch import parse_program  # noqa: PLC0415
    from tuiprof.program.program_session import ProgramSession  # noqa: PLC0415
    from tuiprof.profiler import Profiler  # noqa: PLC0415
    from tuiprof.spec import ProfilerOptions  # noqa: PLC0415
    from tuiprof.store import SessionStore  # noqa: PLC0415

    store = SessionStore()
    prof = Profiler(store, ProfilerOptions(nvml=False, alloc_every=0, sample_every=sample_every,
                                           detach_between_bursts=True))

    def start_cupti(device_index=0, nvml_in_background=False, markers=None):
        prof.cupti, _ = attached_collector(store, prof._sample_every("eager"), markers)
        prof.cupti.bursts_only = False   # as after start(): the profiler engages bursts

    prof.start_collectors = start_cupti
    session = ProgramSession(prof, parse_program(argv), out + ".log")
    session.start()
    result = session.run()
    detaches = prof.cupti.detaches
    session.finish(result)
    view = store.view()
    Path(out).write_text(json.dumps({
        "detaches": detaches, "tracing": store.meta.get("tracing"),
        "steps": [[t.seq, t.phase, bool(t.sampled), bool(t.attached)] for t in view.tokens],
        "overhead": {k: v for k, v in view.overhead.items() if k != "series"}}))


def main() -> int:
    if sys.argv[1:2] == ["serve"]:
        split = sys.argv.index("--")
        serve(sys.argv[2], sys.argv[3], sys.argv[split + 1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--sample-every", default="auto")
    ap.add_argument("--port", type=int, default=23011)
    ap.add_argument("--loads", default="8:3,2.5:16,8:40", help="rate:requests, in turn")
    ap.add_argument("--output-len", type=int, default=32)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="serve-bursts-"))
    (work / "hub").mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(work / "hub"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = str(work / "steps.json")
    proc = subprocess.Popen([sys.executable, __file__, "serve", out, a.sample_every, "--",
                             "python", "-m", "transformers.cli.transformers", "serve",
                             a.model_dir, "--continuous-batching", "--device", "cpu", "--host",
                             "127.0.0.1", "--port", str(a.port), "--cb-num-blocks", "64"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        t_end = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{a.port}/health", timeout=2).read()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > t_end:
                    print("the server did not start", file=sys.stderr)
                    return 1
                time.sleep(0.5)
        client = REPO / "bench" / "overhead" / "serve_external.py"
        cenv = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        for load in a.loads.split(","):
            rate, n = load.split(":")
            subprocess.run([sys.executable, str(client), "client", "--port", str(a.port),
                            "--model", a.model_dir, "--rate", rate, "--requests", n,
                            "--output-len", str(a.output_len), "--prompt-words", "32"],
                           env=cenv, capture_output=True, check=True, timeout=600)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        waiter = threading.Thread(target=proc.wait, daemon=True)
        waiter.start()
        waiter.join(60)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    doc = json.loads(Path(out).read_text())
    shutil.rmtree(work, ignore_errors=True)
    steps = doc["steps"]
    by = collections.Counter(
        (p, "attached" if att else "detached", "traced" if s else "") for _, p, s, att in steps)
    print(f"tracing: {doc['tracing']}; CUPTI finalized {doc['detaches']} times")
    for (phase, att, traced), n in sorted(by.items()):
        print(f"  {phase:8s} {att:9s} {traced:6s} {n:6,d}")
    ov = doc["overhead"]
    print(f"overhead: untraced_reference_missing {ov.get('untraced_reference_missing')}, "
          f"windows_attached {ov.get('windows_attached')}; {ov.get('method')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
