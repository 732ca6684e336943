"""GPU check of the tensor-parallel wait/transfer split (docs/multi-gpu.md): one command, one
table. Run from the repository root on a host with 4 GPUs (``bench/verify/verify_tp_wait.sh`` installs
the wheels and tmux first)::

    OUT=/tmp/out python bench/verify/verify_tp_wait.py --tmux "$T"      # about 5-6 minutes

What it runs (qwen3-0.6b, random weights, ``tuiprof`` as a user starts it):

1. TP=1 eager, headless: the reference ms/step for the scaling efficiency.
2. TP=4 eager, headless (every step traced): the late rank named, per rank compute / transfer
   / wait / idle per step, the findings.
3. TP=4 eager twice more with ``TUIPROF_TEST_TP_DELAY_US=L:D1`` then ``L:D2`` (a host delay
   before each collective of rank L, a rank that is *not* the late one in 2): L must become the
   late rank, and the others' wait per call must grow by D2 - D1 between the two runs, to
   within 10 % (the difference cancels what L's host does besides the delay).
4. TP=4 compiled, headless: the same figures with CUDA graphs.
5. The live app (``tuiprof --model qwen3-0.6b --tp 4``) in tmux: the all-ranks view (``a``)
   about 30 s into decoding, then the kernels pane with its NCCL split.

``$OUT`` receives ``tp_wait.txt`` (this table and each run's headless summary),
``tp_wait.json`` (the numbers) and ``tp_wait_live.txt`` (the tmux captures). Snapshots stay
in ``--work`` (they hold every rank's raw records: too big to bring back).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuiprof.analysis.cross_rank import find_ranks, ranks_summary  # noqa: E402
from tuiprof.analysis.tokens import mode_summaries  # noqa: E402
from tuiprof.export.snapshot import read_any_snapshot  # noqa: E402
from tuiprof.store.rank_set import RanksView  # noqa: E402

T0 = time.monotonic()
LOG: list[str] = []


def say(text: str) -> None:
    line = f"[{time.monotonic() - T0:6.1f} s] {text}"
    print(line, flush=True)
    LOG.append(line)


def left(a) -> float:
    return a.budget - (time.monotonic() - T0)


def tuiprof(a, name: str, args: list[str], env: dict | None = None, limit: float = 150) -> str:
    """One headless ``tuiprof`` run; its output (the per-rank summary) is returned and logged."""
    limit = min(limit, left(a) - 5)
    if limit < 30:
        say(f"{name}: SKIPPED (time budget)")
        return ""
    cmd = [sys.executable, "-m", "tuiprof", "--model", a.model, "--headless", *args]
    say(f"{name}: {' '.join(cmd[1:])}" + (f"  [{' '.join(f'{k}={v}' for k, v in env.items())}]"
                                            if env else ""))
    try:
        p = subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True,
                           text=True, timeout=limit)
        out = p.stdout + (f"\n[exit {p.returncode}] {p.stderr[-1500:]}" if p.returncode else "")
    except subprocess.TimeoutExpired as exc:
        out = f"{name}: timed out after {limit:.0f} s\n{(exc.stdout or b'')[-2000:]!r}"
    LOG.append(f"----- {name}\n{out.strip()}")
    say(f"{name}: done")
    return out


def load(path: Path):
    try:
        return read_any_snapshot(path)
    except Exception as exc:
        say(f"cannot read {path}: {exc}")
        return None


def step_ms(view) -> float | None:
    ms = mode_summaries(view, "decode").get("eager")
    return ms.ms_median if ms else None


def others_wait_per_call(summary, rank: int) -> float | None:
    """Median over complete calls of the mean wait of the ranks other than ``rank`` (µs)."""
    done = summary.comm.complete if summary.comm is not None else []
    if not done:
        return None
    n = len(summary.ranks)
    return statistics.median(statistics.mean(c.waits[r] for r in range(n) if r != rank)
                             for c in done) / 1e3


def late_host_gap(summary, rank: int) -> float | None:
    """Median host gap (µs) of ``rank`` before its collectives' launches, over all calls."""
    done = summary.comm.complete if summary.comm is not None else []
    gaps = [c.arrivals[rank].host_gap for c in done if c.arrivals[rank].host_gap is not None]
    return statistics.median(gaps) / 1e3 if gaps else None


