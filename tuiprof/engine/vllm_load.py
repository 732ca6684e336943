"""``tuiprof serve --engine vllm``'s program: vLLM's OpenAI server started as a child process
(tuiprof follows it, its engine core and workers), driven by a real HTTP client from this
process with generated load, then stopped as a user stops it (Ctrl-C).

The load is ``tuiprof serve``'s (:mod:`tuiprof.engine.serve_load`): an open loop (Poisson
arrivals at ``--rate``) or a closed one (``--concurrency`` in flight), ``--requests`` or
``--duration``, prompt and output lengths drawn per request. Each request is a streaming
``/v1/completions`` whose prompt is a list of token ids (so its length is exact whatever the
tokenizer) with ``ignore_eos`` (so its output length is the drawn one), sent over a
plain socket (:mod:`.wire_client`: timed by the kernel's stamps too) with an ``X-Request-Id`` (``tuiprof-warmup-0``, … for the warm-up ones,
then ``r0``, ``r1``, …); the warm-up ones also send ``X-Tuiprof-Warmup: 1``. Both keep them
apart from every count (:mod:`tuiprof.program.vllm_requests`): the header in the API server,
the id in the engine core too (vLLM's request id is made from it, and the engine core sees no
header). Standard library only, besides
vLLM in the server's process: it runs in the Python that has vLLM (``TUIPROF_VLLM_PYTHON``)."""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import wire_client
from .lengths import default_load, parse_lengths

READY = "tuiprof-serve: load starts"
# the X-Request-Id prefix of the warm-up requests (tuiprof.program.vllm_requests.WARMUP_ID; this
# program runs in vLLM's Python without tuiprof's session modules, so it is spelled here)
WARMUP_ID = "tuiprof-warmup-"
UP_TIMEOUT_S = 600


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tuiprof.engine.vllm_load")
    p.add_argument("--model", required=True, help="a local Hugging Face directory")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--python", default=sys.executable,
                   help="the Python that has vLLM (tuiprof runs this program in its own)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, default=None)
    load.add_argument("--concurrency", type=int, default=None)
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--duration", type=float, default=None)
    p.add_argument("--prompt-len", type=parse_lengths, default=parse_lengths("64"))
    p.add_argument("--output-len", type=parse_lengths, default=parse_lengths("64"))
    p.add_argument("--max-batch-tokens", type=int, default=None,
                   help="vLLM's --max-num-batched-tokens")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="vLLM's --num-gpu-blocks-override")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--server-arg", action="append", default=[],
                   help="one more argument for vLLM's server (again for more)")
    return p


def server_command(args: argparse.Namespace) -> list[str]:
    cmd = [args.python, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
           "--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
           "--enforce-eager", "--host", "127.0.0.1", "--port", str(args.port)]
    if args.max_batch_tokens:
        cmd += ["--max-num-batched-tokens", str(args.max_batch_tokens)]
    if args.num_blocks:
        cmd += ["--num-gpu-blocks-override", str(args.num_blocks)]
    return cmd + list(args.server_arg)


