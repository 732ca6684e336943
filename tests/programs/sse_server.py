"""An OpenAI-compatible streaming server with no request hooks: an asyncio HTTP/1.1 server
(standard library) whose engine loop runs model steps (``tuiprof.step``, a sleep each) and
gives every active request one token a step. ``POST /v1/completions`` and
``/v1/chat/completions`` stream server-sent events in chunked transfer (``"stream": true``,
with a ``usage`` chunk when ``stream_options.include_usage``) or answer one JSON body;
``GET /health`` answers ``ok``. Keep-alive as HTTP/1.1 says. Runs the same with or without
tuiprof (the marks then do nothing).

    python sse_server.py --port P [--tokens N] [--step-ms MS] [--requests N]

``--requests N``: exit after N generation requests were answered (0: until Ctrl-C)."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

try:
    import tuiprof
except ImportError:   # the bench runs it without tuiprof on the path
    tuiprof = None


class Engine:
    def __init__(self, step_ms: float) -> None:
        self.step_s = step_ms / 1e3
        self.active: dict[int, asyncio.Queue] = {}
        self.wake = asyncio.Event()
        self.n = 0

    def add(self, tokens: int) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self.n += 1
        self.active[self.n] = q
        q.left = tokens        # type: ignore[attr-defined]
        self.wake.set()
        return q

    async def run(self) -> None:
        while True:
            if not self.active:
                self.wake.clear()
                await self.wake.wait()
            batch = list(self.active.items())
            if tuiprof is not None:
                with tuiprof.step("decode", tokens=len(batch)):
                    time.sleep(self.step_s)      # the model's step (the loop waits, as in a server)
            else:
                time.sleep(self.step_s)
            for rid, q in batch:
                q.left -= 1
                q.put_nowait(q.left)
                if q.left <= 0:
                    del self.active[rid]
            await asyncio.sleep(0)


async def read_request(reader: asyncio.StreamReader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return method, path, headers, body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def serve(engine: Engine, args, done: asyncio.Event, counter: list,
                reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                method, path, headers, body = await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                return
            if method == "GET":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: 3\r\n\r\nok\n")
                await writer.drain()
                continue
            req = json.loads(body or b"{}")
            n = int(req.get("max_tokens") or args.tokens)
            chat = path.endswith("chat/completions")
            q = engine.add(n)
            if req.get("stream"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
                await writer.drain()
                for i in range(n):
                    left = await q.get()
                    fin = "length" if left <= 0 else None
                    choice = ({"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": fin}
                              if chat else {"index": 0, "text": f" w{i}", "finish_reason": fin})
                    ev = {"id": "c", "object": "chat.completion.chunk" if chat else
                          "text_completion", "choices": [choice]}
                    writer.write(chunk(b"data: " + json.dumps(ev).encode() + b"\n\n"))
                    await writer.drain()
                if (req.get("stream_options") or {}).get("include_usage"):
                    use = {"id": "c", "choices": [], "usage": {
                        "prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}}
                    writer.write(chunk(b"data: " + json.dumps(use).encode() + b"\n\n"))
                writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                await writer.drain()
            else:
                for _ in range(n):
                    await q.get()
                out = json.dumps({"id": "c", "choices": [{"index": 0, "text": " w" * n,
                                  "finish_reason": "length"}], "usage": {
                    "prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(out), out))
                await writer.drain()
            counter[0] += 1
            if args.requests and counter[0] >= args.requests:
                done.set()
    finally:
        writer.close()


async def main(args) -> None:
    engine = Engine(args.step_ms)
    done = asyncio.Event()
    counter = [0]
    server = await asyncio.start_server(
        lambda r, w: serve(engine, args, done, counter, r, w), "127.0.0.1", args.port)
    asyncio.get_running_loop().create_task(engine.run())
    print(f"serving on 127.0.0.1:{args.port}", flush=True)
    async with server:
        await done.wait()
    print(f"served {counter[0]} requests", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--step-ms", type=float, default=3.0)
    p.add_argument("--requests", type=int, default=0)
    try:
        asyncio.run(main(p.parse_args()))
    except KeyboardInterrupt:
        sys.exit(0)
