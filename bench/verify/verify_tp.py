"""GPU verification of tensor-parallel profiling (docs/multi-gpu.md): one command, one table.

For each model and TP degree one live session of ranks (what ``tuiprof --model M --tp N``
runs: torch.distributed ranks, NCCL on GPUs, each rank a session process with CUPTI, NVML and
its own store), eager first, then compiled (``c``, agreed by all ranks) where asked. Per
model, TP and mode, per rank: median ms per decode step over all tokens, tokens/s, and over
the traced steps (tuiprof's default sampling: bursts of 4 tokens) compute / communication /
idle ms per step, the NCCL share and how much of it overlaps compute; the step-end skew
across ranks, the late rank, the cross-rank findings, and the TP scaling efficiency against
the TP=1 session of the same model and mode. The collection overhead per rank comes from
bench/overhead/overhead.py's interleaved windows (``bare`` vs ``auto``) run in every rank at once.

On 2 GPUs (nvidia-h200-x2), estimated 6-7.5 minutes (not measured: four sessions of ~15 s
start-up and ~20 s load each, three compiles of 45-90 s, ~45 s of overhead windows)::

    python bench/verify/verify_tp.py                      # qwen3-0.6b TP 1,2 eager+compiled,
                                                   # nanochat-d34 TP 1,2 eager, compiled at TP 2
    python bench/verify/verify_tp.py --models qwen3-0.6b  # ~4.5 min, then --models nanochat-d34 ~3 min
On the CPU (gloo, tiny models, the same code path)::

    python bench/verify/verify_tp.py --device cpu --tiny

``$OUT`` (when set) receives ``verify_tp.json``, ``tp_scaling.csv``, the multi-rank snapshot of
each TP>1 session (with its TP=1 reference: ``tuiprof view`` shows the scaling) and three
screenshots of the live app over the qwen3-0.6b TP=2 session (rank 0, rank 1, all ranks).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.overhead.overhead import Windows, table  # noqa: E402
from tuiprof.collect.cupti_collector import BURST  # noqa: E402
from tuiprof.sampling import AUTO_SAMPLE_EVERY  # noqa: E402
from tuiprof.sweep.tp import ModeResult, TPRun, TPSession, scaling_rows, write_outputs  # noqa: E402

TINY = {"qwen3-0.6b": "qwen3-tiny", "nanochat-d34": "nanochat-tiny"}
T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s] {text}", flush=True)


class AlignedWindows(Windows):
    """bench/overhead/overhead.py's windows, started at a decode step every rank reaches at once (a
    multiple of ``ALIGN``), so that all ranks switch collection on and off together."""

    ALIGN = 16

    def __init__(self, prof) -> None:
        super().__init__(prof)
        self._step = 0

    def token_started(self, phase, mode, step, cycle, start_ns):
        self._step = step
        super().token_started(phase, mode, step, cycle, start_ns)

    def _boundary(self, mode: str) -> None:
        if not self.timing and self.plan and self._step % self.ALIGN:
            return
        super()._boundary(mode)


# ------------------------------------------------------------------ overhead per rank
def overhead(a: argparse.Namespace, session: TPSession, res: ModeResult) -> None:
    """Interleaved bare/auto windows in every rank at once (bench/overhead/overhead.py's method): per
    rank, the median over blocks of auto's wall time per token over bare's."""
    mode = res.mode
    n = a.eager_window if mode == "eager" else a.compiled_window
    # a block holds one sampling period of auto (one traced burst), as in bench/overhead/overhead.py
    rounds = a.rounds or max(2, BURST * AUTO_SAMPLE_EVERY[mode] // n)
    rounds += rounds % 2
    blocks = a.eager_blocks if mode == "eager" else a.compiled_blocks
    plan = [("bare", a.warmup)] + [
        (c, n) for _ in range(blocks) for r in range(rounds)
        for c in (("bare", "auto") if r % 2 == 0 else ("auto", "bare"))] + [("auto", 0)]
    say(f"{session.model} TP={session.tp}: {mode} overhead windows, {blocks} block(s) of "
        f"{2 * rounds} × {n} tokens")
    ranks = session.ctl.ranks
    for c in ranks:
        c.call("hook", "start", plan)
    got: list = [None] * len(ranks)
    end = time.monotonic() + a.timeout
    while any(g is None for g in got):
        for r, c in enumerate(ranks):
            if got[r] is None:
                poll = c.call("hook", "poll")
                if poll["error"]:
                    raise RuntimeError(f"rank {r} overhead windows: {poll['error']}")
                if poll["done"]:
                    got[r] = poll["results"][1:]      # the warm-up window is not measured
        if time.monotonic() > end:
            raise RuntimeError("overhead windows did not finish in time")
        time.sleep(0.5)
    rows = []
    for r, ws in enumerate(got):
        for i, w in enumerate(ws):
            w.update(block=i // (2 * rounds), round=(i % (2 * rounds)) // 2, phase=f"rank {r}")
        for row in table(ws):
            if row["config"] == "auto":
                rows.append({"rank": r, "mode": mode, "ratio": row["block_ratio"],
                             "min": row["block_min"], "max": row["block_max"],
                             "pooled": row["pooled_ratio"], "tokens": row["tokens"],
                             "blocks": row["blocks"]})
    res.extra["overhead"] = rows


# ------------------------------------------------------------------ the live app
def screenshots(session: TPSession, out: Path, tag: str) -> None:
    """The live app over this very session of ranks (the UI process is this one): SVG
    screenshots of rank 0, rank 1 (``g``) and the all-ranks screen (``a``) at 200x50."""
    import asyncio

    try:
        from tuiprof.ui.app import make_app
    except ImportError as exc:  # Textual missing on this machine: the numbers still count
        say(f"screenshots skipped: {exc}")
        return
    app = make_app(session.ctl, title=f"tuiprof {session.model} TP={session.tp}",
                   export_dir=out, refresh_hz=4.0)

    async def run() -> None:
        async with app.run_test(size=(200, 50)) as pilot:
            await asyncio.sleep(6)               # panes filled, the findings worker has run
            app.save_screenshot(f"{tag}_rank0.svg", str(out))
            await pilot.press("g")
            await asyncio.sleep(3)
            app.save_screenshot(f"{tag}_rank1.svg", str(out))
            await pilot.press("a")
            await asyncio.sleep(3)
            app.save_screenshot(f"{tag}_all_ranks.svg", str(out))
            await pilot.press("escape")

    asyncio.run(run())
    say(f"screenshots {tag}_rank0/_rank1/_all_ranks.svg written")


# ------------------------------------------------------------------ the table
HEAD = ["model", "TP", "mode", "rank", "ms/step", "tok/s", "compute ms", "comm ms",
        "transfer ms", "wait ms", "idle ms", "NCCL", "overlap", "traced", "skew µs", "late",
        "TP eff", "alloc MiB", "overhead auto/bare"]


def reserved_mib(view) -> float | None:
    """The rank's caching-allocator reserved MiB at its last sampled token (None on CPU).
    Read on the engine thread with no device argument, so it is only non-zero on every rank
    when that thread's current device is the rank's own GPU (a rank on cuda:1 reading cuda:0's
    allocator would show 0 here)."""
    allocs = [t.alloc for t in view.tokens if t.alloc]
    return allocs[-1].get("reserved_bytes", 0) / 2**20 if allocs else None


def rows_of(runs: list[TPRun]) -> tuple[list[list], list[str]]:
    scale = {(r["model"], r["mode"], r["tp"]): r for r in scaling_rows(runs)}
    rows, notes = [], []
    for run in runs:
        for mode, res in run.modes.items():
            s = res.summary
            sc = scale.get((run.model, mode, run.tp), {})
            over = {o["rank"]: o for o in res.extra.get("overhead", [])}
            for k in s.ranks:
                o = over.get(k.rank)
                eff = (f"{sc['efficiency']:.0%} (×{sc['speedup']:.2f})"
                       if sc.get("efficiency") is not None and k.rank == 0 else "")
                rows.append([
                    run.model, run.tp, mode, k.rank, f"{k.step_ms:.2f}", f"{k.tokens_per_s:.0f}",
                    _f(k.compute_ms), _f(k.comm_ms), _f(k.transfer_ms), _f(k.wait_ms),
                    _f(k.idle_ms), _p(k.comm_share), _p(k.overlap_fraction), str(k.traced_steps),
                    f"{s.skew.end_median_us:.0f}" if s.skew and run.tp > 1 else "–",
                    _p(k.late_share) + (" *" if s.late_rank == k.rank else "")
                    if run.tp > 1 else "", eff,
                    _f(reserved_mib(res.ranks[k.rank]), 0),
                    f"{o['ratio']:.3f} ({o['min']:.3f}–{o['max']:.3f})" if o and o["ratio"] else ""])
            for f in res.findings:
                notes.append(f"{run.model} TP={run.tp} {mode}: {f.title} — {f.evidence}")
    return rows, notes


def _f(v, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def device_check(runs: list[TPRun]) -> list[str]:
    """Ranks whose allocator statistics are empty on CUDA: their engine thread's current
    device is not their GPU (torch.cuda.set_device is per thread)."""
    bad = []
    for run in runs:
        for mode, res in run.modes.items():
            for r in range(res.ranks.world_size):
                view = res.ranks[r]
                dev = str(view.meta.get("device", ""))
                mib = reserved_mib(view)
                if dev.startswith("cuda") and dev != f"cuda:{r}" and not (run.tp == 1 and dev == "cuda"):
                    bad.append(f"{run.model} TP={run.tp} {mode} rank {r}: engine on {dev}")
                elif dev.startswith("cuda") and not mib:
                    bad.append(f"{run.model} TP={run.tp} {mode} rank {r}: allocator statistics "
                               f"empty ({mib}): the engine thread is not on cuda:{r}")
    return bad


def _p(v) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"


def print_table(rows: list[list], notes: list[str], runs: list[TPRun]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(HEAD, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    print("\n" + line(HEAD))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    print("\nms/step: median host time per decode step over all tokens of the mode; compute / "
          "comm / transfer / wait / idle: means per step over the steps traced on every rank "
          "(CUPTI bursts; docs/multi-gpu.md defines them); NCCL: comm / step; late: share of "
          "the collective calls the rank started last (* the late rank); skew: median step-end "
          "skew across ranks; TP eff: "
          "speed-up over TP=1 / TP; alloc MiB: the caching allocator's reserved MiB read on the "
          "rank's engine thread (non-zero on every CUDA rank: that thread is on the rank's GPU); "
          "overhead: median of block ratios auto/bare (min–max).")
    for r in runs:
        comp = f", compile {r.compile_s:.0f} s" if r.compile_s is not None else ""
        print(f"{r.model} TP={r.tp}: load {r.load_s:.0f} s{comp}")
    for n in notes:
        print("finding: " + n)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="qwen3-0.6b,nanochat-d34")
    p.add_argument("--tp", default="1,2")
    p.add_argument("--compiled", action="append", default=None, metavar="MODEL=TPS",
                   help="where compiled mode is measured (default qwen3-0.6b=1,2 and "
                        "nanochat-d34=2; one compile per model per TP)")
    p.add_argument("--overhead-at", default="qwen3-0.6b=2", metavar="MODEL=TP[,MODEL=TP]",
                   help="session that also measures collection overhead per rank ('' = none)")
    p.add_argument("--screenshots-at", default="qwen3-0.6b=2", metavar="MODEL=TP",
                   help="session whose live app is screenshot into $OUT, in its last mode "
                        "('' = none)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--tiny", action="store_true", help="tiny models, short runs (CPU smoke run)")
    p.add_argument("--no-cupti", action="store_true")
    p.add_argument("--eager-tokens", type=int, default=192)
    p.add_argument("--compiled-tokens", type=int, default=256)
    p.add_argument("--cycle-tokens", type=int, default=1024)
    p.add_argument("--ring-tokens", type=int, default=1024)
    p.add_argument("--raw-tokens", type=int, default=16, help="traced steps per rank analysed")
    p.add_argument("--eager-window", type=int, default=32)
    p.add_argument("--compiled-window", type=int, default=128)
    p.add_argument("--eager-blocks", type=int, default=1)
    p.add_argument("--compiled-blocks", type=int, default=1)
    p.add_argument("--warmup", type=int, default=32)
    p.add_argument("--rounds", type=int, default=0,
                   help="bare/auto rounds per overhead block (default: one sampling period)")
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args(argv)
    compiled = a.compiled or ["qwen3-0.6b=1,2", "nanochat-d34=2"]
    if a.tiny:
        a.eager_tokens, a.compiled_tokens, a.cycle_tokens = 24, 24, 48
        a.ring_tokens, a.eager_window, a.compiled_window = 64, 4, 4
        a.eager_blocks = a.compiled_blocks = 1
        a.warmup, a.rounds = 4, 2
    rename = (lambda m: TINY.get(m, m)) if a.tiny else (lambda m: m)
    models = [rename(m) for m in a.models.split(",") if m]
    tps = [int(t) for t in a.tp.split(",")]
    want_compiled = {}
    for spec in compiled:
        m, _, ts = spec.partition("=")
        want_compiled[rename(m)] = {int(t) for t in ts.split(",") if t}
    overhead_at = set()
    for spec in filter(None, a.overhead_at.split(",")):
        om, _, ot = spec.partition("=")
        overhead_at.add((rename(om), int(ot)))
    sm, _, st = a.screenshots_at.partition("=")
    shots_at = (rename(sm), int(st)) if sm and os.environ.get("OUT") else None
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    runs: list[TPRun] = []
    failed = []
    for model in models:
        for tp in tps:
            modes = ["eager"] + (["compiled"] if tp in want_compiled.get(model, set()) else [])
            hook = "bench.verify.verify_tp:AlignedWindows" if (model, tp) in overhead_at else None
            session = TPSession(model, tp, device=a.device, dtype=a.dtype,
                                eager_tokens=a.eager_tokens, compiled_tokens=a.compiled_tokens,
                                cycle_tokens=a.cycle_tokens, ring_tokens=a.ring_tokens,
                                raw_tokens=a.raw_tokens, timeout=a.timeout,
                                cupti=not a.no_cupti, hook=hook, say=say)
            def on_mode(s: TPSession, res: ModeResult, modes=modes, model=model, tp=tp) -> None:
                if (model, tp) in overhead_at:
                    overhead(a, s, res)
                if shots_at == (model, tp) and res.mode == modes[-1]:
                    screenshots(s, out_dir, f"tuiprof_tp{tp}_{res.mode}")

            try:
                runs.append(session.run(modes, on_mode))
            except Exception as exc:  # one line, and the other sessions still run
                msg = " ".join(str(exc).split())[:300]
                say(f"{model} TP={tp} failed: {msg}")
                failed.append(f"{model} TP={tp}: {msg}")
            if out_dir is not None:  # after each session: a call cut short keeps what ran
                write_json(runs, failed, out_dir)
    rows, notes = rows_of(runs)
    print_table(rows, notes, runs)
    failed += device_check(runs)
    for f in failed:
        print(f"FAILED {f}")
    if out_dir is not None:
        write_outputs(runs, out_dir, min_tp=2)  # tp_scaling.csv + a snapshot per TP>1 session
        write_json(runs, failed, out_dir)
    return 1 if failed else 0


def write_json(runs: list, failed: list, out_dir: Path) -> None:
    rows, notes = rows_of(runs)
    doc = {"rows": [dict(zip(HEAD, row)) for row in rows], "findings": notes,
           "failed": failed, "scaling": scaling_rows(runs),
           "sessions": [{"model": r.model, "tp": r.tp, "load_s": r.load_s,
                         "compile_s": r.compile_s} for r in runs],
           "overhead": [o for r in runs for m in r.modes.values()
                        for o in m.extra.get("overhead", [])]}
    (out_dir / "verify_tp.json").write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    raise SystemExit(main())