ROW = ["run", "rank", "ms/step", "step", "compute", "comm", "transfer", "wait", "idle", "NCCL",
       "last at", "late by", "launch"]


def rows_of(name: str, s) -> list[list]:
    f = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    p = lambda v: "–" if v is None else f"{100 * v:.0f}%"  # noqa: E731
    return [[name, str(r.rank) + (" *" if s.late_rank == r.rank else ""), f"{r.step_ms:.2f}",
             f(r.wall_ms), f(r.compute_ms), f(r.comm_ms), f(r.transfer_ms), f(r.wait_ms),
             f(r.idle_ms), p(r.comm_share), p(r.late_share), f(r.late_by_ms), f(r.host_ms)]
            for r in s.ranks]


def table(rows: list[list]) -> str:
    w = [max(len(str(x)) for x in col) for col in zip(ROW, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(n) for c, n in zip(cells, w))  # noqa: E731
    return "\n".join([line(ROW), "  ".join("-" * n for n in w), *map(line, rows)])


def live(a) -> dict:
    """The app in tmux: ``a`` about 30 s into decoding, then the kernels pane."""
    if not a.tmux:
        say("live app: SKIPPED (no --tmux)")
        return {"skipped": "no tmux"}
    limit = min(150.0, left(a) - 5)
    if limit < 90:
        say("live app: SKIPPED (time budget)")
        return {"skipped": "time"}
    name = "tp_wait_live"
    steps = f"{a.live_wait}:a;{a.live_more}:;0:Escape;1:2;2:;0:q"
    cmd = [sys.executable, "bench/verify/tmux_capture.py", "--tmux", a.tmux, "--size", "200x50",
           "--name", name, "--steps", steps, "--", sys.executable, "-m", "tuiprof", "--model",
           a.model, "--tp", str(a.tp), "--export-dir", str(a.work)]
    say("live app: " + " ".join(cmd[1:]))
    try:
        subprocess.run(cmd, timeout=limit, capture_output=True, text=True,
                       env={**os.environ, "OUT": str(a.out)})
    except subprocess.TimeoutExpired:
        say("live app: timed out")
    path = a.out / f"{name}.txt"
    text = path.read_text() if path.exists() else ""
    shots = text.split("===== ")
    ranks_shot = next((x for x in shots if "after keys [a]" in x), "")
    compute = next((ln for ln in ranks_shot.splitlines() if ln.strip().startswith("compute ms")), "")
    filled = bool(compute) and "–" not in compute
    kern = next((x for x in shots if "after keys [2]" in x), "")
    split = "transfer" in kern and "wait" in kern and "% of GPU time" in kern
    say(f"live app: all-ranks filled {filled} ({compute.strip()[:100]}); kernels pane NCCL "
        f"split shown {split}")
    return {"filled": filled, "compute_row": compute.strip(), "nccl_split_shown": split}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--tp", type=int, default=4)
    p.add_argument("--tokens", type=int, default=96, help="decode tokens of the TP runs")
    p.add_argument("--delay-tokens", type=int, default=48, help="... of the delayed runs")
    p.add_argument("--delays", default="1500,3000", help="D1,D2 in µs")
    p.add_argument("--ring", type=int, default=32,
                   help="raw records kept per rank: the last N steps (the snapshot's size)")
    p.add_argument("--tmux", default="", help="tmux command (bench/verify/tmux_capture.py)")
    p.add_argument("--live-wait", type=float, default=55.0,
                   help="seconds from start to pressing a (load ~20-25 s + ~30 s decoding)")
    p.add_argument("--live-more", type=float, default=5.0)
    p.add_argument("--budget", type=float, default=460.0, help="seconds for everything")
    p.add_argument("--work", default="/tmp/tp_wait", help="snapshots go here")
    p.add_argument("--skip", default="", help="comma list of: tp1,delay,compiled,live")
    a = p.parse_args(argv)
    a.work = Path(a.work)
    a.work.mkdir(parents=True, exist_ok=True)
    out = a.out = Path(os.environ.get("OUT", a.work))
    out.mkdir(parents=True, exist_ok=True)
    skip = set(a.skip.split(","))
    d1, d2 = (int(x) for x in a.delays.split(","))
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    doc: dict = {"model": a.model, "tp": a.tp, "delays_us": [d1, d2]}
    rows: list[list] = []
    checks: list[tuple[str, bool | None, str]] = []
    tp = ["--tp", str(a.tp), "--ring-tokens", str(a.ring)]

    # 1. TP=1 reference
    ref_ms = None
    if "tp1" not in skip:
        tuiprof(a, "tp1 eager", ["--max-new-tokens", "64", "--json", str(a.work / "tp1.json")],
                limit=120)
        v = load(a.work / "tp1.json") if (a.work / "tp1.json").exists() else None
        ref_ms = step_ms(v) if v is not None else None
        doc["tp1_eager_ms"] = ref_ms

    # 2. TP=4 eager
    tuiprof(a, f"tp{a.tp} eager", tp + ["--max-new-tokens", str(a.tokens), "--json",
                                        str(a.work / "eager.json")])
    rv = load(a.work / "eager.json") if (a.work / "eager.json").exists() else None
    base = None
    if isinstance(rv, RanksView):
        if ref_ms:
            rv = RanksView(rv.views, {**rv.meta, "tp_reference": {
                "tp": 1, "mode": "eager", "ms_per_token": ref_ms, "source": "TP=1 run"}})
        base = ranks_summary(rv, "eager")
        rows += rows_of(f"tp{a.tp} eager", base)
        found = find_ranks(rv, base)
        doc["eager"] = {"late_rank": base.late_rank, "basis": base.late_basis,
                        "steps": base.steps, "calls": base.calls,
                        "transfer_ms": base.transfer_ms,
                        "wait_ms": {r.rank: r.wait_ms for r in base.ranks},
                        "findings": [f.to_dict() for f in found]}
        named = base.late_rank is not None
        lr = base.ranks[base.late_rank] if named else None
        checks.append(("eager: late rank named", named,
                       f"rank {base.late_rank}: {base.late_basis}" if named else base.late_basis))
        if lr is not None:
            others = [r for r in base.ranks if r.rank != lr.rank]
            checks.append(("eager: wait and transfer per step", True,
                           f"others wait {statistics.median(r.wait_ms for r in others):.2f} ms, "
                           f"transfer {base.transfer_ms:.3f} ms per step"))
        sc = next((f for f in found if f.id == "tp-scaling"), None)
        if sc is not None:
            checks.append(("eager: scaling vs TP=1", None, sc.title))

    # 3. delayed runs on a rank that is not the late one
    if "delay" not in skip and base is not None and base.calls:
        late = base.late_rank if base.late_rank is not None else 0
        target = min((r for r in base.ranks if r.rank != late),
                     key=lambda r: r.late_share or 0.0).rank
        got = {}
        for d in (d1, d2):
            name = f"tp{a.tp} eager delay {d} µs on rank {target}"
            path = a.work / f"delay{d}.json"
            tuiprof(a, name, tp + ["--max-new-tokens", str(a.delay_tokens), "--json", str(path)],
                    env={"TUIPROF_TEST_TP_DELAY_US": f"{target}:{d}"})
            dv = load(path) if path.exists() else None
            if isinstance(dv, RanksView):
                s = ranks_summary(dv, "eager")
                rows += rows_of(f"delay {d} r{target}", s)
                got[d] = s
        if len(got) == 2:
            w1, w2 = (others_wait_per_call(got[d], target) for d in (d1, d2))
            g1, g2 = (late_host_gap(got[d], target) for d in (d1, d2))
            named = all(got[d].late_rank == target for d in (d1, d2))
            found_us = (w2 - w1) if w1 is not None and w2 is not None else None
            err = abs(found_us - (d2 - d1)) / (d2 - d1) if found_us is not None else None
            ok = named and err is not None and err <= 0.10
            doc["delay"] = {"rank": target, "d1_us": d1, "d2_us": d2,
                            "others_wait_per_call_us": [w1, w2], "found_us": found_us,
                            "error": err, "late_rank": [got[d].late_rank for d in (d1, d2)],
                            "late_share": [got[d].ranks[target].late_share for d in (d1, d2)],
                            "host_gap_us": [g1, g2]}
            if found_us is None:
                detail = "no collective call matched on every rank"
            else:
                gaps = (f"; its host gap before the launch {g1:.0f} → {g2:.0f} µs"
                        if g1 is not None and g2 is not None else "")
                detail = (f"rank {target} late in both runs: {named}; the others' wait per call "
                          f"grew by {found_us:.0f} µs for {d2 - d1} µs more delay (error "
                          f"{100 * err:.1f} %){gaps}")
            checks.append(("delay found to within 10 %", ok, detail))
        else:
            checks.append(("delay found to within 10 %", False, "a delayed run gave no snapshot"))

    # 4. compiled
    if "compiled" not in skip:
        tuiprof(a, f"tp{a.tp} compiled", tp + ["--mode", "compiled", "--max-new-tokens", "256",
                                               "--json", str(a.work / "compiled.json")],
                limit=240)
        cv = load(a.work / "compiled.json") if (a.work / "compiled.json").exists() else None
        if isinstance(cv, RanksView):
            s = ranks_summary(cv, "compiled")
            rows += rows_of(f"tp{a.tp} compiled", s)
            doc["compiled"] = {"late_rank": s.late_rank, "basis": s.late_basis,
                               "steps": s.steps, "calls": s.calls,
                               "transfer_ms": s.transfer_ms,
                               "wait_ms": {r.rank: r.wait_ms for r in s.ranks},
                               "findings": [f.to_dict() for f in find_ranks(cv, s)]}
            checks.append(("compiled: split", s.calls > 0,
                           f"late rank {s.late_rank} ({s.late_basis}); transfer "
                           f"{s.transfer_ms if s.transfer_ms is not None else float('nan'):.3f} "
                           f"ms per step"))

    # 5. the live app
    if "live" not in skip:
        doc["live"] = live(a)
        if "filled" in doc["live"]:
            checks.append(("live all-ranks view filled", doc["live"]["filled"],
                           doc["live"]["compute_row"][:120]))
            checks.append(("live kernels pane NCCL split", doc["live"]["nccl_split_shown"], ""))

    text = [table(rows), "", "* late rank; per step: means over the steps traced on every rank "
            "(docs/multi-gpu.md); ms/step: median of all decode steps; launch: step start to the "
            "end of its last launch call", ""]
    for what, ok, detail in checks:
        mark = "PASS" if ok else ("info" if ok is None else "FAIL")
        text.append(f"{mark:4}  {what}: {detail}")
    text.append(f"\ntotal {time.monotonic() - T0:.0f} s")
    report = "\n".join(text)
    print("\n" + report)
    doc["checks"] = [{"check": c, "ok": ok, "detail": d} for c, ok, d in checks]
    (out / "tp_wait.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "tp_wait.txt").write_text(report + "\n\n" + "\n".join(LOG) + "\n")
    return 0 if all(ok is not False for _, ok, _ in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
