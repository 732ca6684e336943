"""The load client's two clocks (``tuiprof.engine.wire_client``) against a real uvicorn server
streaming server-sent events: the wire's interval (the kernel's stamps of the request's last
byte leaving and of the answer's last bytes arriving) holds none of the client's own lateness,
the client program's interval holds all of it.

The server notes on its clock when it had the request's body and when its last chunk was
written; the client's reading is held back 300 ms after the server's end (as a client thread
waiting for a core or the GIL would be). Every check is an ordering of events on the host's one
clock, against a hold of 300 ms, not a timing target."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tuiprof.engine import wire_client

from .transformers_server import free_port

APP = textwrap.dedent('''
    import asyncio, json, os, time

    OUT = os.environ["WIRE_TEST_OUT"]

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        got = time.time_ns()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(3):
            doc = {"choices": [{"text": f"t{i}"}]}
            await send({"type": "http.response.body", "more_body": True,
                        "body": b"data: " + json.dumps(doc).encode() + b"\\n\\n"})
            await asyncio.sleep(0.05)
        last = b'data: {"choices": [], "usage": {"completion_tokens": 3}}\\n\\ndata: [DONE]\\n\\n'
        await send({"type": "http.response.body", "body": last, "more_body": False})
        done = time.time_ns()
        with open(OUT + ".tmp", "w") as f:
            json.dump({"got": got, "done": done, "request": body.decode()}, f)
        os.replace(OUT + ".tmp", OUT)
''')


def test_the_wire_leaves_the_clients_own_lateness_out(tmp_path):
    (tmp_path / "wire_app.py").write_text(APP)
    out = tmp_path / "server.json"
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "wire_app:app", "--host", "127.0.0.1", "--port",
         str(port), "--log-level", "warning"], cwd=tmp_path,
        env={"WIRE_TEST_OUT": str(out), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = wire_client.stream(port, "/up", b"{}", {}, timeout=5)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()
                assert time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.2)
        out.unlink()
        # one connection at a time, none overlapping: each still has all three stamps (the
        # kernel stamps arriving packets only while a socket asks; wire_client keeps one)
        for i in range(25):
            seq = wire_client.stream(port, "/seq", b"{}", {}, timeout=30)
            assert None not in (seq["sent_ns"], seq["first_ns"], seq["last_ns"]), (i, seq)
            out.unlink()
            time.sleep(0.06)

        held = {}

        def late_reader():
            # the client's thread busy elsewhere until well after the server's last write
            while not out.exists():
                time.sleep(0.01)
            time.sleep(0.3)
            held["until"] = time.time_ns()

        body = json.dumps({"prompt": "x" * 100}).encode()
        r = wire_client.stream(port, "/v1/completions", body, {"X-Request-Id": "w1"},
                               timeout=30, on_first=late_reader)
    finally:
        server.terminate()
        server.wait(10)
    srv = json.loads(out.read_text())
    assert r["status"] == 200
    assert json.loads(srv["request"]) == {"prompt": "x" * 100}
    events = wire_client.sse_events(r["body"])       # de-chunked, [DONE] left out
    assert [json.loads(e)["choices"][0]["text"] for e in events[:3]] == ["t0", "t1", "t2"]
    assert json.loads(events[3])["usage"]["completion_tokens"] == 3 and len(events) == 4
    # the wire: the request left before the server had it; the answer's last bytes came as
    # the server wrote them (the kernel's delivery on loopback: well under the 5 ms allowed),
    # not when the client read them
    assert r["w0"] <= r["sent_ns"] <= srv["got"]
    assert r["first_ns"] <= r["last_ns"] <= srv["done"] + 5e6
    # the client program read them only once its thread was back: 300 ms and more later
    assert held["until"] - r["last_ns"] >= 300e6 and r["w1"] >= held["until"]
    ttft, e2e = wire_client.wire_ms(r)
    assert 0 < ttft <= e2e
    assert e2e >= 150          # the server's three 50 ms pauses lie between the two stamps
    assert (r["t1"] - r["t0"]) * 1e3 - e2e >= 300     # the program's clock holds the lateness


def test_a_server_that_closes_at_once_is_one_line(tmp_path):
    import socket  # noqa: PLC0415
    import threading  # noqa: PLC0415

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def close_at_once():
        c, _ = srv.accept()
        c.recv(65536)
        c.close()

    threading.Thread(target=close_at_once, daemon=True).start()
    try:
        wire_client.stream(srv.getsockname()[1], "/", b"", {}, timeout=10)
    except ConnectionError as exc:
        assert "before its answer's head" in str(exc)
    else:
        raise AssertionError("no error for a connection closed without an answer")
    finally:
        srv.close()


def test_the_module_is_standard_library_only():
    # it runs in vLLM's Python too, where tuiprof's dependencies may be missing
    src = Path(wire_client.__file__).read_text()
    imports = {ln.split()[1].split(".")[0] for ln in src.splitlines()
               if ln.startswith(("import ", "from ")) and not ln.startswith("from __future__")}
    assert imports <= {"socket", "struct", "time"}, imports
