"""Batched decode on the GPU in one call: batch sweeps, the knee, and collection overhead at batch 32.

1. ``tuiprof sweep --batches`` (the live engine; decode only): qwen3-0.6b and nanochat-d34,
   batches 1 … 256, eager and compiled; per cell tokens/s, ms/step, MBU, MFU, the bound and the
   busy share; per model and mode the knee measured beside the one predicted from the matmul
   shapes. Compiled cells share one dynamic-batch compile per model for every batch >= 2; batch
   1 would need a static compile of its own (45–60 s on the H100), so compiled batch 1 is left
   out unless ``--full`` (its figure is in docs/results.md#batch).
2. Collection overhead at ``--overhead-batch`` (32) on qwen3-0.6b, eager and compiled, with the
   interleaved method of ``bench/overhead/overhead.py`` (bare vs auto in alternating windows, one
   sampling period per block), on the model the sweep loaded and compiled: no second load, no
   second compile. Targets: <= 5 % eager, <= 3 % compiled.

Prints one table; with ``$OUT`` set, writes the sweeps (CSV, JSON, Markdown with the chart),
the overhead windows and a log there (5 files). The overhead engine decodes cycles of the
sweep's short cache (~40 steps), so a prefill (always traced in ``auto``) comes every ~40 steps
instead of every 256: the ratios are an upper bound. On the H100 (estimated from the costs in
shared/device/README.md: load ~20 s, a compile 45–70 s, eager ~50 ms and compiled ~3–5 ms
per step): ~6 minutes.

    python bench/verify/verify_batch.py                     # H100
    python bench/verify/verify_batch.py --device cpu --tiny # the same code path on a CPU, ~2 min
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.overhead import overhead  # noqa: E402

from tuiprof.engine.generate import Engine  # noqa: E402
from tuiprof.engine.load import engine_info, prompt_ids  # noqa: E402
from tuiprof.sweep.batch_sweep import BatchCell, run_batch_sweep  # noqa: E402

FULL = {"models": "qwen3-0.6b,nanochat-d34", "batches": "1,2,4,8,16,32,64,128,256",
        "warmup": 8, "iters": 24, "overhead_batch": 32, "eager_blocks": 3, "compiled_blocks": 1}
TINY = {"models": "qwen3-tiny,nanochat-tiny", "batches": "1,2,4,8", "warmup": 1, "iters": 3,
        "overhead_batch": 4, "eager_blocks": 1, "compiled_blocks": 1}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None)
    p.add_argument("--tiny", action="store_true", help="tiny models, few steps (CPU check)")
    p.add_argument("--full", action="store_true", help="also compiled batch 1 (a second compile)")
    p.add_argument("--models", default=None)
    p.add_argument("--batches", default=None)
    p.add_argument("--no-overhead", action="store_true")
    a = p.parse_args(argv)
    plan = dict(TINY if a.tiny else FULL)
    models = (a.models or plan["models"]).split(",")
    batches = [int(b) for b in (a.batches or plan["batches"]).split(",")]
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    log_lines: list[str] = []
    t_start = time.monotonic()

    def say(text: str) -> None:
        line = f"[{time.monotonic() - t_start:6.1f} s] {text}"
        log_lines.append(line)
        print(line, flush=True)

    def skip(cell: BatchCell) -> str | None:
        if cell.mode == "compiled" and cell.batch == 1 and not a.full:
            return "compiled batch 1 needs a static compile of its own: left out (--full)"
        return None

    overhead_rows: list[dict] = []
    phase_s: dict[str, float] = {}

    def after_model(name: str, loaded) -> None:
        if a.no_overhead or name != models[0]:
            return
        t0 = time.monotonic()
        overhead_rows.extend(_overhead(loaded, plan, a.device, say, out_dir))
        phase_s[f"overhead {name}"] = time.monotonic() - t0

    sweeps = []
    for model in models:
        t0 = time.monotonic()
        sweeps.append(run_batch_sweep([model], batches, ("eager", "compiled"), device=a.device,
                                      warmup=plan["warmup"], iters=plan["iters"], skip=skip,
                                      progress=say, after_model=after_model))
        phase_s[f"sweep {model}"] = time.monotonic() - t0 - phase_s.get(f"overhead {model}", 0)
        if out_dir is not None:
            sweeps[-1].write(out_dir / f"sweep-{model}")
    _print_table(sweeps, overhead_rows, phase_s, time.monotonic() - t_start)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "verify_batch.log").write_text("\n".join(log_lines) + "\n")
    failed = [r for s in sweeps for r in s.cells if r.status == "error"]
    return 1 if failed else 0


def _overhead(loaded, plan: dict, device: str | None, say, out_dir: Path | None) -> list[dict]:
    """bench/overhead/overhead.py's interleaved windows at the overhead batch, on ``loaded``."""
    batch = plan["overhead_batch"]
    ids, desc = prompt_ids(loaded, None, 16, 0, batch)
    info = engine_info(loaded)
    info.update(prompt=desc, prompt_tokens=int(ids.shape[1]), batch=batch, max_batch=batch)
    cycle = loaded.adapter.max_len - ids.shape[1]

    def factory(clock=None, **_):
        return Engine(loaded.adapter, ids, device=loaded.device, max_new_tokens=None, loop=True,
                      clock=clock, info=info, max_batch=batch)

    args = argparse.Namespace(
        model=loaded.source.name, device=device, modes="eager,compiled", blocks=1,
        mode_blocks={"eager": plan["eager_blocks"], "compiled": plan["compiled_blocks"]},
        eager_tokens=32, compiled_tokens=128, warmup=16, cycle_tokens=cycle, batch=batch)
    out: dict = {"windows": []}
    say(f"overhead {loaded.source.name} batch {batch}: {plan['eager_blocks']} eager and "
        f"{plan['compiled_blocks']} compiled block(s); cycles of {cycle} steps (the sweep's cache)")
    overhead.run_phase(args, ["bare", "auto"], True, out, factory=factory)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"overhead-b{batch}.json").write_text(json.dumps(out, indent=1, default=str))
    return [dict(r, batch=batch) for r in overhead.table(out["windows"])]