class Client:
    """Streaming completions against the server; what each request saw: ``seen[id]`` =
    (TTFT ms, end-to-end ms, output tokens) by this program's clock."""

    def __init__(self, port: int, model: str, vocab: int, seed: int, prompt, output) -> None:
        self.port, self.model, self.vocab = port, model, vocab
        self.rng = random.Random(seed)
        self.prompt, self.output = prompt, output
        self.lock = threading.Lock()
        self.seen: dict[str, tuple] = {}
        # id -> (wall-clock ns before connecting, after the last read, the kernel's stamps of
        # the request's last byte leaving and the answer's last bytes arriving): where a
        # request's time lies against a profiler's records on the same host's clock
        self.wall: dict[str, tuple] = {}
        # id -> (ttft, e2e) ms between those two stamps: the request as the wire saw it, the
        # client's own delays left out (wire_client)
        self.wire: dict[str, tuple] = {}
        self.failed = 0
        self.n = 0          # requests sent
        self.k = 0          # ids given (r0, r1, ...; warm-up requests are named apart)
        self.done = threading.Semaphore(0)
        wire_client.keep_stamping()     # before the first request, not inside its time

    def submit(self, rid: str | None = None, warmup: bool = False) -> None:
        """Send one request (``warmup``: it only warms the server up, and says so in its
        ``X-Tuiprof-Warmup`` header, so that tuiprof keeps it apart from every count)."""
        with self.lock:
            if rid is None:
                rid = f"r{self.k}"
                self.k += 1
            self.n += 1
            n_in, n_out = self.prompt.draw(self.rng), self.output.draw(self.rng)
            ids = [self.rng.randrange(10, self.vocab) for _ in range(n_in)]
        threading.Thread(target=self._one, args=(rid, ids, n_out, warmup), daemon=True).start()

    def _one(self, rid: str, ids: list, n_out: int, warmup: bool = False) -> None:
        body = json.dumps({"model": self.model, "prompt": ids, "max_tokens": n_out,
                           "stream": True, "ignore_eos": True, "temperature": 0.0,
                           "stream_options": {"include_usage": True}}).encode()
        headers = {"Content-Type": "application/json", "X-Request-Id": rid}
        if warmup:
            headers["X-Tuiprof-Warmup"] = "1"
        try:
            r = wire_client.stream(self.port, "/v1/completions", body, headers)
            if r["status"] != 200:
                raise RuntimeError(f"HTTP {r['status']}")
            # the output tokens the server says it sent (its last chunk's usage): vLLM merges
            # tokens into one chunk when its client reads slower than they come
            chunks = tokens = 0
            for ev in wire_client.sse_events(r["body"]):
                doc = json.loads(ev)
                chunks += bool(doc.get("choices"))
                if doc.get("usage"):
                    tokens = doc["usage"].get("completion_tokens") or 0
            first = r["t_first"]
            with self.lock:
                self.wall[rid] = (r["w0"], r["w1"], r["sent_ns"], r["last_ns"])
                self.seen[rid] = ((first - r["t0"]) * 1e3 if first else None,
                                  (r["t1"] - r["t0"]) * 1e3, tokens or chunks)
                self.wire[rid] = wire_client.wire_ms(r)
        except Exception:
            with self.lock:
                self.failed += 1
        finally:
            self.done.release()

    def collect(self, n: int) -> int:
        for _ in range(n):
            self.done.acquire()
        return n


def wait_up(port: int, proc: subprocess.Popen, timeout: float = UP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/v1/models")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"tuiprof serve: vLLM's server exited (status {proc.returncode})"
                             " before it answered: its output is above")
        if time.monotonic() > deadline:
            raise SystemExit(f"tuiprof serve: vLLM's server did not answer in {timeout:g} s")
        time.sleep(0.5)


def stop(proc: subprocess.Popen) -> int:
    """Ctrl-C, as a user stops vLLM's server; SIGKILL after 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def run(args: argparse.Namespace) -> dict:
    cfg = json.loads((Path(args.model) / "config.json").read_text())
    vocab = int(cfg.get("vocab_size") or 1000)
    proc = subprocess.Popen(server_command(args))
    try:
        wait_up(args.port, proc)
        client = Client(args.port, args.model, vocab, args.seed, args.prompt_len,
                        args.output_len)
        for i in range(max(0, args.warmup)):
            client.submit(f"{WARMUP_ID}{i}", warmup=True)
        client.collect(max(0, args.warmup))
        print(READY, flush=True)
        t0 = time.monotonic()
        limit = args.requests or None
        end = t0 + args.duration if args.duration else None
        if args.rate:
            sent, nxt = 0, t0
            while (limit is None or sent < limit) and (end is None or nxt < end):
                time.sleep(max(0.0, nxt - time.monotonic()))
                client.submit()
                sent += 1
                nxt += client.rng.expovariate(args.rate)
            client.collect(sent)
        else:
            sent = in_flight = 0
            while in_flight < (args.concurrency or 1) and (limit is None or sent < limit):
                client.submit()
                sent += 1
                in_flight += 1
            while in_flight:
                in_flight -= client.collect(1)
                if (limit is None or sent < limit) and (end is None or
                                                        time.monotonic() < end):
                    client.submit()
                    sent += 1
                    in_flight += 1
        wall = time.monotonic() - t0
    finally:
        status = stop(proc)
    n = client.n - max(0, args.warmup)
    e2e = sorted(v[1] for k, v in client.seen.items() if not k.startswith(WARMUP_ID))
    return {"requests": n, "failed": client.failed, "wall_s": wall,
            "requests_per_s": n / wall if wall else 0.0, "server_status": status,
            "client_e2e_p50_ms": e2e[len(e2e) // 2] if e2e else None,
            "client": {k: list(v) for k, v in client.seen.items()},
            # the same requests between the kernel's stamps of their bytes (wire_client)
            "client_wire": {k: list(v) for k, v in client.wire.items()}}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    default_load(args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    summary = run(args)
    print("tuiprof-serve: done " + json.dumps(summary), flush=True)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
