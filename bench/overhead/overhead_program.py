"""What `tuiprof run` costs a user's program: the same script alone and under tuiprof, as whole
processes, interleaved (the method of ``bench/overhead/overhead_procs.py``).

Configurations (each run is its own process):

* ``alone``: ``python SCRIPT ARGS`` as the user runs it (``runpy``, its own ``sys.argv``);
* ``tuiprof``: ``tuiprof run --headless --sample-every live -- python SCRIPT ARGS`` (the real
  command: collectors before the program's first CUDA call, transformers' steps found
  automatically, output captured and teed, the live app's sampling);
* ``cupti-attached``: ``tuiprof`` with ``--cupti-attached`` (CUPTI attached throughout, as
  before it was attached for bursts only by default);
* ``no-api``: the same without CUPTI's API records (where a program's own per-step launches
  outside a CUDA graph cost: CUPTI intercepts every API call while those kinds are on);
* ``api-stay-on``: the same with the API kinds kept on between compiled bursts, as the
  built-in engine does (``tuiprof run`` switches them off; this measures what that saves);
* ``no-cupti``: ``--no-cupti`` (step source, store, NVML, allocator statistics only);
* ``attached``: CUPTI subscribed and nothing recorded between bursts (no API kinds, no memory
  records, no bursts after the first: what CUPTI costs a program's ops merely by being there);
* ``hooks``: ``--no-cupti --no-nvml --alloc-every 0`` (the step source's hooks on
  ``generate()``, the per-step CUDA events and the store, nothing collected).

From ``hooks`` through ``no-cupti``, ``attached`` and ``no-api`` to ``tuiprof``, each adds one
part, so a run of all six ranks the parts.

The figure is what the script measures itself: ``DECODE_MS_PER_STEP=`` (``bench/programs/
hf_qwen.py``: median over its windows of (T(generate N) − T(generate 1)) / (N − 1)). To pay
the imports (torch and transformers: 15 s on the H100 host) once, a parent imports them and
forks a child per run before anything touches CUDA, CUPTI or NVML. A round runs every
configuration once, in an order that rotates and reverses from round to round.

    python bench/overhead/overhead_program.py --mode eager --rounds 8
    python bench/overhead/overhead_program.py --mode compiled --rounds 6 --configs alone,tuiprof,api-stay-on
    python bench/overhead/overhead_program.py --device cpu --tiny --rounds 2   # the CPU path
"""
from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.overhead import overhead_procs  # noqa: E402
from bench.overhead.overhead_procs import (fork_run, interleaved_rounds, parse_cpus,  # noqa: E402
                                  with_baseline, write_json)
SCRIPT = REPO / "bench" / "programs" / "hf_qwen.py"
CONFIGS = ("alone", "tuiprof", "cupti-attached", "no-api", "api-stay-on", "no-cupti", "attached", "hooks")
FIGURE = re.compile(r"DECODE_MS_PER_STEP=([\d.]+)")


def preimport() -> None:
    """What a child would import, except anything that touches CUDA, CUPTI or NVML."""
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, CompileConfig, Qwen3Config  # noqa: F401
    from transformers.generation import utils  # noqa: F401
    from transformers.models.qwen3 import modeling_qwen3  # noqa: F401

    import tuiprof.cli  # noqa: F401
    from tuiprof.cli import program as command  # noqa: F401
    from tuiprof.program import program_session, steps, transformers_steps  # noqa: F401
    from tuiprof.profiler import Profiler  # noqa: F401

    if torch.cuda.is_initialized():  # is_available() would init the driver: not before fork
        raise SystemExit("the parent initialised CUDA: children could not use it after fork")


def child(name: str, script_args: list[str], work: Path, conn) -> None:
    """One run in a fresh process; its output goes to a file the parent reads."""
    t0 = time.perf_counter()
    log = work / f"{name}-{os.getpid()}.out"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    out: dict = {"config": name}
    try:
        if name == "alone":
            sys.argv = [str(SCRIPT), *script_args]
            try:
                runpy.run_path(str(SCRIPT), run_name="__main__")
            except SystemExit as exc:
                out["exit"] = exc.code
        else:
            from tuiprof import cli
            from tuiprof.cli import program as command

            if name in ("no-api", "api-stay-on", "attached"):
                make = command.program_options

                def program_options(args, headless):
                    opts = make(args, headless)
                    if name == "api-stay-on":
                        opts.compiled_api_kinds_stay_on = True
                    else:
                        opts.api = False
                    if name == "attached":
                        opts.memory, opts.sample_every = False, 10**9
                        opts.detach_between_bursts = False
                    return opts

                command.program_options = program_options
            extra = {"no-cupti": ["--no-cupti"], "cupti-attached": ["--cupti-attached"],
                     "hooks": ["--no-cupti", "--no-nvml", "--alloc-every", "0"]}.get(name, [])
            out["exit"] = cli.main(["run", "--headless", "--sample-every", "live",
                                    "--ring-tokens", "4", "--json",
                                    str(work / f"{name}-{os.getpid()}.json"), *extra, "--",
                                    "python", str(SCRIPT), *script_args])
    except BaseException as exc:  # noqa: BLE001 - one line to the parent
        out["error"] = f"{exc.__class__.__name__}: {str(exc)[:200]}"
    sys.stdout.flush()
    sys.stderr.flush()
    text = log.read_text(errors="replace")
    m = FIGURE.findall(text)
    if m:
        out["ms_per_step"] = float(m[-1])
    elif "error" not in out:
        out["error"] = "no DECODE_MS_PER_STEP in the output: " + text[-300:].replace("\n", " | ")
    if name != "alone":
        snap = next(work.glob(f"{name}-{os.getpid()}.json"), None)
        if snap is not None:
            out.update(step_profile(snap))
    out["child_s"] = time.perf_counter() - t0
    conn.send(out)
    conn.close()
    os._exit(0)


