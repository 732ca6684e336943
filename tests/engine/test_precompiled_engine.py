"""`c` across sessions with compiled steps kept (:mod:`tuiprof.engine.precompiled`): real
sessions in processes of their own, qwen3-tiny on the CPU, a real helper process. The first
session's helper compiles and then saves the step; the second session loads it (no dynamo trace,
no inductor cache lookup) and its compiled step gives the first one's numbers; a corrupt file
costs one line and a fresh compile, which saves it again."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _scenario(cache_root: Path) -> dict:
    env = dict(os.environ, TUIPROF_INDUCTOR_CACHE=str(cache_root), TUIPROF_COMPILE_HELPER="on",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TUIPROF_PRECOMPILE"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, str(HERE / "precompile_scenario.py"), "1"], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_cold_saves_warm_loads_corrupt_compiles_afresh(tmp_path):
    cold = _scenario(tmp_path)
    assert cold["mode"] == "compiled" and cold["error"] is None and cold["notes"] == [], cold
    assert cold["saved_step"] == "" and "in a helper process" in cold["message"]
    assert cold["cache_hits"]["fxgraph_hit"] >= 1          # the helper's kernels, as before
    assert cold["helper_lines"][-2:] == [cold["helper_lines"][-2], "finished"]
    assert cold["helper_lines"][0].startswith("saved b1 "), cold["helper_lines"]
    assert len(cold["files"]) == 1 and cold["files"][0].startswith("b1-")

    warm = _scenario(tmp_path)
    assert warm["mode"] == "compiled" and warm["error"] is None and warm["notes"] == [], warm
    assert warm["saved_step"] == "loaded" and "saved step loaded" in warm["message"]
    assert warm["graphs"] == ["b1"]
    assert warm["cache_hits"]["fxgraph_hit"] == warm["cache_hits"]["fxgraph_miss"] == 0
    assert warm["logits_sum"] == cold["logits_sum"]        # the fresh compile's numbers
    assert warm["max_diff_vs_eager"] < 1e-4

    saved = Path(warm["cache"]) / "precompiled" / warm["files"][0]
    saved.write_bytes(saved.read_bytes()[:4096])           # cut short
    again = _scenario(tmp_path)
    assert again["mode"] == "compiled" and again["error"] is None, again
    assert len(again["notes"]) == 1 and "\n" not in again["notes"][0]
    assert again["notes"][0].startswith("saved compiled step unusable (")
    assert again["notes"][0].endswith("compiling afresh")
    assert again["saved_step"] == "saved"                  # no helper for a warm cache: here
    assert again["logits_sum"] == cold["logits_sum"]
    assert saved.stat().st_size > 4096                     # whole again
