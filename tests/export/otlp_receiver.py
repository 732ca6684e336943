"""A local OTLP/HTTP receiver on 127.0.0.1: it decodes what arrives with opentelemetry-proto."""
from __future__ import annotations

import http.server
import threading
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)


class Receiver:
    """``spans``: (resource attributes, span) for every span received; ``delay_s`` holds each
    answer back (a slow collector)."""

    def __init__(self, port: int, delay_s: float = 0.0) -> None:
        self.spans: list = []
        self.posts = 0
        self.delay_s = delay_s
        self.release = threading.Event()
        rx = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                for rs in req.resource_spans:
                    res = {a.key: _value(a.value) for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        for sp in ss.spans:
                            rx.spans.append((res, sp))
                rx.posts += 1
                if rx.delay_s:
                    rx.release.wait(rx.delay_s)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{port}"

    def wait_for(self, n: int, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while len(self.spans) < n and time.monotonic() < end:
            time.sleep(0.05)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attrs(span) -> dict:
    return {a.key: _value(a.value) for a in span.attributes}
