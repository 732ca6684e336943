"""A headless run samples kernels as the live app does (bursts), keeping every step's time;
``--sample-every 1`` asks for every step traced. A step time measured while traced is told
apart wherever it is shown: the summary line, the snapshot's summary, the latency pane."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tracing_data import traced_store

from tuiprof.cli.common import step_times
from tuiprof.export.summary import summary
from tuiprof.sampling import AUTO_SAMPLE_EVERY, tracing_policy

REPO = Path(__file__).resolve().parents[2]


def _headless(tmp_path: Path, *extra: str) -> tuple[dict, str]:
    import os
    out = tmp_path / "s.json"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "tuiprof", "run", "--model", "qwen3-tiny",
                           "--device", "cpu", "--headless", "--no-nvml", "--max-new-tokens", "4",
                           "--json", str(out), *extra], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text()), proc.stdout


def test_headless_samples_as_the_live_app_by_default(tmp_path):
    doc, stdout = _headless(tmp_path)
    assert doc["meta"]["sample_every"] == AUTO_SAMPLE_EVERY["eager"]
    assert doc["meta"]["tracing"] == "bursts of 4 steps in every 256 traced (the default, as the live app)"
    assert "tracing: " in stdout
    # every step's time is kept: 4 tokens, one prefill and three decode steps
    assert sum(1 for t in doc["tokens"] if t["phase"] == "decode") == 3
    # the self-report counts the session's step hooks on the decoding thread, and says what
    # it does not count
    ov = doc["overhead"]
    parts = ("threads_s", "callback_s", "hooks_s", "switch_s", "tracing_s", "rerecord_s")
    assert ov["hooks_s"] > 0 and ov["threads_s"] >= 0, ov   # no session thread may run here
    # the figure is its parts over the wall time (each rounded in the snapshot)
    assert abs(ov["pct"] - 100 * sum(ov[k] for k in parts) / ov["wall_s"]) < 0.05 + \
        100 * 1e-3 * len(parts) / ov["wall_s"], ov
    assert "hooks" in ov["method"] and "not counted: GIL handoffs" in ov["method"]


def test_sample_every_1_asks_for_every_step_traced(tmp_path):
    doc, _ = _headless(tmp_path, "--sample-every", "1")
    assert doc["meta"]["sample_every"] == 1
    assert doc["meta"]["tracing"].startswith("every step traced (a traced step ran x1.62 eager")
    # what it costs a server, stated where the user reads the policy
    assert "a transformers server's throughput 0.77-0.82 of bare on an H200" in doc["meta"]["tracing"]


def test_the_policy_in_words():
    assert tracing_policy("live", 64) == tracing_policy("auto", 64)
    assert tracing_policy("8", 8) == "bursts of 4 steps in every 32 traced (--sample-every 8)"
    assert tracing_policy(1, 1).startswith("every step traced (")


def test_the_summary_tells_traced_step_times_from_untraced_ones():
    view = traced_store().view(raw=False)
    line = step_times([t for t in view.tokens if t.phase == "decode"])
    # the store keeps the last 16 rows: 3 traced, the lead (on neither side), 12 untraced
    assert line.startswith("median 2.74 ms/step untraced, 3.20 traced ("), line
    mode = summary(view)["modes"]["compiled"]
    assert mode["traced_steps"] == 4 and mode["untraced_steps"] == 48
    assert mode["traced_ms_per_step_median"] == 3.2
    every = traced_store(untraced=0, after=0).view(raw=False)
    line = step_times([t for t in every.tokens if t.attached])
    assert line == "median 3.20 ms/step, every step measured while traced", line


def test_the_latency_pane_marks_a_traced_last_step():
    from tests.ui.test_figures import _run  # noqa: PLC0415 - the UI's own harness

    store = traced_store(after=0)

    async def body(app, pilot):
        footer = str(app.query_one("#latency-summary").render())
        assert "host 3.20 ms/step (traced)" in footer, footer
    _run(store, (200, 50), body)
