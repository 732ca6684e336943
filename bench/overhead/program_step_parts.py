"""Probe: where a `tuiprof run` session's time goes in a ``generate()`` program's step.

One process, the session as ``bench/overhead/overhead_program_windows.py`` holds it, qwen3-0.6b
(static cache; compiled: transformers' own compiled decode). Windows of one ``generate()``
call, configurations rotated round by round:

* ``none``: no tuiprof in the window (patches removed, NVML paused, CUPTI finalized);
* ``full``: the session with no CUPTI burst in the window;
* ``nonvml``: ``full`` with NVML paused;
* ``noevents``: ``full`` without the steps' CUDA events;
* ``norows``: ``full`` without ``generate()``'s request rows.

Then per-call timers around the recorder's and the step timer's calls (``full`` windows), and
windows holding a burst or a due prefill's attach against ``full``::

    python bench/overhead/program_step_parts.py --mode compiled --rounds 30
    python bench/overhead/program_step_parts.py --device cpu --tiny --rounds 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench" / "overhead"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--mode", choices=("eager", "compiled"), default="compiled")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--bursts", type=int, default=6)
    p.add_argument("--new-tokens", type=int, default=0)
    p.add_argument("--deadline", type=float, default=0)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    a.new_tokens = a.new_tokens or (32 if a.mode == "eager" else 64)
    t_start = time.perf_counter()

    import torch

    from overhead_program_windows import build
    from tuiprof.cli.program import program_options
    from tuiprof.cli.run import run_defaults
    from tuiprof.engine.graphs import drop_cuda_graphs
    from tuiprof.program.launch import ProgramResult, parse_program
    from tuiprof.program.program_session import ProgramSession
    from tuiprof.profiler import Profiler
    from tuiprof.store import SessionStore

    args = argparse.Namespace(**run_defaults())
    args.sample_every = "live"
    prof = Profiler(SessionStore(ring_tokens=256), program_options(args, headless=False))
    log = Path(tempfile.mkdtemp(prefix="step-parts-")) / "program.log"
    session = ProgramSession(prof, parse_program(["python", __file__]), log, tee=True)
    session.start()
    model, ids = build(a.tiny, a.device, 16)
    cuda = a.device.startswith("cuda")
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0,
              cache_implementation="static", max_new_tokens=a.new_tokens,
              min_new_tokens=a.new_tokens)
    if a.mode == "eager":
        kw["disable_compile"] = True
    elif not cuda:
        from transformers import CompileConfig

        cc = CompileConfig(backend="eager")
        cc._compile_all_devices = True
        kw["compile_config"] = cc
    src = session.sources["transformers"]
    rec = session.recorder
    c = prof.cupti
    requests = src.requests

    def window() -> float:
        t0 = time.perf_counter()
        model.generate(ids, **kw)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def detach_now() -> None:
        if c is not None and c.attached:
            drop_cuda_graphs()
            if cuda:
                torch.cuda.synchronize()
            c.detach()

    def no_bursts() -> None:
        if c is not None:
            seq = prof.store.next_seq()
            c._origin = seq - 10
            c._prefill_seq = seq
    sample_every = c.sample_every if c is not None else 0

    def configure(cfg: str) -> None:
        if cfg == "none":
            src.uninstall()
            detach_now()
        else:
            src.install()
        if prof.nvml is not None:
            prof.nvml.paused = cfg in ("none", "nonvml")
        rec.timer.failed = cfg == "noevents"
        src.requests = None if cfg == "norows" else requests

    for _ in range(3):
        window()
    if c is not None:
        c.sample_every = 10 ** 9
    no_bursts()
    detach_now()
    print(f"# {a.device}, {a.mode}, {a.new_tokens} steps a window; CUPTI: "
          f"{prof.store.view().collectors.get('cupti', {}).get('message')}", flush=True)
    configs = ["none", "full", "nonvml", "noevents", "norows"]
    times: dict[str, list[float]] = defaultdict(list)
    for r in range(a.rounds):
        if a.deadline and time.perf_counter() - t_start > a.deadline * 0.6:
            break
        k = r % len(configs)
        order = configs[k:] + configs[:k]
        if r % 2:
            order = order[::-1]
        for cfg in order:
            configure(cfg)
            no_bursts()
            times[cfg].append(window())
    configure("full")
    n = a.new_tokens
    base = statistics.median(times["none"])
    out: dict = {"args": vars(a), "windows": times}
    print(f"\nconfiguration: median window (ms), us a step against none, ratio "
          f"({len(times['none'])} windows each)")
    for cfg in configs:
        m = statistics.median(times[cfg])
        print(f"  {cfg:9s} {1e3 * m:9.2f} ms  {1e6 * (m - base) / n:+8.1f} us/step  "
              f"{m / base:.3f}")

    # per-call timers around the recorder's and the timer's calls (full windows, no burst)
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    saved = []

    def timed(obj, name: str, label: str) -> None:
        fn = getattr(obj, name)
        pc = time.perf_counter

        def wrapper(*args, **kwargs):
            t0 = pc()
            try:
                return fn(*args, **kwargs)
            finally:
                e = acc[label]
                e[0] += 1
                e[1] += pc() - t0
        saved.append((obj, name))
        setattr(obj, name, wrapper)

    for name in ("begin", "launched", "device_done", "end", "model_begins", "model_ends",
                 "step_requests"):
        timed(rec, name, f"recorder.{name}")
    for name in ("start", "stop", "finished", "poll"):
        timed(rec.timer, name, f"timer.{name}")
    for name in ("token_started", "token_launched", "token_finished", "token_gpu_time"):
        timed(prof, name, f"profiler.{name}")
    src.uninstall()  # the patches take the recorder's bound methods when installed
    src.install()
    for _ in range(8):
        no_bursts()
        window()
    for obj, name in saved:
        obj.__dict__.pop(name, None)
    src.uninstall()
    src.install()
    print("\nper call (full windows, 8 windows; nested calls are inside their callers):")
    calls = {}
    for label, (k, s) in sorted(acc.items()):
        calls[label] = {"calls": k, "us": 1e6 * s / max(1, k)}
        print(f"  {label:26s} {k:6d} calls  {1e6 * s / max(1, k):8.2f} us a call")
    out["calls"] = calls

    # windows holding a burst (CUPTI attach, 4 traced steps, detach) and a due prefill's attach
    if c is not None and cuda:
        c.sample_every = sample_every
        burst, prefill, after = [], [], []
        full = []
        for i in range(a.bursts):
            if a.deadline and time.perf_counter() - t_start > a.deadline:
                break
            no_bursts()
            full.append(window())
            seq = prof.store.next_seq()
            c._origin = seq + n // 2   # a burst in the middle of the next window
            c._prefill_seq = seq      # no prefill due
            d0 = c.detaches
            burst.append(window())
            after.append(window())
            no_bursts()
            c._prefill_seq = None     # a prefill due: its attach alone
            prefill.append(window())
            no_bursts()
            print(f"  round {i}: full {1e3 * full[-1]:.1f} ms, burst {1e3 * burst[-1]:.1f}, "
                  f"the window after {1e3 * after[-1]:.1f}, due prefill {1e3 * prefill[-1]:.1f}; "
                  f"detaches {c.detaches - d0}", flush=True)
        if full:
            mf = statistics.median(full)
            print(f"\nextra a window against full (median of {len(full)}): burst "
                  f"{1e3 * (statistics.median(burst) - mf):+.1f} ms, the window after "
                  f"{1e3 * (statistics.median(after) - mf):+.1f} ms, due prefill "
                  f"{1e3 * (statistics.median(prefill) - mf):+.1f} ms")
            out["bursts"] = {"full": full, "burst": burst, "after": after, "prefill": prefill}
    view = prof.store.view()
    print(f"overhead {json.dumps(view.overhead)}")
    session.finish(ProgramResult(0, "exited"))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
