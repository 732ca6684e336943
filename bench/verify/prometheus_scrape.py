"""Does a real Prometheus, scraping a detached session's ``--metrics`` while a load runs, agree
with the session's snapshot? PromQL's ``histogram_quantile(0.5, …ttft…)`` over the session's
cumulative buckets against the snapshot's TTFT p50 (over the same requests): within one bucket.

    python bench/verify/prometheus_scrape.py [--requests 24] [--json OUT]

Everything on 127.0.0.1 (ports 18500-18599 unless --ports): ``tuiprof run --detach --metrics``
of tuiprof's own load generator (a tiny model under transformers' continuous batching on the
CPU), and Debian's ``prometheus`` binary (``apt-get install prometheus``) with a scrape interval
of 1 s. Exit status 0 when it agrees, 1 when not, 77 when no prometheus binary is installed.
tests/export/test_prometheus.py runs it in the suite.
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tuiprof.store.stats import REQUEST_EDGES_MS  # noqa: E402

HOLD_S = 4.0     # the program stays this long after its load: the last scrapes see every request
# the load, then a pause, in the detached session's program
PROGRAM = ("import sys, time\nfrom tuiprof.engine.serve_load import main\n"
           "rc = main(sys.argv[1:])\ntime.sleep(float(%r))\nraise SystemExit(rc)\n" % HOLD_S)


def free_ports(lo: int, hi: int, n: int) -> list:
    out = []
    for port in range(lo, hi):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        out.append(port)
        if len(out) == n:
            return out
    raise SystemExit(f"no {n} free ports in {lo}-{hi}")


def query(prom: str, path: str, **params) -> dict:
    url = f"{prom}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.loads(r.read())
    if doc.get("status") != "success":
        raise RuntimeError(f"PromQL failed: {doc}")
    return doc["data"]


def bucket(ms: float) -> int:
    return bisect.bisect_left(REQUEST_EDGES_MS, ms)


def run(requests: int = 24, ports: tuple = (18500, 18600), work: Path | None = None,
        deadline_s: float = 240.0) -> dict:
    """The check; returns its figures (``ok``: it agrees)."""
    binary = shutil.which("prometheus")
    if binary is None:
        return {"skipped": "no prometheus binary (apt-get install prometheus)"}
    work = Path(work or tempfile.mkdtemp(prefix="tuiprof-prom-"))
    mport, pport = free_ports(*ports, 2)
    env = dict(os.environ, TUIPROF_RUNTIME_DIR=str(work / "rt"), HF_HUB_OFFLINE="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    (work / "rt").mkdir(mode=0o700, exist_ok=True)
    cfg = work / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
                   "scrape_configs:\n  - job_name: tuiprof\n    static_configs:\n"
                   f"      - targets: ['127.0.0.1:{mport}']\n")
    prom_log = open(work / "prometheus.log", "wb")
    prom = subprocess.Popen([binary, f"--config.file={cfg}",
                             f"--storage.tsdb.path={work / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{pport}"],
                            stdout=prom_log, stderr=subprocess.STDOUT)
    purl = f"http://127.0.0.1:{pport}"
    sid = None
    t_start = time.time()
    try:
        load = ["--model", "qwen3-tiny", "--device", "cpu", "--concurrency", "3",
                "--requests", str(requests), "--prompt-len", "8:24", "--output-len", "4:12",
                "--num-blocks", "64", "--seed", "1"]
        script = work / "serve_then_wait.py"
        script.write_text(PROGRAM)
        p = subprocess.run([sys.executable, "-m", "tuiprof", "run", "--detach", "--no-nvml",
                            "--metrics", f"127.0.0.1:{mport}", "--export-dir", str(work),
                            "--", "python", str(script), *load],
                           capture_output=True, text=True, env=env, cwd=work, timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"tuiprof run --detach failed: {p.stderr.strip()[-800:]}")
        sid = p.stdout.strip().splitlines()[-1]
        info_path = work / "rt" / sid / "info.json"
        end = time.monotonic() + deadline_s
        info: dict = {}
        while time.monotonic() < end:
            info = json.loads(info_path.read_text()) if info_path.exists() else {}
            if info.get("state") in ("ended", "stopped", "error", "dead"):
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the session did not end within {deadline_s:.0f} s")
        snap = json.loads(Path(info["snapshot"]).read_text())
        # what Prometheus holds: the last scrape of the finished count, and the quantile then
        rng = query(purl, "query_range", query="sum(tuiprof_requests_finished_total)",
                    start=t_start - 5, end=time.time() + 1, step="1")
        points = rng["result"][0]["values"] if rng["result"] else []
        if not points:
            raise RuntimeError("Prometheus holds no samples of the session "
                               f"(log: {work / 'prometheus.log'})")
        t_last, finished = float(points[-1][0]), int(float(points[-1][1]))
        q = query(purl, "query", time=t_last,
                  query="histogram_quantile(0.5, sum by (le) (tuiprof_request_ttft_seconds_bucket))")
        prom_p50_ms = float(q["result"][0]["value"][1]) * 1000
        rate_q = query(purl, "query", time=t_last, query="histogram_quantile(0.5, sum by (le) "
                       "(rate(tuiprof_request_ttft_seconds_bucket[30s])))")
        # the load's requests: the warm-up is in no count or bucket (it is marked warmup)
        ttfts = sorted(r["ttft_ms"] for r in snap["requests"] if not r.get("warmup")
                       and r["status"] == "finished" and r.get("ttft_ms") is not None)
        n = len(ttfts)
        snap_p50 = (ttfts[(n - 1) // 2] + ttfts[n // 2]) / 2 if n else float("nan")
        scrapes = query(purl, "query", time=t_last, query="count_over_time(up[10m])")
        out = {"requests": requests, "snapshot_finished": n, "prometheus_finished": finished,
               "snapshot_ttft_p50_ms": round(snap_p50, 3),
               "promql_ttft_p50_ms": round(prom_p50_ms, 3),
               "promql_rate30s_p50_ms": (round(float(rate_q["result"][0]["value"][1]) * 1000, 3)
                                         if rate_q["result"] else None),
               "bucket_snapshot": bucket(snap_p50), "bucket_promql": bucket(prom_p50_ms),
               "scrapes": int(float(scrapes["result"][0]["value"][1])) if scrapes["result"]
               else 0, "session": sid, "work": str(work),
               "snapshot_feeds": (snap.get("meta") or {}).get("feeds")
               or (snap.get("world") or {}).get("feeds")}
        out["ok"] = (finished == n and abs(out["bucket_snapshot"] - out["bucket_promql"]) <= 1)
        return out
    finally:
        prom.terminate()
        try:
            prom.wait(20)
        except subprocess.TimeoutExpired:
            prom.kill()
        prom_log.close()
        if sid is not None:
            subprocess.run([sys.executable, "-m", "tuiprof", "stop", sid], env=env, cwd=work,
                           capture_output=True, timeout=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--ports", default="18500-18600", help="LO-HI, the ports it may use")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    lo, hi = (int(x) for x in a.ports.split("-"))
    out = run(a.requests, (lo, hi))
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    if "skipped" in out:
        return 77
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
