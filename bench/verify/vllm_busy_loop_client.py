"""A client that makes a vLLM (or any OpenAI-compatible) server's event loop busy while it sends,
so that requests wait in the kernel's socket buffer: the live app's request story then shows
their "socket buffer" phase (docs/serving.md, "In the socket buffer").

Every ``--every`` seconds: one request whose body (``--heavy`` token ids) the server's event
loop parses and rejects (longer than the model's context), then, ``--after-ms`` later,
``--burst`` streaming completions of ``--tokens`` tokens each (``X-Request-Id: liveN``), which
wait while the loop parses. Standard library only; 127.0.0.1.

    python bench/verify/vllm_busy_loop_client.py --port 8000 --model DIR --seconds 100
"""
from __future__ import annotations

import argparse
import http.client
import json
import threading
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--seconds", type=float, default=100.0)
    ap.add_argument("--every", type=float, default=2.5)
    ap.add_argument("--burst", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--heavy", type=int, default=300_000)
    ap.add_argument("--after-ms", type=float, default=30.0)
    a = ap.parse_args()
    heavy = json.dumps({"model": a.model, "prompt": list(range(1, a.heavy)),
                        "max_tokens": 4}).encode()
    n = 0

    def post(body: bytes, rid: str, read_all: bool) -> None:
        try:
            c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=300)
            c.request("POST", "/v1/completions", body,
                      {"Content-Type": "application/json", "X-Request-Id": rid})
            r = c.getresponse()
            for _ in r if read_all else ():
                pass
            r.read()
            c.close()
        except Exception as exc:  # the bench goes on; say what failed
            print(rid, exc, flush=True)

    stop_at = time.time() + a.seconds
    while time.time() < stop_at:
        threading.Thread(target=post, args=(heavy, f"heavy{n}", False), daemon=True).start()
        time.sleep(a.after_ms / 1e3)
        for _ in range(a.burst):
            body = json.dumps({"model": a.model, "prompt": "hello there " * 3,
                               "max_tokens": a.tokens, "stream": True,
                               "ignore_eos": True}).encode()
            threading.Thread(target=post, args=(body, f"live{n}", True), daemon=True).start()
            n += 1
        time.sleep(a.every)
    time.sleep(5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
