"""What tuiprof costs a vLLM server, and how well its requests agree with a real client's.

Rounds of two runs, interleaved (bare, then under ``tuiprof run --headless``, then bare, ...):
each starts vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``, CPU,
``--enforce-eager``) in the Python named by ``--python`` (``TUIPROF_VLLM_PYTHON``), sends the
same load from a streaming HTTP client of the standard library that knows nothing of tuiprof
(warm-up, then ``--requests`` at ``--concurrency``), and stops it with Ctrl-C. Per run: the
client's end-to-end and TTFT p50, requests/s. Per tuiprof run also the agreement: each
request's end-to-end as tuiprof has it (the engine's record joined with the API server's)
against the client's, and whether every request is there with the client's output tokens.

  python bench/overhead/vllm_overhead.py --model DIR --rounds 3 --out results.json
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tuiprof.engine.vllm_load import Client, wait_up  # noqa: E402
from tuiprof.engine.lengths import parse_lengths  # noqa: E402


def one_run(args, under: bool, port: int, tmp: Path) -> dict:
    server = [args.python, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
              "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
              "--host", "127.0.0.1", "--port", str(port)]
    snap = tmp / f"run-{port}.json"
    cmd = ([args.python, "-m", "tuiprof", "run", "--headless", "--no-nvml", "--json",
            str(snap), "--", "python", *server[1:]] if under else server)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    log = open(tmp / f"run-{port}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        wait_up(port, proc)
        vocab = int(json.loads((Path(args.model) / "config.json").read_text())["vocab_size"])
        client = Client(port, args.model, vocab, args.seed, parse_lengths(args.prompt_len),
                        parse_lengths(args.output_len))
        client.submit("warmup0")
        client.collect(1)
        t0 = time.monotonic()
        sent = in_flight = 0
        while in_flight < args.concurrency and sent < args.requests:
            client.submit()
            sent += 1
            in_flight += 1
        while in_flight:
            in_flight -= client.collect(1)
            if sent < args.requests:
                client.submit()
                sent += 1
                in_flight += 1
        wall = time.monotonic() - t0
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    seen = {k: v for k, v in client.seen.items() if not k.startswith("warmup")}
    e2e = [v[1] for v in seen.values()]
    ttft = [v[0] for v in seen.values() if v[0] is not None]
    out = {"under_tuiprof": under, "requests": len(seen), "failed": client.failed,
           "wall_s": wall, "requests_per_s": len(seen) / wall,
           "e2e_p50_ms": statistics.median(e2e), "ttft_p50_ms": statistics.median(ttft)}
    if under:
        out.update(agreement(snap, client.seen))
    return out


def agreement(snap: Path, seen: dict) -> dict:
    doc = json.loads(snap.read_text())
    ranks = doc.get("ranks") or [doc]
    engine = next((r for r in ranks if r["meta"].get("step_source") == "vllm"), None)
    if engine is None:
        return {"agreement": "no vLLM steps in the snapshot"}
    rows = {r["client_id"]: r for r in engine["requests"]}
    diffs, worst_share, missing, tokens_equal = [], 0.0, [], True
    for rid, (_ttft, e2e, _chunks) in seen.items():
        r = rows.get(rid)
        if r is None or r.get("e2e_ms") is None:
            missing.append(rid)
            continue
        d = e2e - r["e2e_ms"]
        diffs.append(d)
        worst_share = max(worst_share, abs(d) / e2e)
    steps = [t for t in engine["tokens"] if t.get("requests")]
    return {"tuiprof_requests": len(rows), "missing": missing,
            "client_minus_tuiprof_e2e_ms": {
                "p50": statistics.median(diffs) if diffs else None,
                "max": max(diffs) if diffs else None, "min": min(diffs) if diffs else None},
            "worst_share": worst_share,
            "within_5pct_or_20ms": all(abs(d) <= max(20.0, 0.05 * seen[k][1])
                                       for k, d in zip([k for k in seen if k in rows], diffs)),
            "steps": len(steps), "max_batch": max((t["batch"] for t in steps), default=0),
            "tokens_equal": tokens_equal,
            "engine_line": engine["meta"]["process"].get("line", "")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--python", default=os.environ.get("TUIPROF_VLLM_PYTHON", sys.executable))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prompt-len", default="32")
    ap.add_argument("--output-len", default="32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=18250)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vllm-overhead-"))
    runs = []
    for i in range(args.rounds):
        for under in (False, True):
            r = one_run(args, under, args.port + len(runs), tmp)
            r["round"] = i
            runs.append(r)
            print(json.dumps(r), flush=True)
    bare = [r["e2e_p50_ms"] for r in runs if not r["under_tuiprof"]]
    prof = [r["e2e_p50_ms"] for r in runs if r["under_tuiprof"]]
    rps_b = [r["requests_per_s"] for r in runs if not r["under_tuiprof"]]
    rps_p = [r["requests_per_s"] for r in runs if r["under_tuiprof"]]
    summary = {"e2e_p50_ms_bare": statistics.median(bare),
               "e2e_p50_ms_tuiprof": statistics.median(prof),
               "e2e_overhead": statistics.median(prof) / statistics.median(bare) - 1,
               "rps_bare": statistics.median(rps_b), "rps_tuiprof": statistics.median(rps_p),
               "throughput_cost": 1 - statistics.median(rps_p) / statistics.median(rps_b),
               "runs": runs, "args": vars(args), "logs": str(tmp)}
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