def step_profile(snapshot_path: Path) -> dict:
    """Where a tuiprof run's decode time went, from its snapshot's last steps: the median host
    ms of the 1st, 2nd and 3rd decode step after each prefill against the rest, and how many
    prefills were traced (their records are folded beside the steps that follow)."""
    try:
        doc = json.loads(snapshot_path.read_text())
    except (OSError, ValueError):
        return {}
    tokens = doc.get("tokens") or []
    after: dict[int, list[float]] = {1: [], 2: [], 3: []}
    rest: list[float] = []
    prefills = traced = 0
    k = 0
    for t in sorted(tokens, key=lambda t: t["seq"]):
        if t["phase"] == "prefill":
            prefills += 1
            traced += bool(t.get("kernels"))
            k = 0
        elif t["phase"] == "decode" and t.get("host_ms") is not None:
            k += 1
            (after[k] if k in after else rest).append(t["host_ms"])
    med = lambda xs: round(statistics.median(xs), 3) if xs else None  # noqa: E731
    return {"after_prefill_ms": [med(after[i]) for i in (1, 2, 3)], "rest_ms": med(rest),
            "prefills": prefills, "traced_prefills": traced,
            "detaches": (doc.get("overhead") or {}).get("detaches")}


def run_one(name: str, script_args: list[str], work: Path, timeout: float) -> dict:
    return fork_run(child, (name, script_args, work), name, timeout)


def summarise(rounds: list[list[dict]], names: list[str]) -> dict:
    """Per configuration: the median over rounds of the ratio to the same round's ``alone``."""
    table = {}
    for name in names:
        ratios, ms = [], []
        for rnd in rounds:
            by = {r["config"]: r for r in rnd}
            r, b = by.get(name), by.get("alone")
            if r and b and r.get("ms_per_step") and b.get("ms_per_step"):
                ratios.append(r["ms_per_step"] / b["ms_per_step"])
                ms.append(r["ms_per_step"])
        table[name] = ({"rounds": len(ratios), "ratio_median": statistics.median(ratios),
                        "ratio_min": min(ratios), "ratio_max": max(ratios),
                        "ms_median": statistics.median(ms)} if ratios else {"rounds": 0})
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", default="eager", choices=("eager", "compiled"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="qwen3-tiny (a CPU run)")
    p.add_argument("--new-tokens", type=int, default=33)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--configs", default="alone,tuiprof")
    p.add_argument("--deadline", type=float, default=0,
                   help="start no round after this many seconds (0: no limit)")
    p.add_argument("--run-timeout", type=float, default=300)
    p.add_argument("--cpus", default="", help="run every child on these CPUs only, e.g. 4-7")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    overhead_procs.CPUS = parse_cpus(a.cpus)
    names = [n for n in a.configs.split(",") if n]
    if not with_baseline(names, "alone", CONFIGS):
        return 2
    script_args = ["--mode", a.mode, "--new-tokens", str(a.new_tokens), "--repeats",
                   str(a.repeats), "--device", a.device] + (["--tiny"] if a.tiny else [])
    work = Path(tempfile.mkdtemp(prefix="overhead-program-"))
    t_start = time.perf_counter()
    preimport()
    print(f"# {SCRIPT.name} {' '.join(script_args)}; imports {time.perf_counter() - t_start:.1f}"
          f" s; outputs in {work}" + (f"; children on CPUs {a.cpus}" if a.cpus else ""),
          flush=True)
    rounds = interleaved_rounds(
        names, a.rounds, a.deadline, t_start,
        lambda name: run_one(name, script_args, work, a.run_timeout),
        lambda res: f"{res.get('ms_per_step', '-')} ms/step, process {res['whole_s']:.1f} s"
        + (f"; decode ms after a prefill {res['after_prefill_ms']} vs {res['rest_ms']},"
           f" prefills traced {res['traced_prefills']}/{res['prefills']},"
           f" CUPTI detaches {res.get('detaches')}"
           if "rest_ms" in res else ""))
    table = summarise(rounds, names)
    print(f"\n| {a.mode} | rounds | decode ms/step (median) | / alone: median (min-max) |")
    print("|---|---|---|---|")
    for name, row in table.items():
        if not row["rounds"]:
            print(f"| {name} | 0 | – | – |")
            continue
        print(f"| {name} | {row['rounds']} | {row['ms_median']:.3f} | {row['ratio_median']:.3f}"
              f" ({row['ratio_min']:.3f}-{row['ratio_max']:.3f}) |")
    write_json(a, rounds, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
