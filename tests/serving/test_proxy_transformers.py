"""The proxy in front of a real server whose requests tuiprof also hooks: ``transformers serve
DIR --continuous-batching`` on 127.0.0.1 under ``tuiprof run --headless --proxy
LISTEN=UPSTREAM``, driven through LISTEN by the OpenAI client (streaming completions, each
with its X-Request-ID). Both the engine's hooks and the proxy see the same requests: every
request is in both, with the same output tokens, every chunk the client got timed, the proxy's
arrival before the server's app saw it, the steps that served it among those joined by time,
and its rows and finding say they were seen from outside the engine.

The two views time different points: the hooks' TTFT ends where the engine hands its first
token over, the proxy's where it reads the chunk. The hooks also time when their server wrote
the first token's bytes and the last bytes, so both views measure the same interval, and what
lies between them is phases, each in causal order on the one clock: the proxy's arrival, the
server reading the request, the engine's first token, its bytes written, the proxy reading
them; the engine's finish, the last bytes written, the proxy's end. How long those phases take
is a timing figure, printed here and measured by ``bench/verify/proxy_vs_hooks.py`` (targets
live in bench/)."""
from __future__ import annotations

import json
import time

import pytest

from tuiprof.engine.model_dir import make_tiny_model_dir, prompt_words

from .transformers_server import at_once, openai_client, transformers_serve

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

N, MAX_TOKENS = 10, 8
# between two requests sent one at a time: a request sent as the last response ends waits for
# the server's event loop to finish that response (its own work, docs/results.md), a phase
# neither view can attribute
GAP_S = 0.1


@pytest.mark.slow
def test_proxy_and_hooks_agree_on_the_same_requests(tmp_path):
    model = make_tiny_model_dir(tmp_path / "tiny")
    snap = tmp_path / "serve.json"
    seen: dict[str, int] = {}
    # clients go through the proxy (502s until the server behind it is up)
    with transformers_serve(model, snap, tmp_path, proxy=True) as served:
        client = openai_client(openai, served.port)

        def one(rid: str, usage: bool) -> None:
            stream = client.completions.create(
                model=str(model), prompt=prompt_words(12, seed=len(seen), size=1024),
                max_tokens=MAX_TOKENS, stream=True, extra_headers={"X-Request-ID": rid},
                stream_options={"include_usage": True} if usage else None)
            seen[rid] = sum(1 for c in stream if c.choices and c.choices[0].text)

        one("warmup", True)   # the first request starts continuous batching
        for k in range(N):    # one at a time, then two at once
            time.sleep(GAP_S)  # each meets an idle server, not the last response's tail
            one(f"req{k}", k % 2 == 0)
        at_once(one, [(f"pair{i}", True) for i in range(2)])
    out = served.printed()
    assert len(seen) == N + 3, out[-3000:]
    doc = json.loads(snap.read_text())
    reqs = {r["id"]: r for r in doc["requests"]}
    hooks = {k: r for k, r in reqs.items() if r["source"] == "transformers serve"}
    proxied = {k[len("proxy:"):]: r for k, r in reqs.items() if r["source"] == "proxy"}
    assert sorted(hooks) == sorted(seen) and sorted(proxied) == sorted(seen), (
        sorted(reqs), out[-2000:])
    for rid, chunks in seen.items():
        p, h = proxied[rid], hooks[rid]
        assert p["status"] == "finished" and p["http_status"] == 200
        assert p["output_tokens"] == h["output_tokens"] == MAX_TOKENS
        if p["tokens_from"] == "usage":
            assert p["prompt_tokens"] == h["prompt_tokens"] == 12
        else:   # no usage: the chunks with text are counted, the prompt unknown
            assert p["tokens_from"] == "chunks" and p["prompt_tokens"] == 0
        assert chunks == len(p["token_ns"])       # every chunk the client got, timed
        assert p["queue_ms"] is None and p["first_step_ns"] == 0   # no queue from outside
        assert p["arrival_ns"] <= h["arrival_ns"]   # the proxy forwards it to the server's app
        assert set(p["steps"]) & set(h["steps"])   # joined by time: the steps that served it
        assert 0 < p["ttft_ms"] <= p["e2e_ms"]
    # the same interval on both sides: the phases between the two views, in causal order
    same_ttft, same_e2e, into, after, back = [], [], [], [], []
    for rid in seen:
        p, h = proxied[rid], hooks[rid]
        assert h["wire_first_ns"] and h["wire_end_ns"], h
        assert p["arrival_ns"] <= h["arrival_ns"] <= h["token_ns"][0] <= h["wire_first_ns"]
        assert h["wire_first_ns"] <= p["token_ns"][0], (rid, h, p)   # written, then read
        assert h["finish_ns"] <= h["wire_end_ns"] <= p["finish_ns"], (rid, h, p)
        assert h["after_engine_ms"] == (h["wire_first_ns"] - h["token_ns"][0]) / 1e6
        into.append((h["arrival_ns"] - p["arrival_ns"]) / 1e6)
        after.append(h["after_engine_ms"])
        back.append((p["token_ns"][0] - h["wire_first_ns"]) / 1e6)
        same_ttft.append(p["ttft_ms"] - (h["wire_first_ns"] - h["arrival_ns"]) / 1e6)
        same_e2e.append(p["e2e_ms"] - (h["wire_end_ns"] - h["arrival_ns"]) / 1e6)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    print(f"p50 of {len(seen)} requests, ms: the proxy minus the hooks over the same interval: "
          f"TTFT {med(same_ttft):.2f}, end to end {med(same_e2e):.2f}; the proxy's arrival to "
          f"the server reading it {med(into):.2f}; the engine's first token to its bytes "
          f"written {med(after):.2f}; written to read by the proxy {med(back):.2f}")
    assert doc["meta"]["request_sources"] == {"transformers serve": N + 3, "proxy": N + 3}
    assert doc["meta"]["proxy"]["requests"] == N + 3
    assert not doc["request_stats"]["misuse"]
    assert "seen through the proxy, from outside the engine" in out
    ids = [f["id"] for f in doc["findings"]]
    assert "requests-from-outside" in ids
    f = next(f for f in doc["findings"] if f["id"] == "requests-from-outside")
    assert "no queue time" in f["title"] and f["numbers"]["matched"] == N + 3
    assert f["numbers"]["ttft_minus_hooks_wire_p50_ms"] is not None
    assert "over the same interval" in f["evidence"]
