"""The proxy's per-request figures against the engine's hooks, for the same requests (target:
TTFT and end to end within 5 ms at p50 of the per-request differences).

``transformers serve DIR --continuous-batching`` (a tiny model directory made here, random
weights, nothing downloaded) under ``tuiprof run --headless --proxy LISTEN=UPSTREAM``; the
OpenAI client sends ``--requests`` streaming completions through LISTEN, one at a time (and
``--pairs`` pairs at once), each with its X-Request-ID. Both tuiprof's hooks and the proxy
record every request; per request: the proxy's TTFT and end to end minus the hooks', and where
the difference lies: before the server's app saw the request (the proxy's arrival to the
hooks'), from the hooks' first token to the proxy's first chunk (the server's detokenising,
event stream and HTTP), from the hooks' finish to the proxy's last byte. The hooks also time
when their server wrote the first token's bytes and the last bytes (``wire_first_ns``,
``wire_end_ns``): the proxy's figures against the hooks' over the same interval (to the bytes
written), and the phases between (first token handed over to its bytes written; written to
read by the proxy). The client's own TTFT (its clock) is shown beside the proxy's.

    python bench/verify/proxy_vs_hooks.py [--requests 40] [--pairs 5] [--tokens 8]
        [--gap-ms 0] [--json OUT]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.serving.transformers_server import (at_once, openai_client,  # noqa: E402
                                               transformers_serve)


def pct(values: list, q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(q * (len(s) - 1) + 0.5)))]


def drive(openai, prompt_words, port: int, model: str, a) -> dict[str, float]:
    """The client's requests through the proxy: one at a time, then pairs; each one's TTFT."""
    client = openai_client(openai, port, timeout=120)
    mine: dict[str, float] = {}

    def one(rid: str) -> None:
        t0 = time.time_ns()
        stream = client.completions.create(
            model=model, prompt=prompt_words(12, seed=len(mine), size=1024),
            max_tokens=a.tokens, stream=True, extra_headers={"X-Request-ID": rid},
            stream_options={"include_usage": True})
        first = None
        for c in stream:
            if first is None and c.choices and c.choices[0].text:
                first = time.time_ns()
        mine[rid] = ((first or t0) - t0) / 1e6

    one("warmup")
    for k in range(a.requests):
        if a.gap_ms:
            time.sleep(a.gap_ms / 1e3)
        one(f"req{k}")
    for k in range(a.pairs):
        at_once(one, [(f"pair{k}.{i}",) for i in range(2)], timeout=120)
    return mine


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--gap-ms", type=float, default=0.0,
                   help="pause between two requests one at a time (0: back to back, each sent "
                        "as the last one's end is read)")
    p.add_argument("--json")
    a = p.parse_args()
    import openai  # noqa: PLC0415

    from tuiprof.engine.model_dir import make_tiny_model_dir, prompt_words  # noqa: PLC0415

    tmp = Path(tempfile.mkdtemp(prefix="tuiprof-proxy-vs-hooks-"))
    model = make_tiny_model_dir(tmp / "tiny")
    snap = tmp / "serve.json"
    try:
        with transformers_serve(model, snap, tmp, proxy=True, num_blocks=64, up_s=180,
                                stop_s=120) as served:
            mine = drive(openai, prompt_words, served.port, str(model), a)
    except RuntimeError as e:   # the server did not come up: the end of its output
        print(e)
        return 1
    doc = json.loads(snap.read_text())
    reqs = {r["id"]: r for r in doc["requests"]}
    rows = []
    for rid in mine:
        if rid == "warmup":
            continue
        pr, h = reqs.get("proxy:" + rid), reqs.get(rid)
        if pr is None or h is None or not pr["token_ns"] or not h["token_ns"]:
            continue
        row = {"id": rid, "ttft": pr["ttft_ms"] - h["ttft_ms"],
               "e2e": pr["e2e_ms"] - h["e2e_ms"],
               "before_app": (h["arrival_ns"] - pr["arrival_ns"]) / 1e6,
               "first": (pr["token_ns"][0] - h["token_ns"][0]) / 1e6,
               "end": (pr["finish_ns"] - h["finish_ns"]) / 1e6,
               "client_minus_proxy_ttft": mine[rid] - pr["ttft_ms"]}
        if h.get("wire_first_ns") and h.get("wire_end_ns"):
            # the same interval on both sides: the hooks' to the bytes their server wrote
            arr = h["arrival_ns"]
            row.update(ttft_wire=pr["ttft_ms"] - (h["wire_first_ns"] - arr) / 1e6,
                       e2e_wire=pr["e2e_ms"] - (h["wire_end_ns"] - arr) / 1e6,
                       after_engine=(h["wire_first_ns"] - h["token_ns"][0]) / 1e6,
                       back_first=(pr["token_ns"][0] - h["wire_first_ns"]) / 1e6,
                       after_finish=(h["wire_end_ns"] - h["finish_ns"]) / 1e6,
                       back_end=(pr["finish_ns"] - h["wire_end_ns"]) / 1e6)
        rows.append(row)
    res = {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(),
           "load": os.getloadavg(), "python": platform.python_version(),
           "command": "python bench/verify/proxy_vs_hooks.py " + " ".join(sys.argv[1:]),
           "requests": len(rows), "unmatched": len(mine) - 1 - len(rows)}
    print(f"{len(rows)} requests seen by both the hooks and the proxy ({res['unmatched']} not); "
          f"load {res['load'][0]:.1f} on {res['cores']} cores; ms, p50 / p90 / p99:")
    for key, label in (("ttft", "TTFT, proxy minus hooks"), ("e2e", "end to end, proxy minus hooks"),
                       ("before_app", "  proxy's arrival to the server's"),
                       ("first", "  hooks' first token to the proxy's first chunk"),
                       ("end", "  hooks' finish to the proxy's last byte"),
                       ("client_minus_proxy_ttft", "TTFT, client minus proxy"),
                       ("ttft_wire", "TTFT, proxy minus hooks to the bytes written"),
                       ("e2e_wire", "end to end, proxy minus hooks to the last byte written"),
                       ("after_engine", "  hooks: first token handed to its bytes written"),
                       ("back_first", "  its bytes written to the proxy's first chunk"),
                       ("before_app", "  the proxy's arrival to the server reading it"),
                       ("after_finish", "  hooks: finish to the last byte written"),
                       ("back_end", "  the last byte written to the proxy's end")):
        v = [r[key] for r in rows if key in r]
        if not v:
            continue
        res[key] = {"p50": pct(v, 0.5), "p90": pct(v, 0.9), "p99": pct(v, 0.99)}
        print(f"  {label:<48} {pct(v, 0.5):8.2f} / {pct(v, 0.9):8.2f} / {pct(v, 0.99):8.2f}")
    met = all(abs(res[k]["p50"]) <= 5.0 for k in ("ttft", "e2e"))
    res["target_met"] = met
    print(f"target (TTFT and end to end within 5 ms at p50): {'met' if met else 'NOT met'}")
    if "ttft_wire" in res:
        met = all(abs(res[k]["p50"]) <= 5.0 for k in ("ttft_wire", "e2e_wire"))
        res["target_met_wire"] = met
        print("target on the same interval (the hooks to the bytes their server wrote): "
              + ("met" if met else "NOT met"))
    if a.json:
        Path(a.json).write_text(json.dumps({**res, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
