"""tuiprof's server-side TTFT, ITL and end-to-end latency beside a load client's own report
(NVIDIA aiperf, from the package registry), request by request, at several request rates.

``transformers serve DIR --continuous-batching`` runs under ``tuiprof run --headless``; aiperf
drives it on 127.0.0.1 (open-loop ``--request-rate``, bounded ``--request-count``, streaming
completions, X-Request-ID headers that tuiprof records as the request ids); then the server is
stopped with Ctrl-C and both sides are joined by request id.

    python bench/verify/serve_vs_client.py --aiperf /path/to/venv/bin/aiperf --device cpu \\
        --model qwen3-tiny --rates 1,2,4 --requests 24 --out out/serve_vs_client

Prints, per rate, p50/p90/p99 of both sides and the per-request differences (client minus
tuiprof), split into where they lie: before the request reached the server's app (connection,
HTTP), after tuiprof's first token until the client's first chunk (the SSE stream, detokenising),
after tuiprof's finish until the client's last byte. Writes ``OUT/compare.json`` and
``OUT/compare.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

ZERO = "0" * 40


def pct(xs: list, q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(q * (len(s) - 1) + 0.5)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hf_cache(model_dir: Path, home: Path, name: str) -> str:
    """aiperf loads a tokenizer offline only from the Hugging Face cache layout."""
    snap = home / "hub" / f"models--local--{name}" / "snapshots" / ZERO
    snap.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.suffix in (".json", ".jinja", ".txt", ".model") and f.name != "model.safetensors":
            shutil.copy(f, snap / f.name)
    (home / "hub" / f"models--local--{name}" / "refs").mkdir(exist_ok=True)
    (home / "hub" / f"models--local--{name}" / "refs" / "main").write_text(ZERO)
    return f"local/{name}"


def wait_up(port: int, proc: subprocess.Popen, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server ended (status {proc.returncode}); see its log")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
            return
        except Exception:
            time.sleep(0.5)
    raise SystemExit(f"the server did not answer in {timeout:g} s")


def stats(xs: list) -> dict:
    return {"n": len(xs), "p50": pct(xs, 0.5), "p90": pct(xs, 0.9), "p99": pct(xs, 0.99),
            "mean": sum(xs) / len(xs) if xs else None}


def compare(jsonl: Path, rows: dict) -> dict:
    """Join the client's records with tuiprof's rows by request id."""
    # ITL: aiperf reports each request's mean inter-token latency; tuiprof has every gap
    # ("itl_gaps") and the same per-request mean ("itl")
    client = {"ttft": [], "itl": [], "e2e": []}
    server = {"ttft": [], "itl": [], "e2e": [], "itl_gaps": []}
    diff = {"ttft": [], "e2e": [], "before_server": [], "after_first_token": [],
            "after_finish": [], "itl_mean": []}
    missing = 0
    for line in jsonl.read_text().splitlines():
        d = json.loads(line)
        m, x = d["metadata"], d["metrics"]
        r = rows.get(m.get("x_request_id"))
        if r is None or "time_to_first_token" not in x:
            missing += 1
            continue
        c_ttft = x["time_to_first_token"]["value"]
        c_e2e = x["request_latency"]["value"]
        c_itl = x.get("inter_token_latency", {}).get("value")
        itls = [(b - a) / 1e6 for a, b in zip(r["token_ns"], r["token_ns"][1:])]
        s_itl = sum(itls) / len(itls) if itls else None
        client["ttft"].append(c_ttft)
        client["e2e"].append(c_e2e)
        server["ttft"].append(r["ttft_ms"])
        server["e2e"].append(r["e2e_ms"])
        if c_itl is not None:
            client["itl"].append(c_itl)
        if s_itl is not None:
            server["itl"].append(s_itl)
        server["itl_gaps"].extend(itls)
        diff["ttft"].append(c_ttft - r["ttft_ms"])
        diff["e2e"].append(c_e2e - r["e2e_ms"])
        if c_itl is not None and s_itl is not None:
            diff["itl_mean"].append(c_itl - s_itl)
        # where: on one clock only when the two clocks agree (CPU sessions: both wall ns)
        before = (r["arrival_ns"] - m["request_start_ns"]) / 1e6
        diff["before_server"].append(before)
        diff["after_first_token"].append(c_ttft - before - r["ttft_ms"])
        diff["after_finish"].append((m["request_end_ns"] - r["finish_ns"]) / 1e6)
    out = {"client": {k: stats(v) for k, v in client.items()},
           "tuiprof": {k: stats(v) for k, v in server.items()},
           "client_minus_tuiprof": {k: stats(v) for k, v in diff.items()},
           "joined": len(diff["ttft"]), "unmatched": missing}
    clock = out["client_minus_tuiprof"]["before_server"]["p50"]
    out["same_clock"] = clock is not None and abs(clock) < 1000.0
    return out


def fmt(v) -> str:
    return "–" if v is None else f"{v:,.2f}"


def report(cells: list) -> str:
    lines = []
    for c in cells:
        a, s, d = c["client"], c["tuiprof"], c["client_minus_tuiprof"]
        lines += [f"### rate {c['rate']:g} req/s: {c['joined']} requests joined by id"
                  f" ({c['unmatched']} unmatched)", "",
                  "| ms | client p50 | tuiprof p50 | client p90 | tuiprof p90 | client p99 | "
                  "tuiprof p99 |", "|---|---:|---:|---:|---:|---:|---:|"]
        for k, label in (("ttft", "TTFT"), ("itl", "ITL (a request's mean)"),
                         ("e2e", "end to end")):
            lines.append(f"| {label} | {fmt(a[k]['p50'])} | {fmt(s[k]['p50'])} | "
                         f"{fmt(a[k]['p90'])} | {fmt(s[k]['p90'])} | {fmt(a[k]['p99'])} | "
                         f"{fmt(s[k]['p99'])} |")
        g = s["itl_gaps"]
        lines.append(f"| ITL (every token gap: tuiprof only) | | {fmt(g['p50'])} | | "
                     f"{fmt(g['p90'])} | | {fmt(g['p99'])} |")
        lines += ["", "| client − tuiprof, per request (ms) | p50 | p90 | p99 |",
                  "|---|---:|---:|---:|"]
        for k, label in (("ttft", "TTFT"), ("itl_mean", "mean ITL"), ("e2e", "end to end"),
                         ("before_server", "before the server's app saw it"),
                         ("after_first_token", "tuiprof's first token → client's first chunk"),
                         ("after_finish", "tuiprof's finish → client's last byte")):
            if k in ("before_server", "after_first_token", "after_finish") and not c["same_clock"]:
                continue
            lines.append(f"| {label} | {fmt(d[k]['p50'])} | {fmt(d[k]['p90'])} | "
                         f"{fmt(d[k]['p99'])} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiperf", required=True,
                    help="the aiperf command (an executable, or e.g. 'python3 -m aiperf')")
    ap.add_argument("--aiperf-pythonpath", default=None,
                    help="PYTHONPATH of the aiperf process (wheels installed with --target)")
    ap.add_argument("--model", default="qwen3-tiny", help="registry model for the directory")
    ap.add_argument("--model-dir", default=None, help="an existing model directory")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rates", default="1,2,4")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--cb-num-blocks", type=int, default=None)
    ap.add_argument("--tuiprof-args", default="--no-nvml",
                    help="options of tuiprof run (default --no-nvml)")
    ap.add_argument("--out", default="out/serve_vs_client")
    ap.add_argument("--compare-only", action="store_true",
                    help="recompute the comparison from OUT (no server, no client)")
    args = ap.parse_args()
    if args.compare_only:
        return _compare_dir(Path(args.out).resolve(), [float(r) for r in args.rates.split(",")])
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO) + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    if args.model_dir:
        model_dir = Path(args.model_dir).resolve()
    else:
        from tuiprof.engine.model_dir import make_model_dir
        model_dir = make_model_dir(out / "model", args.model, device=args.device)
    tok = hf_cache(model_dir, out / "hf", "tuiprof-" + args.model)
    # transformers serve's /v1/models scans the hub cache and answers 500 where it does not
    # exist (a fresh machine): the readiness probe then never succeeds
    server_cache = out / "hf-server" / "hub"
    server_cache.mkdir(parents=True, exist_ok=True)
    env["HF_HUB_CACHE"] = str(server_cache)
    port = free_port()
    snap = out / "tuiprof.json"
    serve = [sys.executable, "-m", "tuiprof", "run", "--headless", "--json", str(snap),
             *args.tuiprof_args.split(), "--", "python", "-m",
             "transformers.cli.transformers", "serve", str(model_dir), "--continuous-batching",
             "--device", args.device, "--host", "127.0.0.1", "--port", str(port)]
    if args.cb_num_blocks:
        serve += ["--cb-num-blocks", str(args.cb_num_blocks)]
    log = open(out / "server.log", "w")
    t0 = time.monotonic()
    server = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out)
    cells = []
    try:
        wait_up(port, server, 600)
        print(f"server up in {time.monotonic() - t0:.1f} s", flush=True)
        for rate in [float(r) for r in args.rates.split(",")]:
            art = out / f"aiperf-rate-{rate:g}"
            cmd = [*shlex.split(args.aiperf), "profile", "--model", str(model_dir),
                   "--tokenizer", tok,
                   "--url", f"http://127.0.0.1:{port}", "--endpoint-type", "completions",
                   "--streaming", "--request-rate", f"{rate:g}", "--request-count",
                   str(args.requests), "--warmup-request-count", str(args.warmup),
                   "--synthetic-input-tokens-mean", str(args.prompt_len),
                   "--synthetic-input-tokens-stddev", "0",
                   "--output-tokens-mean", str(args.output_len), "--output-tokens-stddev", "0",
                   "--ui-type", "none", "--artifact-dir", str(art)]
            aenv = dict(env, HF_HOME=str(out / "hf"))
            aenv.pop("HF_HUB_CACHE", None)    # aiperf's tokenizer is in HF_HOME's hub
            aenv.pop("PYTHONPATH", None)
            if args.aiperf_pythonpath:
                aenv["PYTHONPATH"] = args.aiperf_pythonpath
            t1 = time.monotonic()
            res = subprocess.run(cmd, capture_output=True, text=True, env=aenv, timeout=1800)
            (out / f"aiperf-rate-{rate:g}.log").write_text(res.stdout + res.stderr)
            print(f"aiperf at {rate:g} req/s: status {res.returncode} in "
                  f"{time.monotonic() - t1:.1f} s", flush=True)
            cells.append({"rate": rate, "artifacts": str(art)})
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(180)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    return _compare_dir(out, [c["rate"] for c in cells])


def _compare_dir(out: Path, rates: list) -> int:
    doc = json.loads((out / "tuiprof.json").read_text())
    rows = {r["id"]: r for r in doc["requests"]}
    results = []
    for rate in rates:
        jsonl = out / f"aiperf-rate-{rate:g}" / "profile_export.jsonl"
        if not jsonl.exists():
            print(f"rate {rate:g}: no aiperf records", file=sys.stderr)
            continue
        results.append({"rate": rate, **compare(jsonl, rows)})
    text = report(results)
    (out / "compare.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "compare.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
