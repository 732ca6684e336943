"""llama.cpp against nsys, from what a device call of bench/llamacpp/device.sh brought back:
per kernel name (canonical form, see bench/verify/verify_native.py), counts and mean times of
tuiprof's snapshot (or the kernels file kept of it) against ``nsys stats --report
cuda_gpu_kern_sum``; and llama-bench's own tokens/s alone and under tuiprof from the logs.

    python3 bench/llamacpp/report.py KERNELS_OR_SNAPSHOT.json NSYS_KERN_SUM.csv [ALONE.log TUIPROF.log]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "verify"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import verify_native as vn  # noqa: E402


def kernels(path: Path) -> list:
    doc = json.loads(path.read_text())
    out = []
    for k in doc["kernels"]:
        if "stats" in k:
            out.append(k)
        else:   # the kernels file: count and total per (name, phase)
            out.append({"name": k["name"], "demangled": k["demangled"],
                        "stats": {"count": k["count"], "total": k["total_ns"]}})
    return out


def bench_rows(log: Path) -> dict:
    """llama-bench's JSON lines in a log: {"pp128": avg tok/s, "tg128": …}."""
    out = {}
    for line in log.read_text().splitlines():
        if '"avg_ts"' in line:
            d = json.loads(line[line.index("{"):])
            key = f"pp{d['n_prompt']}" if d["n_prompt"] else f"tg{d['n_gen']}"
            out[key] = {"avg_ts": d["avg_ts"], "samples_ts": d["samples_ts"]}
    return out


def main(argv: list[str]) -> int:
    res = vn.kernel_table(Path(argv[1]), kernels(Path(argv[0])))
    print(f"{'share':>7} {'tuiprof n':>9} {'nsys n':>9} {'tuiprof µs':>10} {'nsys µs':>9} {'ratio':>7}  kernel")
    for r in res["table"]:
        m = r["tuiprof_mean_ns"]
        n = r["nsys_mean_ns"]
        print(f"{r['share_of_gpu_time']:7.2%} {r['tuiprof_count']:9} {r['nsys_count']:9} "
              f"{(m or 0) / 1e3:10.3f} {(n or 0) / 1e3:9.3f} "
              f"{r['mean_ratio'] or 0:7.4f}  {vn.printable(r['kernel'], 80)}")
    big = [r for r in res["table"] if r["share_of_gpu_time"] >= 0.01]
    worst = max(big, key=lambda r: abs((r["mean_ratio"] or 0) - 1))
    print(f"kernels >= 1 % of GPU time: {len(big)}; worst mean ratio {worst['mean_ratio']:.4f} "
          f"({worst['kernel']}); counts differ: {res['count_differs'] or 'none'}; "
          f"on one side only: {res['missing'] or 'none'}")
    if len(argv) >= 4:
        alone, under = bench_rows(Path(argv[2])), bench_rows(Path(argv[3]))
        for key in alone:
            a, u = alone[key]["avg_ts"], under.get(key, {}).get("avg_ts")
            if u:
                print(f"{key}: alone {a:.1f} tok/s, under tuiprof {u:.1f} ({u / a:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
