"""First token, before and after the start-up changes, interleaved in one call.

Headless one-token runs (``python -m tuiprof --model M --headless --max-new-tokens 1``) of
this tree, each way of ``TUIPROF_IMPORTS`` (tuiprof/engine/imports.py) in turn: ``none`` is the
start-up as it was (plain ``from transformers import Qwen3ForCausalLM``, CUDA initialised on the
loading thread, no warm-up); ``all`` is the default now; the single ways between say what each
is worth. Rounds rotate the order. The session's own phases come from the snapshot's
``meta["startup"]``; the table gives medians of the first token and of each phase.

    python bench/verify/startup_ab.py --rounds 3            # H100: about 5 minutes
    python bench/verify/startup_ab.py --tiny --rounds 2     # the same code path on a CPU
    python bench/verify/startup_ab.py --ways 'none+nopyc;all+nopyc;all'   # with the bytecode tree

Writes ``$OUT/startup_ab.json`` and ``$OUT/startup_ab.txt`` when OUT is set.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verify_startup import HERE, headless, warm_up  # noqa: E402

QWEN_WAYS = ("none", "hide", "hide,direct,cuda-thread", "all")
TORCH_ONLY_WAYS = ("none", "all")   # nanochat imports no transformers: only the CUDA ways count
PHASES = ("importing torch", "CUDA init", "CUDA context", "warming cuBLAS",
          "importing model code", "building model", "prefill")


def ways_of(model: str, chosen: str | None) -> tuple[str, ...]:
    if chosen:
        return tuple(w.strip() for w in chosen.split(";") if w.strip())
    return QWEN_WAYS if model.startswith("qwen3") else TORCH_ONLY_WAYS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="default qwen3-0.6b,nanochat-d34 (--tiny: the tiny ones)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--ways", help="';'-separated TUIPROF_IMPORTS ways, for every model; a way "
                    "ending in '+nopyc' runs with TUIPROF_PYCACHE=off (no bytecode tree of "
                    "tuiprof's own: tuiprof/engine/bytecode.py)")
    args = ap.parse_args()
    if args.tiny:
        args.device = args.device or "cpu"
    models = (args.models or ("qwen3-tiny,nanochat-tiny" if args.tiny
                              else "qwen3-0.6b,nanochat-d34")).split(",")
    run_log: list[str] = []
    warm_s = warm_up({"after": HERE}, run_log)
    # the first start with tuiprof's bytecode tree fills it (where the install has none):
    # its first token is what the very first session on a machine waits
    os.environ.pop("TUIPROF_PYCACHE", None)
    with tempfile.TemporaryDirectory(prefix="tuiprof-ab-") as tmp:
        fill = headless(HERE, models[0], args.device, Path(tmp), args.timeout, run_log)
    print(f"first start (fills the bytecode tree where one is kept): "
          f"{(fill.get('startup') or {}).get('first_token_s')} s to the first token", flush=True)
    runs: list[dict] = []
    t_all = time.monotonic()
    for r in range(args.rounds):
        for model in models:
            ways = list(ways_of(model, args.ways))
            k = r % len(ways)
            for way in ways[k:] + ways[:k]:
                os.environ["TUIPROF_IMPORTS"] = way.split("+")[0]
                if way.endswith("+nopyc"):
                    os.environ["TUIPROF_PYCACHE"] = "off"
                else:
                    os.environ.pop("TUIPROF_PYCACHE", None)
                print(f"round {r + 1} {model} TUIPROF_IMPORTS={way}", flush=True)
                with tempfile.TemporaryDirectory(prefix="tuiprof-ab-") as tmp:
                    res = headless(HERE, model, args.device, Path(tmp), args.timeout, run_log)
                runs.append({"round": r + 1, "model": model, "way": way, **res})
    os.environ.pop("TUIPROF_IMPORTS", None)
    os.environ.pop("TUIPROF_PYCACHE", None)
    lines = [f"warm-up {warm_s:.1f} s; {args.rounds} rounds; device "
             f"{next((x.get('device_name') for x in runs if x.get('device_name')), '?')}",
             "| model | TUIPROF_IMPORTS | first token s (median, min–max) | exit s | "
             + " | ".join(PHASES) + " |",
             "|---|---|---|---|" + "---|" * len(PHASES)]
    for model in models:
        for way in ways_of(model, args.ways):
            mine = [x for x in runs if x["model"] == model and x["way"] == way]
            ft = [x["startup"]["first_token_s"] for x in mine
                  if (x.get("startup") or {}).get("first_token_s") is not None]
            ex = [x["exit_s"] for x in mine]
            cells = []
            for ph in PHASES:
                secs = [p["seconds"] for x in mine for p in (x.get("startup") or {}).get("phases", [])
                        if p["name"] == ph and p.get("seconds") is not None]
                cells.append(f"{statistics.median(secs):.2f}" if secs else "–")
            head = (f"{statistics.median(ft):.2f} ({min(ft):.2f}–{max(ft):.2f})" if ft else "–")
            lines.append(f"| {model} | {way} | {head} | "
                         f"{statistics.median(ex):.1f} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print("\n" + text + f"\n(total {time.monotonic() - t_all:.0f} s)")
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "startup_ab.json").write_text(json.dumps(runs, indent=1))
        (out / "startup_ab.txt").write_text("\n".join(run_log) + "\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
