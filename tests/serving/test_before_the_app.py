"""Where a request's time goes before the server's app sees it: ``transformers serve`` under
``tuiprof run --headless`` on 127.0.0.1, and a raw HTTP client that sends a request's first
line, waits, then sends the rest. The request arrives when uvicorn read its first bytes; its
app saw it only once its headers were complete. That wait is the request's "before the app"
phase (snapshot ``app_ns``, ``before_app_ms``; its story; its exported ranges), and the
client's TTFT minus tuiprof's shrinks to what lies outside the server (the network, the
stream), where it held the whole wait before."""
from __future__ import annotations

import json
import socket
import time

import pytest

from tuiprof.engine.model_dir import make_tiny_model_dir, prompt_words

from .transformers_server import transformers_serve

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

HOLD_S = 0.4      # the client's pause between the request line and the rest of the request


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
    snap = tmp_path / "serve.json"
    (tmp_path / "hub").mkdir()
    seen = {}
    with transformers_serve(model, snap, tmp_path, ready_path="/health", up_s=180, stop_s=120,
                            HF_HUB_CACHE=str(tmp_path / "hub"), OMP_NUM_THREADS="1") as served:
        port = served.port
        seen["warm"] = _request(port, str(model), "warm", 0.0)
        seen["held"] = _request(port, str(model), "held", HOLD_S)
        seen["whole"] = _request(port, str(model), "whole", 0.0)
    out = served.printed()
    doc = json.loads(snap.read_text())
    reqs = {r["id"]: r for r in doc["requests"]}
    assert {"warm", "held", "whole"} <= set(reqs), (sorted(reqs), out[-2000:])
    held = reqs["held"]
    # arrival: when uvicorn read the first line (after the client sent it); the app saw the
    # request only once the rest came, HOLD_S later
    assert seen["held"]["sent"] <= held["arrival_ns"] < held["app_ns"] < held["queued_ns"]
    # from uvicorn's read of them (their wait in the socket buffer apart, if the loop was busy)
    read = held["read_ns"] or held["arrival_ns"]
    assert held["arrival_ns"] <= read < held["app_ns"]
    assert held["before_app_ms"] == (held["app_ns"] - read) / 1e6
    # the rest left the client HOLD_S after the first line, which uvicorn may have read late
    late_ms = (read - seen["held"]["sent"]) / 1e6
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
    names = [n for n, _, _ in phases(view.requests.get("held"), 0)
             if n != "in the socket buffer"]
    assert names[:3] == ["request", "before the app", "queued"], names
