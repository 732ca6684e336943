"""Print the findings and model-level roofline of snapshots as Markdown tables (GPU verification)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuiprof.analysis import (category_shares, find, mode_summaries, model_roofline,  # noqa: E402
                               top_kernels)
from tuiprof.export.snapshot import read_snapshot  # noqa: E402


def main(paths: list[str]) -> None:
    for p in paths:
        v = read_snapshot(p)
        print(f"\n### {Path(p).name}: {v.meta.get('model')} on {v.meta.get('device_name') or v.meta.get('gpu_name') or v.meta.get('device')}")
        print("\n| mode | decode tokens | tokens/s | ms/token median | p99 | kernels/token | GPU busy |")
        print("|---|---|---|---|---|---|---|")
        for mode, s in mode_summaries(v).items():
            print(f"| {mode} | {s.tokens} | {s.tokens_per_s:.1f} | {s.ms_median:.2f} | {s.ms_p99:.2f} | "
                  f"{s.kernels_per_token:.0f} | {100 * s.busy_fraction:.0f}% |")
        for mode in mode_summaries(v):
            r = model_roofline(v, mode=mode)
            if r is None:
                continue
            print(f"\nroofline ({mode}): {r.bytes['total'] / 1e9:.3f} GB/token, floor {r.floor_ms:.3f} ms "
                  f"({r.peaks_source} {r.bandwidth_Bps / 1e12:.2f} TB/s), measured {r.measured_ms:.3f} ms "
                  f"= {r.over_floor:.1f}x floor, GPU busy {r.busy_ms:.3f} ms = {r.busy_over_floor:.1f}x; "
                  f"achieved {100 * r.achieved_frac:.1f}% of peak bandwidth "
                  f"({100 * r.busy_achieved_frac:.1f}% while busy)")
            sh = category_shares(v, mode=mode)
            print("shares: " + ", ".join(f"{k} {100 * x.share:.0f}%" for k, x in
                                          sorted(sh.items(), key=lambda kv: -kv[1].share)))
        for mode in mode_summaries(v):
            print(f"\ntop decode kernels ({mode}):")
            for k in top_kernels(v, mode=mode, n=10):
                print(f"  {k.info.short[:48]:48s} {k.info.library:14s} {k.info.category:24s} "
                      f"{100 * k.share:5.1f}%  {k.launches:7d} launches  {k.mean_us:8.2f} us")
        print("\n| rank | finding | severity | impact ms/token | evidence |")
        print("|---|---|---|---|---|")
        for i, f in enumerate(find(v), 1):
            imp = f"{f.impact_ms_per_token:.2f}" if f.impact_ms_per_token is not None else "-"
            print(f"| {i} | {f.title} | {f.severity} | {imp} | {f.evidence[:160]} |")
        print(f"\ncounters: {v.counters}; collectors: "
              f"{ {k: c['message'] for k, c in v.collectors.items()} }; overhead estimate: {v.overhead}")


if __name__ == "__main__":
    main(sys.argv[1:])
