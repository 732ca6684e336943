"""--measure-peaks: measured copy bandwidth and matmul rate replace the GPU table's peaks."""
from __future__ import annotations

import json
import subprocess
import sys

from tuiprof.analysis import gpu_spec
from tuiprof.collect.peaks import measure_peaks


def test_measure_peaks_on_this_cpu():
    p = measure_peaks("cpu", copy_mib=16, n=256, repeats=3)
    assert 1e8 < p["bandwidth_Bps"] < 1e13      # a CPU copies between 0.1 GB/s and 10 TB/s
    assert 1e7 < p["bf16_flops"] < 1e14
    spec = gpu_spec({"device_name": "NVIDIA H100 80GB HBM3", "measured_peaks": p})
    assert spec.source == "measured" and spec.bandwidth_Bps == p["bandwidth_Bps"]


def test_headless_run_records_measured_peaks(tmp_path):
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "tuiprof", "--model", "qwen3-tiny", "--headless",
                        "--max-new-tokens", "3", "--measure-peaks", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-500:]
    meta = json.loads(out.read_text())["meta"]
    assert meta["measured_peaks"]["bandwidth_Bps"] > 0 and meta["measured_peaks"]["bf16_flops"] > 0
