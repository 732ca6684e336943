"""A real server and a real client: ``transformers serve DIR --continuous-batching`` on
127.0.0.1 under ``tuiprof run --headless``, driven by the OpenAI client (streaming
completions), stopped with Ctrl-C once the client is done. The model directory has random
weights and a tokenizer trained here (nothing downloaded)."""
from __future__ import annotations

import json
import time

import pytest

from tuiprof.engine.model_dir import make_tiny_model_dir, prompt_words

from .transformers_server import at_once, openai_client, transformers_serve

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

N, MAX_TOKENS = 4, 8


def _traceparent(rid: str) -> str:
    """A W3C trace context per request (the client's trace the request's span joins)."""
    return f"00-{rid.encode().hex():0>32}-{'ab' * 8}-01"


@pytest.mark.slow
def test_transformers_serve_under_tuiprof_with_a_real_client(tmp_path):
    model = make_tiny_model_dir(tmp_path / "tiny")
    snap = tmp_path / "serve.json"
    seen: dict[str, tuple[float, float, int]] = {}
    with transformers_serve(model, snap, tmp_path) as served:
        client = openai_client(openai, served.port)

        def one(rid: str) -> None:
            t0 = time.perf_counter()
            first, chunks = None, 0
            stream = client.completions.create(
                model=str(model), prompt=prompt_words(12, seed=len(seen), size=1024),
                max_tokens=MAX_TOKENS, stream=True,
                extra_headers={"X-Request-ID": rid, "traceparent": _traceparent(rid)})
            for _ in stream:
                first = first or time.perf_counter()
                chunks += 1
            seen[rid] = ((first - t0) * 1e3, (time.perf_counter() - t0) * 1e3, chunks)

        one("warmup")   # the first request starts continuous batching
        at_once(one, [(f"req{i}",) for i in range(N)])
    out = served.printed()
    assert len(seen) == N + 1, out[-3000:]
    doc = json.loads(snap.read_text())
    reqs = {r["id"]: r for r in doc["requests"]}
    assert sorted(reqs) == sorted(seen), (sorted(reqs), out[-2000:])
    for rid, (c_ttft, c_e2e, chunks) in seen.items():
        r = reqs[rid]
        assert r["source"] == "transformers serve" and r["status"] == "finished"
        assert r["traceparent"] == _traceparent(rid)    # the HTTP header, kept (--otlp)
        assert r["output_tokens"] == MAX_TOKENS and r["prompt_tokens"] == 12
        assert chunks >= MAX_TOKENS                        # one chunk per token (+ the last)
        assert r["queued_ns"] >= r["arrival_ns"]           # HTTP, then the engine's queue
        assert 0 < r["ttft_ms"] <= r["e2e_ms"]
        # the client also counts HTTP, the SSE stream and detokenisation: it sees more
        assert c_ttft >= r["ttft_ms"] - 2.0 and c_e2e >= r["e2e_ms"] - 2.0, (rid, c_ttft, r)
    assert doc["meta"]["request_sources"] == {"transformers serve": N + 1}
    assert doc["request_stats"]["counts"]["finished"] == N + 1
    assert not doc["request_stats"]["misuse"]
    assert any(t.get("requests") for t in doc["tokens"])
