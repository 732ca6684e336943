"""What the streaming proxy (``tuiprof run --proxy``) adds to each streamed chunk: client ->
proxy -> a local streaming server against client -> the server directly, interleaved.

The server (a process of its own, asyncio, standard library) answers each request with
``--chunks`` server-sent events in chunked transfer, ``--gap-ms`` apart, each stamped with
``time.time_ns()`` just before it is written. The client (this process, a raw socket, one
keep-alive connection per path) notes when each chunk arrived; a chunk's latency is arrival
minus stamp (one machine, one clock). Requests alternate between the two paths (direct,
proxied, proxied, direct, ...), so that the machine's load falls on both alike. The proxy is
the one ``tuiprof run`` starts (a process of its own, its records applied to a real
``RequestBook`` here). Reported: each path's per-chunk p50/p90/p99 and the proxy's added
latency at p50 and p99 (proxied minus direct), in µs, and what the proxy recorded.

    python bench/overhead/proxy_latency.py [--rounds 40] [--chunks 50] [--gap-ms 2]
        [--port 18340] [--json OUT]
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STAMP = re.compile(rb'"t": (\d+)')


def serve(port: int, chunks: int, gap_s: float) -> None:
    """The streaming server (run as ``--serve``)."""
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                n = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        n = int(line.split(b":")[1])
                await r.readexactly(n)
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n")
                for i in range(chunks):
                    await asyncio.sleep(gap_s)
                    ev = (b'data: {"choices": [{"index": 0, "text": " w%d"}], "t": %d}\n\n'
                          % (i, time.time_ns()))
                    w.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                w.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def one_request(sock: socket.socket, chunks: int) -> list[int]:
    """Send one request on ``sock`` and return each chunk's latency (ns)."""
    body = b'{"stream": true}'
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    out: list[int] = []
    buf = b""
    while not buf.endswith(b"0\r\n\r\n"):
        b = sock.recv(65536)
        t = time.time_ns()
        if not b:
            raise ConnectionError("the connection closed")
        buf += b
        for m in STAMP.finditer(b):   # stamps are short: one never straddles two reads here
            out.append(t - int(m.group(1)))
    if len(out) != chunks:
        raise RuntimeError(f"{len(out)} chunks, expected {chunks}")
    return out


def pct(values: list, q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(q * (len(s) - 1) + 0.5)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=40, help="requests per path")
    p.add_argument("--chunks", type=int, default=50, help="chunks per request")
    p.add_argument("--gap-ms", type=float, default=2.0, help="the server's gap between chunks")
    p.add_argument("--port", type=int, default=18340, help="the server's port (the proxy: +1)")
    p.add_argument("--in-thread", action="store_true",
                   help="the proxy on a thread of this process instead of its own process")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        serve(a.port, a.chunks, a.gap_ms / 1e3)
        return 0

    from tuiprof.collect.proxy_process import make_proxy  # noqa: PLC0415
    from tuiprof.store.requests import RequestBook  # noqa: PLC0415

    server = subprocess.Popen([sys.executable, __file__, "--serve", "--port", str(a.port),
                               "--chunks", str(a.chunks), "--gap-ms", str(a.gap_ms)],
                              stdout=subprocess.PIPE, text=True)
    book = RequestBook(keep=10 * a.rounds)
    proxy = make_proxy(book, f"{a.port + 1}={a.port}", own_process=not a.in_thread)
    lat: dict[str, list[int]] = {"direct": [], "proxied": []}
    try:
        assert server.stdout.readline().strip() == "ready"
        proxy.start()
        socks = {}
        for name, port in (("direct", a.port), ("proxied", a.port + 1)):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks[name] = s
        for name in ("direct", "proxied"):   # a warm-up request each, not counted
            one_request(socks[name], a.chunks)
        for i in range(a.rounds):
            order = ("direct", "proxied") if i % 2 == 0 else ("proxied", "direct")
            for name in order:
                lat[name] += one_request(socks[name], a.chunks)
        for s in socks.values():
            s.close()
        time.sleep(0.5)
    finally:
        proxy.stop()
        server.terminate()
        server.wait(10)
    view = book.view()
    fin = [r for r in view.rows if r.status == "finished"]
    res = {"date": datetime.date.today().isoformat(), "host": platform.node(),
           "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "load": os.getloadavg(), "python": platform.python_version(),
           "rounds": a.rounds, "chunks": a.chunks, "gap_ms": a.gap_ms,
           "proxy": "thread" if a.in_thread else "process",
           "command": "python bench/overhead/proxy_latency.py " + " ".join(sys.argv[1:])}
    for name, v in lat.items():
        us = [x / 1e3 for x in v]
        res[name] = {"chunks": len(us), "p50_us": pct(us, 0.5), "p90_us": pct(us, 0.9),
                     "p99_us": pct(us, 0.99), "max_us": max(us)}
    res["added_p50_us"] = res["proxied"]["p50_us"] - res["direct"]["p50_us"]
    res["added_p99_us"] = res["proxied"]["p99_us"] - res["direct"]["p99_us"]
    res["recorded"] = {"requests": len(fin), "tokens": sum(r.output_tokens for r in fin),
                       "proxy": proxy.stats()}
    print(f"per-chunk latency, {a.rounds} requests x {a.chunks} chunks a path, interleaved "
          f"(load {res['load'][0]:.1f} on {res['cores']} cores):")
    for name in ("direct", "proxied"):
        r = res[name]
        print(f"  {name:<8} p50 {r['p50_us']:8.1f} µs  p90 {r['p90_us']:8.1f} µs  p99 "
              f"{r['p99_us']:8.1f} µs  max {r['max_us']:8.1f} µs")
    print(f"  added by the proxy: p50 {res['added_p50_us']:+.1f} µs, p99 "
          f"{res['added_p99_us']:+.1f} µs")
    print(f"  recorded: {len(fin)} requests, {res['recorded']['tokens']} token chunks "
          f"(the warm-up included)")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
