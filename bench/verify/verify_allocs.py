"""GPU check: what CUPTI's memory records are, and the compiled per-token footer.

Runs two short headless sessions through the real CLI, Profiler and CUPTI (each in its own
process, as ``tuiprof run --headless`` runs them): eager, then compiled. Prints
(1) per session and phase: true device cudaMalloc/cudaFree from CUPTI's memory records, the
    rest counted and explained by class, next to torch.cuda.memory_stats()'s
    num_device_alloc/num_device_free deltas (the caching allocator's real cudaMalloc/cudaFree)
    and the memory records whose API record matched by correlation id;
(2) the compiled session's per-token footer figures (token, phase, kernels, busy %), taken as
    the latency pane takes them (ui.derive.latest_traced).
Details (every class, the snapshots) go to $OUT when set. ``--tiny --device cpu`` runs the same
path with a tiny model on a CPU (no CUPTI there: it says so).

    python bench/verify/verify_allocs.py                       # H100: ~2.5 min (2 loads, 1 compile)
    python bench/verify/verify_allocs.py --tiny --device cpu   # CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tuiprof.analysis.allocs import memory_summary, rest_explained  # noqa: E402
from tuiprof.export.snapshot import read_snapshot  # noqa: E402
from tuiprof.store.alloc_classes import API_UNKNOWN, split_key  # noqa: E402
from tuiprof.ui.derive import busy_fraction, latest_traced  # noqa: E402

MEMORY_APIS = ("cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaHostAlloc",
               "cudaMallocHost", "cudaFreeHost", "cudaMallocFromPoolAsync", "cuMemAlloc",
               "cuMemFree", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemHostAlloc",
               "cuMemAllocHost", "cuMemFreeHost", "cuMemCreate", "cuMemRelease",
               "cuMemAllocFromPoolAsync")


def run_session(mode: str, args, out: Path) -> tuple[object, float]:
    path = out / f"verify_allocs_{mode}.json"
    cmd = [sys.executable, "-m", "tuiprof", "run", "--headless", "--no-loop", "--model", args.model,
           "--mode", mode, "--max-new-tokens", str(args.tokens), "--json", str(path)]
    if args.device:
        cmd += ["--device", args.device]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    (out / f"verify_allocs_{mode}.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0 or not path.exists():
        sys.exit(f"verify_allocs: the {mode} session failed (rc {res.returncode}): "
                 f"{(res.stderr or res.stdout).strip().splitlines()[-1:]}")
    return read_snapshot(path), time.monotonic() - t0


def allocator_deltas(view) -> dict[str, list[int]]:
    """num_device_alloc/num_device_free increases per phase key, from per-token readings."""
    out: dict[str, list[int]] = {}
    prev = None
    for r in view.tokens:
        a = r.alloc or {}
        if "num_device_alloc" not in a:
            continue
        cur = (a["num_device_alloc"], a.get("num_device_free", 0))
        key = f"{r.phase}/{r.mode}" if prev is not None else "startup+first token"
        base = prev or (0, 0)
        d = out.setdefault(key, [0, 0])
        d[0] += cur[0] - base[0]
        d[1] += cur[1] - base[1]
        prev = cur
    return out


def api_matched(view) -> dict[str, int]:
    """Memory records per phase whose API record matched by correlation id."""
    out: dict[str, int] = {}
    for key, c in view.allocs.get("classes", {}).items():
        phase, _, _, api = split_key(key)
        if api != API_UNKNOWN:
            out[phase] = out.get(phase, 0) + c["mallocs"] + c["frees"]
    return out


def table_allocs(mode: str, view, lines: list[str]) -> None:
    cupti = view.collectors.get("cupti", {})
    if not cupti.get("ok", False):
        lines.append(f"  {mode}: {cupti.get('message') or 'no CUPTI'} -> no memory records, "
                     "allocator deltas only")
    m = memory_summary(view.allocs)
    torch_d = allocator_deltas(view)
    matched = api_matched(view)
    phases = sorted(set(m.device) | {split_key(k)[0] for k in view.allocs.get("classes", {})}
                    | set(torch_d), key=lambda k: (k != "startup", k))
    lines.append(f"  {'session/phase':<28}{'dev malloc/free':>16}{'dev bytes':>11}"
                 f"{'other recs':>11}{'other bytes':>12}{'torch malloc/free':>18}{'API-matched':>12}")
    for ph in phases:
        dev = m.device.get(ph, {"mallocs": 0, "frees": 0, "malloc_bytes": 0})
        rest = [c for c in m.rest if c.phase == ph]
        td = torch_d.get(ph)
        lines.append(f"  {mode + ' ' + ph:<28}{dev['mallocs']:>8,} / {dev['frees']:<5,}"
                     f"{_mib(dev['malloc_bytes']):>11}{sum(c.mallocs + c.frees for c in rest):>11,}"
                     f"{_mib(sum(c.malloc_bytes for c in rest)):>12}"
                     f"{(f'{td[0]:,} / {td[1]:,}' if td else '–'):>18}{matched.get(ph, 0):>12,}")
    lines.append(f"    rest: {rest_explained(m, lambda n: f'{n:,}')}")
    for c in m.rest[:6]:
        lines.append(f"    {c.phase:<18}{c.kind:<20}{c.library:<14}{c.api:<22}"
                     f"{c.mallocs + c.frees:>7,}{_mib(c.malloc_bytes):>11}")
    apis = {k: v.count for k, v in view.api.items() if k in MEMORY_APIS and v.count}
    lines.append(f"    memory API records: {apis or 'none'}")


def table_footer(view, lines: list[str]) -> None:
    last = next((r for r in reversed(view.tokens) if r.done), None)
    if last is None:
        lines.append("  no token")
        return
    k = latest_traced(view, last.phase, last.mode)
    pre = next((r for r in reversed(view.tokens) if r.done and r.phase == "prefill"), None)
    lines.append(f"  latest token #{last.seq} {last.phase}/{last.mode}: host {last.host_ms:.2f} ms")
    if k is None:
        lines.append("  kernel figures: no traced token of this phase and mode")
    else:
        busy = "–" if k.busy_pct is None else f"{k.busy_pct:.1f}%"  # already a percentage
        lines.append(f"  kernel figures from traced #{k.seq} {k.phase}/{k.mode}: "
                     f"{k.kernels:,} kernels, kernel-busy {busy}")
    if pre is not None:
        b = busy_fraction(pre)
        lines.append(f"  (latest prefill #{pre.seq} {pre.phase}/{pre.mode}: {pre.kernels:,} kernels,"
                     f" busy {'–' if b is None else f'{b:.1f}%'}: not used for decode)")


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="qwen3-tiny (CPU smoke run)")
    p.add_argument("--device", help="cuda or cpu (default: the CLI's)")
    p.add_argument("--tokens", type=int, default=None, help="new tokens per session")
    p.add_argument("--timeout", type=int, default=240, help="seconds per session")
    args = p.parse_args()
    args.model = "qwen3-tiny" if args.tiny else "qwen3-0.6b"
    args.tokens = args.tokens or (8 if args.tiny else 48)
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="verify_allocs_"))
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"verify_allocs: {args.model}, {args.tokens} new tokens per session, headless, "
             "every token traced"]
    views = {}
    for mode in ("eager", "compiled"):
        views[mode], secs = run_session(mode, args, out)
        lines.append(f"  {mode} session: {secs:.0f} s, device {views[mode].meta.get('device')}")
    lines.append("(1) CUPTI memory records per phase: device cudaMalloc (device, sync, no pool) vs "
                 "the rest; torch = caching allocator's num_device_alloc/free deltas")
    for mode, view in views.items():
        table_allocs(mode, view, lines)
    lines.append("(2) compiled per-token footer (as the latency pane takes it)")
    table_footer(views["compiled"], lines)
    text = "\n".join(lines)
    print(text)
    (out / "verify_allocs.txt").write_text(text + "\n")
    classes = {m: v.allocs.get("classes", {}) for m, v in views.items()}
    (out / "verify_allocs_classes.json").write_text(json.dumps(classes, indent=1))


if __name__ == "__main__":
    main()
