"""Kernel parity of a saved compiled step (tuiprof/engine/precompiled.py) with a fresh compile:
the kernels one decode step launches, counted by ``torch.profiler``, for the engine's step
compiled by dynamo as the engine compiles it (``fresh``) and for the step a second process
loaded from the file the first one saved (``loaded``). Each phase runs in a process of its own
(the second one never traces, as a later session does not).

On CUDA the kernels are the GPU's (inside CUDA graphs too, with ``reduce-overhead``); on the
CPU they are inductor's C++ kernels (compiled with ``cpp.enable_kernel_profile`` for both, so
that each has a profiler event) and the ATen calls the graph makes::

    python bench/verify/precompile_parity.py --model qwen3-0.6b            # both phases, table
    python bench/verify/precompile_parity.py --model qwen3-tiny --device cpu --json OUT.json

Prints one line per kernel name that differs and ``parity: same N kernels a step (K names)``
or ``parity: DIFFERENT``; exit status 0 only with parity.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a profiler event that is not a kernel: dynamo's and AOTAutograd's wrappers (only a function
# dynamo evaluates has them), record_function ranges, the graph's call (named by its hash)
WRAPPERS = re.compile(r"^(## |Torch-Compiled Region|TorchDynamo|AOTDispatcher|Pregraph "
                      r"bytecode|CompiledFunction|cudagraph|CUDAGraph)", re.I)
GRAPH_PREFIX = re.compile(r"^graph_\d+_")   # inductor's per-graph prefix of a C++ kernel's event


def kernels_of(prof, cuda: bool) -> collections.Counter:
    """The kernels one profiled step launched: name -> launches."""
    from torch.autograd import DeviceType

    out: collections.Counter = collections.Counter()
    for e in prof.events():
        on_gpu = getattr(e, "device_type", None) == DeviceType.CUDA
        if cuda and not on_gpu:
            continue
        if not cuda and (on_gpu or WRAPPERS.match(e.name)):
            continue
        out[GRAPH_PREFIX.sub("", e.name)] += 1
    return out


def phase(args) -> dict:
    import torch

    from tuiprof.engine import precompiled as pc
    from tuiprof.engine.generate import Engine
    from tuiprof.engine.load import load_model, prompt_ids

    torch.set_grad_enabled(False)
    loaded = load_model(args.model, device=args.device, seed=0, max_len=args.max_len)
    prompt, _ = prompt_ids(loaded, None, args.prompt_len, seed=0)
    engine = Engine(loaded.adapter, prompt, device=loaded.device, max_batch=1)
    cuda = engine.cuda
    options = pc.mode_options(engine.compile_mode)
    profile_cpp = {} if cuda else {"cpp.enable_kernel_profile": True}
    steps = pc.PrecompiledSteps(Path(args.dir), {"parity": args.model, "max_len": args.max_len,
                                                 "prompt_len": args.prompt_len,
                                                 "compile_mode": engine.compile_mode})
    t0 = time.perf_counter()
    with torch._inductor.config.patch(profile_cpp):
        if args.phase == "fresh":   # as the engine compiles: torch.compile(decode, mode=...)
            fn = torch.compile(loaded.adapter.decode, mode=engine.compile_mode, dynamic=None)
            fn(*engine.compile_args(1))
            compile_s = time.perf_counter() - t0
            # the file the next process loads: compiled ahead of time as a session saves it
            _aot, note = steps.compile("b1", loaded.adapter.decode, loaded.adapter,
                                       engine.compile_args(1), {**options, **profile_cpp})
            if note:
                raise SystemExit(f"not saved: {note}")
        else:
            fn, note = steps.load("b1", loaded.adapter, engine.compile_args(1),
                                  {**options, **profile_cpp})
            if fn is None:
                raise SystemExit(f"not loaded: {note or 'no file'}")
            fn(*engine.compile_args(1))
            compile_s = time.perf_counter() - t0
    acts = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    runs = []
    for _ in range(args.steps + 2):   # the first two: CUDA graph trees' warm-up and recording
        args_ = engine.compile_args(1)
        if len(runs) < 2:
            fn(*args_)
            runs.append(None)
            continue
        with torch.profiler.profile(activities=acts) as prof:
            fn(*args_)
            if cuda:
                torch.cuda.synchronize()
        runs.append(dict(kernels_of(prof, cuda)))
    runs = [r for r in runs if r is not None]
    return {"phase": args.phase, "device": loaded.device, "torch": torch.__version__,
            "compile_mode": engine.compile_mode, "seconds": round(compile_s, 2),
            "steps": runs}


def compare(fresh: dict, loaded: dict) -> tuple[bool, list[str]]:
    """Parity: every profiled step of both launched the same kernels the same number of times."""
    lines = []
    a, b = fresh["steps"][-1], loaded["steps"][-1]
    same_each = all(s == a for s in fresh["steps"]) and all(s == b for s in loaded["steps"])
    for name in sorted(set(a) | set(b)):
        if a.get(name, 0) != b.get(name, 0):
            lines.append(f"  {name}: fresh {a.get(name, 0)}, loaded {b.get(name, 0)}")
    ok = a == b and same_each and bool(a)
    n = sum(a.values())
    lines.append(f"parity: same {n} kernels a step ({len(a)} names), fresh compile "
                 f"{fresh['seconds']} s, loaded {loaded['seconds']} s" if ok else
                 f"parity: DIFFERENT ({sum(a.values())} kernels a step fresh, "
                 f"{sum(b.values())} loaded; steady within each: {same_each})")
    return ok, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--device")
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--steps", type=int, default=2, help="profiled steps per phase")
    ap.add_argument("--phase", choices=("fresh", "loaded"))
    ap.add_argument("--dir", help="where the saved step goes (a fresh directory by default)")
    ap.add_argument("--json", help="write both phases and the verdict here")
    ap.add_argument("--inductor-cache", help="inductor's cache directory to use (one a session "
                    "filled: the fresh compile's kernels come from it; default: a new one)")
    args = ap.parse_args()
    if args.phase:   # one phase, in this process: its JSON on the last line
        print(json.dumps(phase(args)), flush=True)
        sys.stdout.flush()
        os._exit(0)
    work = Path(args.dir or tempfile.mkdtemp(prefix="tuiprof-parity-"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT),
                                                       os.environ.get("PYTHONPATH", "")]),
               TORCHINDUCTOR_CACHE_DIR=args.inductor_cache or str(work / "inductor"))
    env["TRITON_CACHE_DIR"] = str(Path(env["TORCHINDUCTOR_CACHE_DIR"]) / "triton")
    res = {}
    for ph in ("fresh", "loaded"):
        cmd = [sys.executable, __file__, "--phase", ph, "--model", args.model, "--dir", str(work),
               "--max-len", str(args.max_len), "--prompt-len", str(args.prompt_len),
               "--steps", str(args.steps)] + (["--device", args.device] if args.device else [])
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{ph}: exit {r.returncode}: {r.stderr[-1500:]}")
            return 1
        res[ph] = json.loads(r.stdout.strip().splitlines()[-1])
    ok, lines = compare(res["fresh"], res["loaded"])
    print(f"{args.model} on {res['fresh']['device']}, torch {res['fresh']['torch']}, "
          f"compile mode {res['fresh']['compile_mode']}")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({**res, "parity": ok, "lines": lines}, indent=1))
    return 0 if ok else 2


if __name__ == "__main__":
    raise SystemExit(main())
