"""GPU verification of following a program's processes and of detached sessions (issues 36
and 40): ``tuiprof run`` as a user runs it, whole processes, read back from the snapshots.

Subcommands (each prints one table; files go to ``$OUT`` when it is set):

* ``kernels``: the engine-shaped program (tests/programs/spawn_engine.py: the main process
  takes requests, a spawn child runs ``generate()``) against the same program with the engine
  in its main process (``--inline``), both under ``tuiprof run --headless`` (every step
  traced). Kernels per traced decode step of the process that ran ``generate()``: the followed
  child must see what one process sees (target: within 1 %).
* ``torchrun``: ``tuiprof run --headless -- torchrun --standalone --nproc-per-node N
  tests/programs/tp_job.py`` (a TP decode of the project's own: MLPs sharded by hand, one
  NCCL all-reduce per layer per token, ``init_process_group`` called by the script). Per rank:
  steps, kernels and NCCL kernels per traced decode step, the compute / communication / idle
  split, NCCL share, and the job's step-end skew and late rank (the ``--tp`` analysis).
* ``overhead``: what a detached session costs a program while nobody is attached: interleaved
  whole-process rounds of bench/programs/hf_qwen.py alone and under ``tuiprof run --detach``
  (the live app's sampling, the keeper's pulls), the script's own DECODE_MS_PER_STEP, median
  ratio per mode (targets: eager ≤ 1.05, compiled ≤ 1.03).

    python bench/verify/verify_processes.py kernels --device cuda --model qwen3-0.6b
    python bench/verify/verify_processes.py torchrun --nproc 2 --device cuda --model qwen3-0.6b
    python bench/verify/verify_processes.py overhead --modes eager,compiled --rounds 3
    python bench/verify/verify_processes.py kernels --device cpu --no-cupti    # the CPU path
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
PROGRAMS = REPO / "tests" / "programs"
T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s] {text}", flush=True)


def out_dir() -> Path:
    d = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="verify-processes-"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def tuiprof(*argv: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    return subprocess.run([sys.executable, "-m", "tuiprof", *argv], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd)


def load(path: Path):
    from tuiprof.export.snapshot import read_any_snapshot
    return read_any_snapshot(path)


def views_of(snap) -> list:
    return list(snap.views) if hasattr(snap, "views") else [snap]


def decode_kernels(view) -> list[int]:
    """Kernels of each traced decode step (kernel records attributed to it)."""
    return [t.kernels for t in view.timeline if t.done and t.phase == "decode" and t.kernels]


# ---------------------------------------------------------------------------- kernels
def cmd_kernels(a) -> int:
    out = out_dir()
    rows = []
    for label, extra in (("spawn child", []), ("one process", ["--inline"])):
        path = out / f"kernels_{label.split()[0]}.json"
        opts = ["--no-cupti"] if a.no_cupti else []
        say(f"{label}: tuiprof run --headless -- python spawn_engine.py {' '.join(extra)}")
        r = tuiprof("run", "--headless", "--sample-every", "1", "--no-nvml", "--json", str(path), *opts, "--",
                    "python", str(PROGRAMS / "spawn_engine.py"), "--model", a.model,
                    "--device", a.device, "--requests", str(a.requests), "--new-tokens",
                    str(a.new_tokens), *extra, cwd=out)
        if r.returncode != 0:
            print(r.stderr[-3000:])
            return 1
        vs = [v for v in views_of(load(path)) if v.meta.get("step_source") == "transformers"]
        if len(vs) != 1:
            print(f"{label}: {len(vs)} processes with generate() steps")
            return 1
        v = vs[0]
        ks = decode_kernels(v)
        steps = [t for t in v.timeline if t.done and t.phase == "decode"]
        proc = (v.meta.get("process") or {}).get("name", "main")
        rows.append((label, proc, len(steps), len(ks), statistics.median(ks) if ks else None,
                     statistics.mean(ks) if ks else None))
    print(f"\n{'run':<12} {'process':<28} {'decode':>7} {'traced':>7} {'kernels/step median':>20}"
          f" {'mean':>8}")
    for r in rows:
        med = "–" if r[4] is None else f"{r[4]:.1f}"
        mean = "–" if r[5] is None else f"{r[5]:.2f}"
        print(f"{r[0]:<12} {r[1]:<28} {r[2]:>7} {r[3]:>7} {med:>20} {mean:>8}")
    if rows[0][5] and rows[1][5]:
        ratio = rows[0][5] / rows[1][5]
        print(f"\nkernels per decode step, spawn child / one process: {ratio:.4f} "
              f"({'within' if abs(ratio - 1) <= 0.01 else 'NOT within'} 1 %)")
    (out / "verify_processes_kernels.json").write_text(json.dumps(rows))
    return 0


# ---------------------------------------------------------------------------- torchrun
def cmd_torchrun(a) -> int:
    from tuiprof.analysis.cross_rank import ranks_summary
    from tuiprof.store.rank_set import jobs, process_facts

    out = out_dir()
    path = out / f"torchrun_{a.nproc}.json"
    opts = ["--no-cupti"] if a.no_cupti else []
    if a.sample_every:  # "live": bursts, CUPTI attached around them only, on every rank
        opts += ["--sample-every", a.sample_every]
    say(f"tuiprof run --headless {' '.join(opts)} -- torchrun --nproc-per-node {a.nproc} tp_job.py "
        f"--model {a.model} --device {a.device}")
    r = tuiprof("run", "--headless", "--sample-every", "1", "--json", str(path), *opts, "--", "torchrun",
                "--standalone", "--nproc-per-node", str(a.nproc), str(PROGRAMS / "tp_job.py"),
                "--model", a.model, "--device", a.device, "--requests", str(a.requests),
                "--new-tokens", str(a.new_tokens), cwd=out)
    (out / f"torchrun_{a.nproc}.stdout.txt").write_text(r.stdout + "\n" + r.stderr)
    if r.returncode != 0:
        print(r.stderr[-3000:])
        return 1
    snap = load(path)
    found = jobs(snap)
    if not found:
        print("no torch.distributed job among the processes:",
              [process_facts(v).get("name") for v in views_of(snap)])
        return 1
    key, job = found[0]
    s = ranks_summary(job)
    print(f"\njob {key}: {job.world_size} ranks, mode {s.mode}, {s.steps} decode steps traced on "
          f"every rank")
    f = (lambda v, nd=3: "–" if v is None else f"{v:.{nd}f}")  # noqa: E731
    print(f"{'rank':>4} {'pid':>7} {'device':>8} {'decode':>6} {'kernels/step':>13} "
          f"{'NCCL/step':>10} {'ms/step':>8} {'compute':>8} {'comm':>8} {'transfer':>9} "
          f"{'wait':>8} {'idle':>8} {'NCCL %':>7}")
    for rv, rs in zip(job.views, s.ranks):
        ks = decode_kernels(rv)
        share = "–" if rs.comm_share is None else f"{100 * rs.comm_share:.0f}"
        print(f"{rs.rank:>4} {process_facts(rv).get('pid', '–'):>7} {str(rs.device):>8} "
              f"{rs.decode_tokens:>6} {f(statistics.median(ks) if ks else None, 1):>13} "
              f"{f(rs.comm_kernels_per_step, 1):>10} {rs.step_ms:>8.2f} {f(rs.compute_ms):>8} "
              f"{f(rs.comm_ms):>8} {f(rs.transfer_ms):>9} {f(rs.wait_ms):>8} {f(rs.idle_ms):>8} "
              f"{share:>7}")
    if s.skew is not None:
        print(f"step-end skew: median {s.skew.end_median_us:.0f} µs, p90 {s.skew.end_p90_us:.0f} "
              f"µs over {s.skew.steps} steps; clock residual {s.clock.get('residual_ns')} ns")
    print(f"late rank: {s.late_rank} ({s.late_basis})")
    for rv, rs in zip(job.views, s.ranks):  # bursts only on a rank, as in one process
        cupti = (getattr(rv, "collectors", None) or {}).get("cupti") or {}
        print(f"rank {rs.rank}: CUPTI {cupti.get('message', '–')}; detached "
              f"{(getattr(rv, 'overhead', None) or {}).get('detaches', '–')} times")
    others = [process_facts(v) for v in views_of(snap) if v.meta.get("rank") is None]
    print("other processes: " + ", ".join(f"pid {p.get('pid')} {p.get('name')}" for p in others))
    return 0


# ---------------------------------------------------------------------------- overhead
FIGURE = re.compile(r"DECODE_MS_PER_STEP=([\d.]+)")


def run_alone(a, mode: str) -> float | None:
    r = subprocess.run([sys.executable, str(REPO / "bench" / "programs" / "hf_qwen.py"),
                        "--mode", mode, "--new-tokens", str(a.new_tokens), "--repeats",
                        str(a.repeats), *(["--tiny", "--device", "cpu"] if a.tiny else [])],
                       capture_output=True, text=True, timeout=900)
    m = FIGURE.findall(r.stdout)
    return float(m[-1]) if m else None


def run_detached(a, mode: str, work: Path) -> float | None:
    """The same script under ``tuiprof run --detach``; waits for its end (nobody attached)."""
    from tuiprof.sessions import runtime

    r = tuiprof("run", "--detach", "--export-dir", str(work), "--snapshot-every", "0",
                *(["--no-cupti"] if a.no_cupti else []), "--",
                "python", str(REPO / "bench" / "programs" / "hf_qwen.py"), "--mode", mode,
                "--new-tokens", str(a.new_tokens), "--repeats", str(a.repeats),
                *(["--tiny", "--device", "cpu"] if a.tiny else []), cwd=work)
    if r.returncode != 0:
        print(r.stderr[-2000:])
        return None
    sid = r.stdout.strip().splitlines()[-1]
    d = runtime.runtime_root() / sid
    t_end = time.monotonic() + 900
    while time.monotonic() < t_end:
        info = runtime.read_info(d) or {}
        if info.get("state") in ("ended", "stopped", "error", "dead"):
            break
        time.sleep(0.5)
    log = Path(info.get("log") or "")
    text = log.read_text(errors="replace") if log.is_file() else ""
    tuiprof("stop", sid)   # forget it (it has ended)
    m = FIGURE.findall(text)
    return float(m[-1]) if m else None


def cmd_overhead(a) -> int:
    """Rounds of (alone, detached) pairs, every mode in each round, the order reversed every
    other round; no round starts past ``--deadline`` seconds."""
    out = out_dir()
    work = Path(tempfile.mkdtemp(prefix="detached-", dir=out))
    modes = a.modes.split(",")
    pairs: dict = {m: [] for m in modes}
    for rnd in range(a.rounds):
        for mode in modes:
            if a.deadline and time.monotonic() - T0 > a.deadline:
                break
            order = ("alone", "detached") if rnd % 2 == 0 else ("detached", "alone")
            got = {}
            for name in order:
                say(f"{mode} round {rnd + 1}/{a.rounds}: {name}")
                got[name] = run_alone(a, mode) if name == "alone" else run_detached(a, mode, work)
            say(f"  alone {got['alone']} ms/step, detached {got['detached']} ms/step")
            if got["alone"] and got["detached"]:
                pairs[mode].append((got["alone"], got["detached"]))
    result = {}
    for mode in modes:
        ratios = [d / b for b, d in pairs[mode]]
        result[mode] = {"pairs": pairs[mode],
                        "ratio_median": statistics.median(ratios) if ratios else None}
        if ratios:
            print(f"{mode}: detached / alone, median of {len(ratios)} rounds: "
                  f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
                  f"max {max(ratios):.3f}); ms/step alone {statistics.median(b for b, _ in pairs[mode]):.3f}")
    (out / "verify_processes_overhead.json").write_text(json.dumps(result, indent=1))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kernels")
    t = sub.add_parser("torchrun")
    o = sub.add_parser("overhead")
    for q in (k, t):
        q.add_argument("--model", default="qwen3-0.6b")
        q.add_argument("--device", default="cuda")
        q.add_argument("--requests", type=int, default=4)
        q.add_argument("--new-tokens", type=int, default=32)
        q.add_argument("--no-cupti", action="store_true")
    t.add_argument("--nproc", type=int, default=2)
    t.add_argument("--sample-every", default=None,
                   help="tuiprof run's --sample-every (default: a headless run's, every step)")
    o.add_argument("--modes", default="eager,compiled")
    o.add_argument("--rounds", type=int, default=3)
    o.add_argument("--new-tokens", type=int, default=65)
    o.add_argument("--repeats", type=int, default=3)
    o.add_argument("--tiny", action="store_true", help="qwen3-tiny on the CPU (a dry run)")
    o.add_argument("--no-cupti", action="store_true")
    o.add_argument("--deadline", type=float, default=0, help="start no run after this many s")
    a = p.parse_args()
    return {"kernels": cmd_kernels, "torchrun": cmd_torchrun, "overhead": cmd_overhead}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
