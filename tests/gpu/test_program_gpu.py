"""`tuiprof run` on a user's compiled generate() script on a real GPU (skipped without CUDA).

A program's compiled mode switches CUPTI's API kinds off between bursts and on one token
before each (``ProfilerOptions.compiled_api_kinds_stay_on=False``): its own ops around the CUDA
graphs make hundreds of API calls a step. Switched on together with the device kinds, the API
kinds once left CUDA-graph kernels with wrong durations (docs/performance.md), so the traced
steps of many bursts must carry the whole graph with plausible kernel durations. And a
program's many short generate() calls get one traced prefill per sampling period, not one each.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compiled_program(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("program")
    out = work / "snap.json"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "tuiprof", "run", "--headless", "--sample-every", "8",
           "--json", str(out), "--", "python", str(REPO / "bench" / "programs" / "hf_qwen.py"),
           "--mode", "compiled", "--new-tokens", "129", "--repeats", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, cwd=work, env=env)
    assert out.exists(), proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_program_compiled_bursts_keep_valid_kernel_records(compiled_program):
    doc = compiled_program
    assert doc["meta"]["program"]["exit_status"] == 0
    dec = [t for t in doc["tokens"] if t["done"] and t["phase"] == "decode"
           and t["mode"] == "compiled"]
    traced = [t for t in dec if t["sampled"]]
    assert len(traced) >= 8, len(traced)
    assert all(not t["kernels"] for t in dec if not t["sampled"])
    graph = [t["graph_kernels"] for t in traced]
    # every traced step carries the whole CUDA graph (the same kernels each replay)
    assert min(graph) > 100 and statistics.median(graph) == max(graph), graph
    nvjet = {k["name"]: k["stats"]["total"] / k["stats"]["count"] for k in doc["kernels"]
             if k["phase"] == "decode" and k["mode"] == "compiled" and "nvjet" in k["name"]
             and k["stats"]["count"]}
    print("graph kernels per traced step", sorted(set(graph)), "nvjet means (ns):",
          sorted(round(m) for m in nvjet.values()))
    # qwen3-0.6b's GEMVs run ~4-6 µs, its LM head ~110 µs (wrong records read ~240 µs for all)
    assert nvjet and all(1_000 < m < 200_000 for m in nvjet.values()), nvjet
    assert statistics.median(nvjet.values()) < 50_000, nvjet


def test_every_program_step_has_its_gpu_time_traced_or_not(compiled_program):
    """A generate() program's steps get CUDA-event times as the engine's do (read a step or
    two later, never waited for): every step, traced or untraced, and the traced steps'
    against the untraced median is the snapshot's tracing cost."""
    doc = compiled_program
    steps = [t for t in doc["tokens"] if t["done"] and t["phase"] in ("prefill", "decode")]
    missing = [t["seq"] for t in steps if t["gpu_ms"] is None]
    assert steps and not missing, missing
    traced = [t for t in steps if t["attached"] and t["sampled"]]
    untraced = [t for t in steps if t["attached"] is False]
    print(f"{len(steps)} steps: {len(traced)} traced, {len(untraced)} untraced; GPU ms median "
          f"traced {statistics.median(t['gpu_ms'] for t in traced):.3f}, untraced "
          f"{statistics.median(t['gpu_ms'] for t in untraced):.3f}")
    assert traced and untraced
    # the pair is recorded inside the step: its device time fits in the step's wall time
    assert all(0 < t["gpu_ms"] <= 1.02 * t["host_ms"] + 0.2 for t in steps), \
        [(t["seq"], t["gpu_ms"], t["host_ms"]) for t in steps
         if not 0 < t["gpu_ms"] <= 1.02 * t["host_ms"] + 0.2][:8]
    cost = doc["summary"]["modes"]["compiled"]["tracing_cost"]
    print("tracing cost:", cost)
    assert cost is not None and cost["source"] == "gpu_ms"


def test_program_prefills_are_traced_once_a_sampling_period(tmp_path):
    """A program calling generate() for a few tokens at a time brings a prefill every few
    steps; at the live app's sampling only one prefill per period (256 eager steps) is traced,
    the rest keep their timing without kernel records (each traced one cost the decode after
    it the flush and folding of its records: docs/performance.md#sampling)."""
    out = tmp_path / "snap.json"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "tuiprof", "run", "--headless", "--sample-every", "live",
           "--json", str(out), "--", "python", str(REPO / "bench" / "programs" / "hf_qwen.py"),
           "--mode", "eager", "--new-tokens", "9", "--repeats", "20"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, cwd=tmp_path,
                          env=env)
    assert out.exists(), proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    steps = [t for t in doc["tokens"] if t["done"] and t["phase"] in ("prefill", "decode")]
    prefills = [t for t in steps if t["phase"] == "prefill"]
    traced = [t for t in prefills if t["sampled"]]
    print(f"{len(steps)} steps, {len(prefills)} prefills, {len(traced)} traced")
    assert len(prefills) == 41                    # a warm-up call, then 20 × (9 tokens, 1 token)
    # periods count token sequence numbers, which a program's 100 ms windows between calls
    # (if any) use too
    span = max(t["seq"] for t in steps) - min(t["seq"] for t in steps) + 1
    from tuiprof.collect.cupti_collector import BURST  # noqa: PLC0415
    from tuiprof.sampling import AUTO_SAMPLE_EVERY  # noqa: PLC0415

    periods = span // (BURST * AUTO_SAMPLE_EVERY["eager"]) + 1
    # one due prefill a period, plus those a decode burst's 4 steps happen to hold (here up to
    # 2 a burst: a 1-token call's prefill is followed at once by the next call's); on the H100
    # 209 steps held 41 prefills and 4 were traced
    assert 1 <= len(traced) <= 3 * periods and len(traced) < len(prefills) // 4
    assert all(t["kernels"] > 0 for t in traced)
    assert all(t["kernels"] == 0 for t in prefills if not t["sampled"])


