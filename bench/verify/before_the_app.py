"""Where a request's time goes before the server's app sees it, against a raw streaming client
on 127.0.0.1: ``transformers serve --continuous-batching`` under ``tuiprof run --headless``
(CPU, the test model), N streaming completions sent a few ms apart, each with its own
``X-Request-ID`` and the client's wall-clock times (tuiprof's clock without CUPTI is the same).

Prints, per request, p50/p90/max of: the client's TTFT minus tuiprof's (which now counts from
uvicorn's first bytes of the request), the same against a TTFT counted from the app's entry
(what tuiprof measured before), tuiprof's "before the app" phase, and the client's send to
uvicorn's first read (the part no hook inside the server sees).

    python bench/verify/before_the_app.py --requests 24 --gap-ms 50
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--gap-ms", type=float, default=50.0)
    ap.add_argument("--out", default=None, help="directory kept (default: a temporary one)")
    a = ap.parse_args()
    from tests.serving.test_before_the_app import _request  # noqa: PLC0415
    from tests.serving.transformers_server import transformers_serve  # noqa: PLC0415
    from tuiprof.engine.model_dir import make_tiny_model_dir  # noqa: PLC0415

    out = Path(a.out or tempfile.mkdtemp(prefix="before-the-app-"))
    out.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model_dir(out / "tiny")
    (out / "hub").mkdir(exist_ok=True)
    snap = out / "serve.json"
    seen: dict = {}
    try:
        with transformers_serve(model, snap, out, num_blocks=64, max_batch_tokens=256,
                                ready_path="/health", up_s=300, stop_s=120,
                                log=out / "server.log", HF_HUB_CACHE=str(out / "hub"),
                                OMP_NUM_THREADS="1") as served:
            port = served.port
            _request(port, str(model), "warm", 0.0)

            def one(i: int) -> None:
                time.sleep(i * a.gap_ms / 1e3)
                seen[f"r{i}"] = _request(port, str(model), f"r{i}", 0.0)
            threads = [threading.Thread(target=one, args=(i,)) for i in range(a.requests)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    except RuntimeError:
        raise SystemExit(f"the server did not come up; see {out / 'server.log'}")
    rows = {r["id"]: r for r in json.loads(snap.read_text())["requests"]}

    def pct(xs: list, q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]
    cols: dict = {"client TTFT - tuiprof TTFT (from the first bytes)": [],
                  "client TTFT - a TTFT from the app's entry": [],
                  "before the app (tuiprof)": [], "client send -> uvicorn's first read": []}
    for rid, s in seen.items():
        r = rows[rid]
        client = (s["first"] - s["sent"]) / 1e6
        vals = (client - r["ttft_ms"],
                client - (r["first_token_ns"] - (r["app_ns"] or r["arrival_ns"])) / 1e6,
                r["before_app_ms"] or 0.0, (r["arrival_ns"] - s["sent"]) / 1e6)
        for k, v in zip(cols, vals):
            cols[k].append(v)
    for k, xs in cols.items():
        print(f"{k}: p50 {pct(xs, 0.5):.2f} ms, p90 {pct(xs, 0.9):.2f}, max {max(xs):.2f} "
              f"(n={len(xs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