def _print_table(sweeps, overhead_rows, phase_s, total_s) -> None:
    print("\n## Batch sweep (decode; tokens/s counts every sequence)\n")
    print("| model | mode | batch | tokens/s | ms/step | MBU | MFU | bound | GPU busy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in sweeps:
        for r in s.cells:
            c, m = r.cell, r.summary
            if m is None:
                print(f"| {c.model} | {c.mode} | {c.batch} | {r.status.upper()} | | | | "
                      f"{(r.error or '')[:50]} | |")
                continue
            busy = "–" if m.busy is None else f"{m.busy:.0%}"
            print(f"| {c.model} | {c.mode} | {c.batch} | {m.tok_s:,.0f} | {m.ms_step:.2f} | "
                  f"{m.mbu:.1%} | {m.mfu:.1%} | {m.klass} | {busy} |")
    print("\n## Knee: predicted from the matmul shapes vs measured (< 25 % tokens/s per doubling)\n")
    print("| model | mode | predicted | measured | peaks |")
    print("|---|---|---|---|---|")
    for s in sweeps:
        for k in s.knees():
            pred = f"≈{k['predicted']:.0f}" if k["predicted"] else "not reached"
            meas = (f"past {k['measured']} ({k['gain'] - 1:+.0%}/doubling)" if k["measured"]
                    else (f"still scaling at {k['largest']}" if k["largest"] else "–"))
            print(f"| {k['model']} | {k['mode']} | {pred} | {meas} | {s.spec.name} ({s.spec.source}) |")
    if overhead_rows:
        print("\n## Collection overhead (bench/overhead/overhead.py method; ratio = auto / bare wall time)\n")
        print("| mode | batch | ms/step bare | ms/step auto | ratio (median of blocks) | blocks × steps | target |")
        print("|---|---|---|---|---|---|---|")
        by = {(r["mode"], r["config"]): r for r in overhead_rows}
        for mode, target in (("eager", 1.05), ("compiled", 1.03)):
            bare, auto = by.get((mode, "bare")), by.get((mode, "auto"))
            if not bare or not auto:
                continue
            ratio = auto["block_ratio"]
            print(f"| {mode} | {auto['batch']} | {bare['ms_per_token']:.3f} | {auto['ms_per_token']:.3f} "
                  f"| {ratio:.3f} ({auto['block_min']:.3f}–{auto['block_max']:.3f}) | "
                  f"{auto['blocks']} × {auto['tokens'] // max(1, auto['blocks'])} | "
                  f"<= {target:.2f}: {'met' if ratio <= target else 'NOT met'} |")
    print("\n## Time\n")
    for what, secs in phase_s.items():
        print(f"- {what}: {secs:.0f} s")
    print(f"- total: {total_s:.0f} s")


if __name__ == "__main__":
    raise SystemExit(main())
