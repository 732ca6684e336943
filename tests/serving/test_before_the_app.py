"""Where a request's time goes before the server's app sees it: ``transformers serve`` under
``tuiprof run --headless`` on 127.0.0.1, and a raw HTTP client that sends a request's first
line, waits, then sends the rest. The request arrives when uvicorn read its first bytes; its
app saw it only once its headers were complete. That wait is the request's "before the app"
phase (snapshot ``app_ns``, ``before_app_ms``; its story; its exported ranges), and the
client's TTFT minus tuiprof's shrinks to what lies outside the server (the network, the
stream), where it held the whole wait before."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tuiprof.engine.model_dir import make_tiny_model_dir, prompt_words

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOLD_S = 0.4      # the client's pause between the request line and the rest of the request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port: int, model: str, rid: str, hold: float) -> dict:
    """One streaming completion over a raw socket: times on the wall clock (the session's
    clock without CUPTI) of the first byte sent, the first token chunk and the end."""
    body = json.dumps({"model": model, "prompt": prompt_words(8, seed=len(rid), size=1024),
                       "max_tokens": 4, "stream": True}).encode()
    first = b"POST /v1/completions HTTP/1.1\r\n"
    rest = (f"Host: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nX-Request-ID: {rid}"
            f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        sent = time.time_ns()
        s.sendall(first)
        if hold:
            time.sleep(hold)
        s.sendall(rest)
        got, first_tok = b"", None
        while True:
            data = s.recv(65536)
            if not data:
                break
            got += data
            if first_tok is None and b'"text":"' in got.split(b"\r\n\r\n", 1)[-1] \
                    and b'"text":""' not in got.split(b"\r\n\r\n", 1)[-1][-200:]:
                first_tok = time.time_ns()
    assert got.startswith(b"HTTP/1.1 200"), got[:300]
    return {"sent": sent, "first": first_tok or time.time_ns()}


@pytest.mark.slow
def test_a_requests_time_before_the_app_is_a_phase_of_its_own(tmp_path):
    model = make_tiny_model_dir(tmp_path / "tiny")
    port = _free_port()
    snap = tmp_path / "serve.json"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"), OMP_NUM_THREADS="1")
    (tmp_path / "hub").mkdir()
    cmd = [sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml", "--json",
           str(snap), "--", "python", "-m", "transformers.cli.transformers", "serve",
           str(model), "--continuous-batching", "--device", "cpu", "--host", "127.0.0.1",
           "--port", str(port), "--cb-num-blocks", "32", "--cb-max-batch-tokens", "128"]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env, cwd=tmp_path)
    seen = {}
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except Exception:
                assert server.poll() is None, server.stdout.read()[-3000:]
                assert time.monotonic() < deadline, "the server did not come up in 180 s"
                time.sleep(0.3)
        seen["warm"] = _request(port, str(model), "warm", 0.0)
        seen["held"] = _request(port, str(model), "held", HOLD_S)
        seen["whole"] = _request(port, str(model), "whole", 0.0)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            out, _ = server.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            out, _ = server.communicate()
    doc = json.loads(snap.read_text())
    reqs = {r["id"]: r for r in doc["requests"]}
    assert {"warm", "held", "whole"} <= set(reqs), (sorted(reqs), out[-2000:])
    held = reqs["held"]
    # arrival: when uvicorn read the first line (after the client sent it); the app saw the
    # request only once the rest came, HOLD_S later
    assert seen["held"]["sent"] <= held["arrival_ns"] < held["app_ns"] < held["queued_ns"]
    assert held["before_app_ms"] == (held["app_ns"] - held["arrival_ns"]) / 1e6
    # the rest left the client HOLD_S after the first line, which uvicorn may have read late
    late_ms = (held["arrival_ns"] - seen["held"]["sent"]) / 1e6
    assert held["before_app_ms"] >= HOLD_S * 1e3 - late_ms, (held, late_ms)
    # the client's TTFT minus tuiprof's is what lies outside the server; measured from the
    # app's entry instead, it would hold the whole wait
    client_ttft = (seen["held"]["first"] - seen["held"]["sent"]) / 1e6
    from_app = (held["first_token_ns"] - held["app_ns"]) / 1e6
    assert client_ttft - held["ttft_ms"] < HOLD_S * 1e3 <= client_ttft - from_app, \
        (client_ttft, held["ttft_ms"], from_app)
    whole = reqs["whole"]
    assert seen["whole"]["sent"] <= whole["arrival_ns"] <= (whole["app_ns"] or whole["arrival_ns"])

    # the story and the exported ranges show the phase
    from tuiprof.analysis.requests import phases, story
    from tuiprof.export.snapshot import read_snapshot
    view = read_snapshot(snap)
    s = story(view, "held")
    assert s.before_app_ms == held["before_app_ms"]
    names = [n for n, _, _ in phases(view.requests.get("held"), 0)]
    assert names[:3] == ["request", "before the app", "queued"], names