GREEDY = """
import json, pathlib, sys, torch
from transformers import AutoModelForCausalLM, Qwen3Config
spec = json.loads((pathlib.Path(sys.argv[1]) / "models" / "qwen3-0.6b.json").read_text())
torch.manual_seed(0)
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(Qwen3Config(**spec["config"]),
                                             dtype=torch.bfloat16).eval()
ids = torch.randint(0, spec["config"]["vocab_size"], (1, 16), device="cuda")
for call in range(3):
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=96,
                         min_new_tokens=96, do_sample=False, pad_token_id=0,
                         cache_implementation="static")
    print("TOKENS", call, out[0, 16:].tolist(), flush=True)
"""

OWN_GRAPH = """
import torch, tuiprof
x = torch.randn(256, 256, device="cuda")
w = torch.randn(256, 256, device="cuda") / 16
g, y = None, None
for i in range(160):
    with tuiprof.step("decode"):
        if i == 48:  # after a few detaches: a graph of the program's own
            torch.cuda.synchronize()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                y = torch.tanh(x @ w)                  # warm-up on a side stream
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y = torch.tanh(x @ w)
        if g is not None:
            g.replay()
        else:
            y = torch.tanh(x @ w)
        v = float(y.sum())
ref = float(torch.tanh(x @ w).sum())
print("REPLAY_OK", abs(v - ref) < 1e-3 * max(1.0, abs(ref)), flush=True)
"""


def _run(tmp_path: Path, name: str, code: str, *tuiprof_args: str) -> tuple[str, dict | None]:
    """The script alone (no tuiprof_args) or under ``tuiprof run --headless``."""
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / f"{name}-{len(tuiprof_args)}.json"
    cmd = ([sys.executable, "-m", "tuiprof", "run", "--headless", "--json", str(out),
            *tuiprof_args, "--", "python"] if tuiprof_args else [sys.executable])
    proc = subprocess.run([*cmd, str(script), str(REPO)], capture_output=True, text=True,
                          timeout=420, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, (json.loads(out.read_text()) if tuiprof_args else None)


def test_program_compiled_detaches_between_bursts_and_decodes_the_same(tmp_path):
    """A compiled generate() under `tuiprof run`, CUPTI attached for bursts only (a burst in
    every 32 steps here: ~9 attach/finalize cycles): the graphs transformers' forward recorded
    are dropped around each switch, recorded again, and decode the same tokens as the script
    alone; every traced step carries the whole graph."""
    alone, _ = _run(tmp_path, "greedy", GREEDY)
    under, doc = _run(tmp_path, "greedy", GREEDY, "--sample-every", "8")
    tokens = [ln for ln in under.splitlines() if ln.startswith("TOKENS")]
    assert len(tokens) == 3 and tokens == [ln for ln in alone.splitlines()
                                           if ln.startswith("TOKENS")]
    events = [e[3] for e in doc["events"]]
    assert not any("stays attached" in e for e in events), events
    over = doc["overhead"]
    dec = [t for t in doc["tokens"] if t["done"] and t["phase"] == "decode"
           and t["mode"] == "compiled"]
    traced = [t for t in dec if t["sampled"]]
    graph = [t["graph_kernels"] for t in traced]
    rerecord = [round(t["host_ms"], 1) for t in dec if t.get("rerecord")]
    # a traced prefill of the second or third call, its graphs kept (no re-recording after)
    done = [t for t in doc["tokens"] if t["done"]]
    kept = [a["seq"] for a, b in zip(done, done[1:]) if a["phase"] == "prefill" and a["sampled"]
            and b["phase"] == "decode" and b["mode"] == "compiled" and not b.get("rerecord")]
    print("detaches", over.get("detaches"), "switch_s", over.get("switch_s"), "traced",
          len(traced), "graph kernels", sorted(set(graph)), "rerecord ms", rerecord,
          "traced prefills with their graphs kept", kept)
    assert over["detaches"] >= 4
    assert graph and min(graph) > 100 and statistics.median(graph) == max(graph), graph
    assert all(not t["kernels"] for t in dec if not t["sampled"])
    assert rerecord


def test_a_programs_own_cuda_graph_keeps_cupti_attached(tmp_path):
    """A graph no drop can remove: CUPTI must never be finalized under it again (its next
    replay would die: docs/performance.md#cupti-and-cuda-graphs), so the session stays attached from the capture on."""
    alone, _ = _run(tmp_path, "own_graph", OWN_GRAPH)
    under, doc = _run(tmp_path, "own_graph", OWN_GRAPH, "--sample-every", "8")
    assert "REPLAY_OK True" in alone and "REPLAY_OK True" in under, under
    events = [e[3] for e in doc["events"]]
    print("detaches", doc["overhead"].get("detaches"), [e for e in events if "CUPTI" in e])
    assert doc["overhead"]["detaches"] >= 1
    assert "CUPTI stays attached: the program records CUDA graphs of its own" in events
    dec = [t for t in doc["tokens"] if t["done"] and t["phase"] == "decode"]
    assert any(t["sampled"] and t["kernels"] for t in dec if t["step"] > 60)
