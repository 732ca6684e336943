#!/usr/bin/env bash
# The program path's overhead in one process, pooled over several device calls on one warm
# machine (issues 36, 40, 43): each call runs bench/overhead/overhead_program_windows.py compiled
# then eager (~8.5 min on the H100; carry .whl). From the repository root:
#
#   bash bench/verify/overhead_pool.sh N [--alloc]   # N names this call's files: windows_{c,e}_N.*
#
# --alloc first times the allocator read (torch.cuda.memory_stats against the nested dict that
# tuiprof reads) and runs the GPU test that compares the two.
set -u
cd "$(dirname "$0")/../.."
. bench/verify/gpu_setup.sh
N=${1:-1}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${2:-}" = --alloc ]; then
  python3 - <<'PY' 2>&1 | tee "$OUT/alloc_read_$N.txt"
import statistics, time, torch
from tuiprof.collect.allocator import read_allocator_stats
keep = [torch.empty(n << 20, device="cuda", dtype=torch.uint8) for n in range(1, 64)]
def t(fn, n=2000):
    out = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        out.append((time.perf_counter_ns() - t0) / n / 1e3)
    return statistics.median(out)
a, b = t(torch.cuda.memory_stats), t(read_allocator_stats)
print(f"torch.cuda.memory_stats {a:.1f} us a call; read_allocator_stats (nested) {b:.1f} us; "
      f"ratio {b / a:.3f} (median of 5 x 2000 calls, warm)")
PY
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_collect_gpu.py \
    -k allocator 2>&1 | tail -3 | tee -a "$OUT/alloc_read_$N.txt"
fi
timeout 250 python3 bench/overhead/overhead_program_windows.py --mode compiled --blocks 10 \
  --deadline 175 --json "$OUT/windows_c_$N.json" >"$OUT/windows_c_$N.txt" 2>&1
tail -5 "$OUT/windows_c_$N.txt"
timeout 260 python3 bench/overhead/overhead_program_windows.py --mode eager --blocks 14 \
  --deadline 190 --json "$OUT/windows_e_$N.json" >"$OUT/windows_e_$N.txt" 2>&1
tail -5 "$OUT/windows_e_$N.txt"
