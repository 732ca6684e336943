"""What tuiprof costs a real HTTP server, as the server's own clients see it, beside what each
session says it costs.

``transformers serve DIR --continuous-batching`` runs bare and under tuiprof, in each way asked
(``--modes``):

* ``bare``: the server alone;
* ``live``: ``tuiprof run`` with the live app drawing at 200x50, in tmux when ``--tmux`` gives
  its command (as a user runs it), else in a pseudo-terminal of that size;
* ``headless``: ``tuiprof run --headless`` at its default (kernels sampled in bursts, as live);
* ``every``: ``tuiprof run --headless --sample-every 1`` (every step traced);
* ``leave``: the profiler left on: ``tuiprof run --detach`` (a keeper, no UI attached, the
  live app's bursts), stopped with ``tuiprof stop``.

Each round starts one server of every way (together: their loads overlap), warms them up
alike (the capacity probe's burst, then a few requests each, together), then drives each in
turn at every rate, the ways in an order rotated by one every round and reversed every other
(each way takes each place in turn), and stops them: every round has fresh processes, so the
spread over rounds holds the process-to-process spread too. ``--keep-servers`` starts them
once for every round instead: a device call's budget then buys cells long enough to resolve
5 % (the start of five servers took 20-60 s a round on the H200), and a way whose server was
not up in time joins at the next round it answers by. The load comes from a
client in a process of its own that knows nothing of tuiprof (``serve_external.py client``):
open loop, Poisson arrivals (the same arrival times for every server of a round and rate),
streaming ``/v1/completions`` with an ``X-Request-ID`` per request. Each cell is paired with
the bare server's cell of the same round and rate.

Reports, per rate and way, the ratios to bare (median over rounds, min-max spread; the ratio
of totals for throughput, pooled p50s for latencies) of: throughput (output tokens/s over the
load's wall time), TTFT p50/p99, end-to-end p50/p99 and TPOT p50 (each request's time per
output token after its first) as the client measured them; bare's own spread over rounds;
and each session's own overhead figure over the cell's load (the rise of its cost over the
time, from the snapshot's ``overhead.series``) beside the client's cost (1 - throughput ratio,
and per token: 1 - 1/TPOT ratio). Results are written as each cell ends: ``OUT/cells.jsonl``,
``OUT/summary.md`` and ``OUT/summary.json``; the live app's screens to ``OUT/screens.txt``;
each session's steps by phase and CUPTI state, its overhead report and CUPTI events to
``OUT/sessions.jsonl`` (figures: ``serve_external_stats.py``).

    python bench/overhead/serve_external.py --model-dir DIR --device cuda --rates auto:0.25,0.8 \\
        --requests 16,40 --output-len 32 --rounds 5 --keep-servers --every-rounds 2 \\
        --modes bare,live,headless,leave,every --deadline 460 --out out/serve_external

``--rates auto:F1,F2`` measures the bare server's capacity first (a burst of ``--probe``
requests at once, the first round) and drives it at those fractions of it. ``--deadline S``
starts no round and no cell that would end past S seconds from the start; every phase has a
timeout of its own (``--start-timeout``, a cell's from its size, a stop's ``--stop-grace``).
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_external_stats import (MODES, cell_figures, report, summarize,  # noqa: E402
                                  window_pct)
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


# ----------------------------------------------------------------------------- the client
def _prompt(words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def _one(port: int, body: bytes, rid: str, t_send: float, t0: float) -> dict:
    """One streaming request, timed from when it was due (open loop: a late send counts)."""
    loop = asyncio.get_running_loop()
    delay = t_send - (loop.time() - t0)
    if delay > 0:
        await asyncio.sleep(delay)
    start = t_send
    rec = {"id": rid, "due_s": t_send, "ok": False, "tokens": 0}
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                f"X-Request-ID: {rid}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n").encode()
        writer.write(head + body)
        await writer.drain()
        status = await reader.readline()
        rec["status"] = status.decode(errors="replace").split(" ", 2)[1] if status else ""
        chunked = False
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            if line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower():
                chunked = True
        buf = b""
        while True:
            if chunked:
                size_line = await reader.readline()
                if not size_line:
                    break
                size = int(size_line.strip().split(b";")[0] or b"0", 16)
                if size == 0:
                    break
                data = await reader.readexactly(size + 2)
                buf += data[:-2]
            else:
                data = await reader.read(65536)
                if not data:
                    break
                buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                now = loop.time() - t0
                for ln in event.split(b"\n"):
                    if not ln.startswith(b"data:"):
                        continue
                    payload = ln[5:].strip()
                    if payload == b"[DONE]":
                        rec["ok"] = rec["tokens"] > 0
                        continue
                    try:
                        d = json.loads(payload)
                        text = d["choices"][0].get("text") or \
                            (d["choices"][0].get("delta") or {}).get("content") or ""
                    except (ValueError, KeyError, IndexError, TypeError):
                        continue
                    if text:
                        rec["tokens"] += 1
                        rec.setdefault("ttft_ms", (now - start) * 1e3)
                rec["last_s"] = now
        writer.close()
    except Exception as exc:  # a failed request is counted, never fatal
        rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
    end = loop.time() - t0
    rec["e2e_ms"] = (end - start) * 1e3
    rec["end_s"] = end
    if "ttft_ms" in rec:
        rec["ok"] = rec.get("ok") or rec["tokens"] > 0
    return rec


async def _load(port: int, model: str, rate: float, requests: int, prompt_words: int,
                output_len: int, seed: int, tag: str) -> dict:
    rng = random.Random(seed)
    t, due = 0.0, []
    for _ in range(requests):
        due.append(t)
        t += rng.expovariate(rate) if rate > 0 else 0.0
    loop = asyncio.get_running_loop()
    t0, t0_unix = loop.time(), time.time()
    tasks = []
    for i, d in enumerate(due):
        body = json.dumps({"model": model, "prompt": _prompt(prompt_words, rng),
                           "max_tokens": output_len, "stream": True, "temperature": 0.0,
                           }).encode()
        tasks.append(_one(port, body, f"{tag}-{i}", d, t0))
    recs = await asyncio.gather(*tasks)
    return {"t0_unix": t0_unix, "recs": recs}


def client_main(argv: list) -> int:
    ap = argparse.ArgumentParser(prog="serve_external.py client")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rate", type=float, required=True, help="req/s (0: all at once)")
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--prompt-words", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="r")
    a = ap.parse_args(argv)
    out = asyncio.run(_load(a.port, a.model, a.rate, a.requests, a.prompt_words,
                            a.output_len, a.seed, a.tag))
    print(json.dumps(out))
    return 0


# ----------------------------------------------------------------------------- the servers
_GIVEN: set = set()   # ports handed out in this run: never twice (rounds overlap)


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


class ClientFailed(Exception):
    """A cell's client failed or ran past its time: the cell is lost, the round goes on."""


class ServerDown(Exception):
    """A server that did not start or did not answer: its round goes on without it."""


def log_tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_bytes()[-4000:].decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(ln.strip() for ln in text.splitlines()[-lines:] if ln.strip())


class Server:
    """One ``transformers serve`` (bare or under tuiprof, in one of the ways)."""

    def __init__(self, mode: str, model_dir: Path, device: str, work: Path, env: dict,
                 extra: list, nvml: bool, tmux: list | None, tag: str) -> None:
        self.mode, self.port, self.tag = mode, free_port(), tag
        self.work = work
        serve = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model_dir),
                 "--continuous-batching", "--device", device, "--host", "127.0.0.1",
                 "--port", str(self.port), *extra]
        tp = [sys.executable, "-m", "tuiprof", "run"] + ([] if nvml else ["--no-nvml"])
        self.snap = work / f"tuiprof-{mode}-{tag}.json"
        self.exports = work / f"exports-{mode}-{tag}"
        self.exports.mkdir(exist_ok=True)
        cmd = {"bare": serve,
               "headless": [*tp, "--headless", "--json", str(self.snap), "--", "python",
                            *serve[1:]],
               "every": [*tp, "--headless", "--sample-every", "1", "--json", str(self.snap),
                         "--", "python", *serve[1:]],
               "live": [*tp, "--export-dir", str(self.exports), "--", "python", *serve[1:]],
               "leave": [*tp, "--detach", "--export-dir", str(self.exports), "--snapshot-every",
                         "0", "--", "python", *serve[1:]],
               }[mode]
        self.env = env
        self.log = open(work / f"server-{mode}-{tag}.log", "wb")
        self.master = None
        self.tmux = tmux
        self.sid = None
        self.proc = None
        self.screen = b""
        if mode == "live" and tmux:
            self.tsess = f"live{tag}"
            line = " ".join(shlex.quote(x) for x in cmd)
            subprocess.run([*tmux, "new-session", "-d", "-s", self.tsess, "-x", "200", "-y", "50",
                            f"cd {shlex.quote(str(work))} && exec {line}"],
                           env=dict(env, TERM="xterm-256color"), check=True, timeout=30)
        elif mode == "live":
            import fcntl  # noqa: PLC0415
            import pty  # noqa: PLC0415
            import struct  # noqa: PLC0415
            import termios  # noqa: PLC0415
            self.master, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
            self.proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave,
                                         env=dict(env, TERM="xterm-256color"), cwd=work,
                                         start_new_session=True)
            os.close(slave)
            self._drainer = threading.Thread(target=self._drain, daemon=True)
            self._drainer.start()
        elif mode == "leave":
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work,
                                 timeout=120)
            self.log.write((res.stdout + res.stderr).encode())
            if res.returncode != 0 or not res.stdout.strip():
                raise ServerDown(f"leave: tuiprof run --detach failed: {res.stderr[-300:]}")
            self.sid = res.stdout.strip().splitlines()[-1].strip()
        else:
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                         env=env, cwd=work, start_new_session=True)

    def _drain(self) -> None:
        """The live app's screen: read as a terminal would (kept: the last 64 KiB)."""
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                break
            if not data:
                break
            self.screen = (self.screen + data)[-65536:]

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self.mode == "live" and self.tmux:
            return subprocess.run([*self.tmux, "has-session", "-t", self.tsess],
                                  capture_output=True, timeout=10).returncode == 0
        return True   # a detached session: its server answers or not

    def wait_up(self, deadline: float) -> None:
        # asked at least once, even past the deadline: the servers are waited for in turn, and
        # one that used the whole wait must not leave the next unasked (an H200 run lost a
        # server that was up, its log said, behind one that was not)
        while True:
            if not self.alive():
                raise ServerDown(f"{self.mode}: the server ended: "
                                 f"{log_tail(self.work / f'server-{self.mode}-{self.tag}.log')}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2).read()
                return
            except Exception:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.5)
        logs = sorted(self.exports.glob("tuiprof-*.log")) if self.mode == "leave" else []
        raise ServerDown(f"{self.mode}: the server did not answer in time: "
                         f"{log_tail(logs[-1] if logs else self.work / f'server-{self.mode}-{self.tag}.log')}")

    def capture(self) -> str:
        """The live app's screen now (tmux), as a user sees it."""
        if self.mode != "live" or not self.tmux:
            return ""
        res = subprocess.run([*self.tmux, "capture-pane", "-p", "-t", self.tsess],
                             capture_output=True, text=True, timeout=10)
        return res.stdout

    def ask_stop(self) -> None:
        """As a user stops it: Ctrl-C; the live app's q; ``tuiprof stop`` for a detached one."""
        try:
            if self.mode == "live" and self.tmux:
                subprocess.run([*self.tmux, "send-keys", "-t", self.tsess, "q"], timeout=10,
                               capture_output=True)
            elif self.master is not None:
                os.write(self.master, b"q")
            elif self.mode == "leave":
                self._stopper = subprocess.Popen(
                    [sys.executable, "-m", "tuiprof", "stop", self.sid], stdout=self.log,
                    stderr=subprocess.STDOUT, env=self.env, cwd=self.work)
            elif self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGINT)
        except (OSError, subprocess.SubprocessError):
            pass

    def stop(self, grace: float) -> None:
        """After :meth:`ask_stop`: everything left once ``grace`` has passed is killed."""
        end = time.monotonic() + grace
        if self.proc is not None:
            try:
                self.proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                self.proc.wait(10)
        elif self.mode == "live":
            while self.alive() and time.monotonic() < end:
                time.sleep(0.3)
            if self.alive():
                subprocess.run([*self.tmux, "kill-session", "-t", self.tsess],
                               capture_output=True, timeout=10)
        elif self.mode == "leave":
            st = getattr(self, "_stopper", None)
            if st is not None:
                try:
                    st.wait(max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    st.kill()
        if self.master is not None:
            self._drainer.join(2)
            self.log.write(self.screen)
        self.log.close()

    def snapshot(self) -> dict | None:
        """The session's snapshot (headless: --json; live and leave: their export)."""
        paths = [self.snap] if self.mode in ("headless", "every") else \
            sorted(self.exports.glob("tuiprof-*.json"), key=lambda q: q.stat().st_mtime)
        for path in reversed(paths):
            try:
                return json.loads(path.read_text())
            except (OSError, ValueError):
                continue
        return None


def run_client(port: int, model: str, rate: float, requests: int, a, seed: int, tag: str,
               env: dict, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "client", "--port", str(port),
           "--model", model, "--rate", f"{rate:g}", "--requests", str(requests),
           "--prompt-words", str(a.prompt_words), "--output-len", str(a.output_len),
           "--seed", str(seed), "--tag", tag]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ClientFailed(f"the client ran past its {timeout:.0f} s") from None
    if res.returncode != 0:
        raise ClientFailed(f"the client failed: {res.stderr[-500:]}")
    return json.loads(res.stdout)


# --keep-servers: how long the other ways' servers may take to answer after bare did before
# the rounds begin without them (they join a later round once they answer)
LATE_S = 40.0

# transformers serve alone says "Aborted!" on Ctrl-C and can stay up after it (its batching
# thread): a bare server has nothing to write, so it is killed after this long
BARE_GRACE = 5.0


def cell_timeout(a, rate: float, requests: int) -> float:
    """A cell's own limit: its arrivals, then every request's tokens at 0.5 s each, and 30 s."""
    return (requests / rate if rate > 0 else 0.0) + 0.5 * a.output_len + 30.0


def session_facts(doc: dict | None) -> dict:
    """What a session's snapshot says of its own cost and of CUPTI: the overhead report (its
    series left out), its steps by phase and by whether CUPTI was attached and whether they
    were traced, and its CUPTI events: enough to tell where attached steps came from."""
    if not doc:
        return {}
    ov = {k: v for k, v in (doc.get("overhead") or {}).items() if k != "series"}
    steps: dict = {}
    for t in doc.get("tokens") or ():
        if not isinstance(t, dict):
            continue
        key = (f"{t.get('phase')}/{'attached' if t.get('attached') else 'detached'}"
               f"{'/traced' if t.get('sampled') else ''}")
        steps[key] = steps.get(key, 0) + 1
    events = [e for e in doc.get("events") or () if "CUPTI" in str(e) or "mode" in str(e)][:20]
    return {"overhead": ov, "steps": steps, "events": events,
            "tracing": (doc.get("meta") or {}).get("tracing"),
            "sample_every": (doc.get("meta") or {}).get("sample_every")}


def round_order(modes: list, rnd: int) -> list:
    """The ways' order in round ``rnd``: rotated by one a round (each way takes each place once
    in as many rounds as there are ways; a drift within a round or a place's own luck falls on
    every way alike) and reversed every other round."""
    k = rnd % len(modes)
    order = modes[k:] + modes[:k]
    return order if rnd % 2 == 0 else order[::-1]


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        return client_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-tiny", help="registry model for a new directory")
    ap.add_argument("--model-dir", default=None, help="an existing model directory")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--modes", default="bare,live,headless,leave,every")
    ap.add_argument("--rates", default="4,16",
                    help="Poisson rates, req/s (one low, one near saturation), or auto:F1,F2: "
                         "those fractions of the bare server's capacity, measured first")
    ap.add_argument("--probe", type=int, default=48, help="requests of the capacity burst")
    ap.add_argument("--requests", default="48",
                    help="requests a cell: N, or one count a rate (e.g. 16,32)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--every-rounds", type=int, default=None,
                    help="the every-step way in the first N rounds only (its cost stands out "
                         "of the spread in fewer)")
    ap.add_argument("--keep-servers", action="store_true",
                    help="start every way's server once and keep it for every round (a "
                         "device call's budget buys longer cells instead of starts; the "
                         "default starts fresh servers every round)")
    ap.add_argument("--warmup", type=int, default=4, help="requests each server gets first")
    ap.add_argument("--prompt-words", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--no-nvml", action="store_true", help="tuiprof without NVML")
    ap.add_argument("--cb-num-blocks", type=int, default=256,
                    help="KV-cache blocks of each server (servers share the machine: the default "
                         "share of memory would let the first take it all)")
    ap.add_argument("--serve-args", default="", help="more options of transformers serve")
    ap.add_argument("--tmux", default="", help="the tmux command (e.g. 'tmux -S SOCK'): the "
                                              "live app runs in it")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds from the start: no round or cell starts that would end past it")
    ap.add_argument("--start-timeout", type=float, default=180)
    ap.add_argument("--stop-grace", type=float, default=30)
    ap.add_argument("--out", default="out/serve_external")
    ap.add_argument("--work", default=None,
                    help="where the servers' logs, snapshots and the model go (default "
                         "OUT/servers; outside OUT keeps a device call's returned files few)")
    a = ap.parse_args(argv)
    # a time limit's SIGTERM stops the servers as Ctrl-C does: they run in sessions of their
    # own and would outlive this process
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t_start = time.monotonic()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work).resolve() if a.work else out / "servers"
    work.mkdir(parents=True, exist_ok=True)
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or "bare" not in modes:
        raise SystemExit(f"--modes: give bare and any of {', '.join(MODES[1:])}")
    auto = a.rates.startswith("auto:")
    fracs = [float(r) for r in a.rates[5:].split(",")] if auto else []
    rates = [] if auto else [float(r) for r in a.rates.split(",")]
    counts_given = [int(n) for n in a.requests.split(",")]
    # the sessions' sockets live in the runtime directory: a short path of its own (under a
    # deep --work, such as a test's temporary directory, a socket path passed the 107
    # characters a Unix socket may have and the headless server ended at its start)
    runtime = tempfile.mkdtemp(prefix="se-rt-")
    atexit.register(shutil.rmtree, runtime, True)
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               TUIPROF_RUNTIME_DIR=runtime)
    # transformers serve's /v1/models scans the hub cache: give it one that exists
    (work / "hf-server" / "hub").mkdir(parents=True, exist_ok=True)
    env["HF_HUB_CACHE"] = str(work / "hf-server" / "hub")
    if a.model_dir:
        model_dir = Path(a.model_dir).resolve()
    else:
        sys.path.insert(0, str(REPO))
        from tuiprof.engine.model_dir import make_model_dir  # noqa: PLC0415
        model_dir = make_model_dir(work / "model", a.model, device=a.device)
    cenv = {k: v for k, v in env.items() if k != "PYTHONPATH"}   # the client: no tuiprof
    tmux = shlex.split(a.tmux) if a.tmux else None
    say = lambda msg: print(f"[{time.monotonic() - t_start:6.1f} s] {msg}", flush=True)  # noqa: E731
    left = lambda: (a.deadline - (time.monotonic() - t_start)) if a.deadline else 1e9  # noqa: E731
    cells: list = []
    capacity = None
    extra = ["--cb-num-blocks", str(a.cb_num_blocks), *a.serve_args.split()]

    def write(final: dict | None = None) -> dict:
        s = summarize(cells)
        if capacity:
            s["capacity"] = capacity
        if final:
            s.update(final)
        (out / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
        (out / "summary.md").write_text(report(s) + "\n")
        return s

    last_reports: dict = {}

    def start_round(rnd: int) -> dict:
        servers: dict = {}
        try:
            for m in modes:      # started together: their loads overlap
                try:
                    servers[m] = Server(m, model_dir, a.device, work, env, extra,
                                        not a.no_nvml, tmux, str(rnd))
                except (ServerDown, OSError, subprocess.SubprocessError) as exc:
                    say(f"round {rnd + 1}: {m} did not start: {str(exc)[:300]}")
        except BaseException:
            finish(servers, rnd, [])
            raise
        return servers

    def finish(servers: dict, rnd: int, round_cells: list, then=None) -> dict | None:
        """Stop a round's servers (``then()`` starts the next round's meanwhile: a stop only
        waits) and read each session's own figure over each of its cells."""
        t_stop = time.monotonic()
        for srv in servers.values():
            srv.ask_stop()
        nxt = None
        if then is not None:
            try:
                nxt = then()
            except BaseException:
                nxt = None
        stopped = {}

        def stop_one(m: str, srv: Server) -> None:
            srv.stop(BARE_GRACE if m == "bare" else a.stop_grace)
            stopped[m] = round(time.monotonic() - t_stop, 1)

        stoppers = [threading.Thread(target=stop_one, args=kv) for kv in servers.items()]
        for t in stoppers:       # together, each within its own grace
            t.start()
        for t in stoppers:
            t.join()
        say(f"round {rnd + 1}: stopped (s after asking: {stopped})")
        facts = {}
        for m, srv in servers.items():
            if m == "bare":
                continue
            doc = srv.snapshot()
            ov = (doc or {}).get("overhead") or {}
            last_reports[m] = {k: ov.get(k) for k in (
                "pct", "method", "threads_s", "hooks_s", "switch_s", "tracing_s", "rerecord_s",
                "callback_s", "cupti_s", "nvml_s", "serve_s", "wall_s",
                "untraced_reference_missing")}
            facts[m] = session_facts(doc)
            for c in round_cells:
                if c["mode"] == m:
                    c["self_pct"] = window_pct(ov.get("series") or [], *c["window"])
        if round_cells:
            with open(out / "cells.jsonl", "a") as f:
                f.write(json.dumps({"kind": "round", "round": rnd, "self_pct": {
                    f"{c['mode']}@{c['rate']:g}@{c['round']}": c.get("self_pct")
                    for c in round_cells if c["mode"] != "bare"},
                    "self_report": last_reports}) + "\n")
        with open(out / "sessions.jsonl", "a") as f:
            f.write(json.dumps({"round": rnd, "sessions": facts}) + "\n")
        write({"self_report": last_reports})
        return nxt

    late: dict = {}   # --keep-servers: a way's server that was not up in time, still starting

    def warm_up(servers: dict, ways: list, rnd: int, burst: bool) -> None:
        """Every way alike, together: the capacity probe's burst (bare had it), a few
        requests."""
        def one(m: str) -> None:
            try:
                if burst and m != "bare":   # the batch sizes bare's probe ran
                    run_client(servers[m].port, str(model_dir), 0, a.probe, a, 7,
                               f"burst-{m}", cenv, cell_timeout(a, 0, a.probe) + a.probe)
                run_client(servers[m].port, str(model_dir), max(rates), a.warmup, a, 999,
                           f"warm-{m}", cenv, cell_timeout(a, max(rates), a.warmup))
            except ClientFailed as exc:
                say(f"round {rnd + 1}: {m}'s warm-up: {str(exc)[:300]}")

        warm = [threading.Thread(target=one, args=(m,)) for m in ways]
        for t in warm:
            t.start()
        for t in warm:
            t.join()
        say(f"round {rnd + 1}: warmed {', '.join(ways)}")

    def prepare(servers: dict, rnd: int) -> None:
        """Wait for a round's servers, measure the capacity (first time), warm every server
        up alike."""
        nonlocal capacity, rates
        servers.update(late)   # a round lost for want of bare: every late one waited for again
        late.clear()
        up_by = time.monotonic() + min(a.start_timeout, max(10.0, left() - 20))
        order = sorted(servers, key=lambda m: m != "bare")   # bare first: the pairs need it
        for m in order:   # one that fails: this round goes on without it
            try:
                servers[m].wait_up(up_by)
                if m == "bare" and a.keep_servers:
                    # the others started with bare: one still starting LATE_S after it joins a
                    # later round rather than holding this one (an H200 call spent its whole
                    # 150 s start limit waiting for one server while three were up)
                    up_by = min(up_by, time.monotonic() + LATE_S)
            except ServerDown as exc:
                say(f"round {rnd + 1}: {str(exc)[:400]}")
                srv = servers.pop(m)
                if a.keep_servers and srv.alive() and "ended" not in str(exc):
                    late[m] = srv   # asked again before each later round (a slow start)
                else:
                    srv.ask_stop()
        say(f"round {rnd + 1}: {len(servers)} servers up: {', '.join(servers)}")
        if "bare" not in servers:
            raise ServerDown("no bare server this round: nothing to pair with")
        burst = False
        if auto and capacity is None:   # the bare server's capacity: a burst at once
            try:
                got = run_client(servers["bare"].port, str(model_dir), 0, a.probe, a, 7,
                                 "probe", cenv, cell_timeout(a, 0, a.probe) + a.probe)
            except ClientFailed as exc:
                raise ServerDown(f"the capacity probe: {exc}") from None
            fig = cell_figures(got["recs"])
            capacity = {"req_s": fig["req_s"], "tok_s": fig["tok_s"], "requests": a.probe,
                        "ok": fig["ok"]}
            rates = [round(f * fig["req_s"], 1) for f in fracs]
            say(f"capacity {fig['req_s']:.2f} req/s ({fig['tok_s']:.0f} tok/s): rates {rates}")
            burst = True
        warm_up(servers, list(servers), rnd, burst)

    def join_late(servers: dict, rnd: int) -> None:
        """--keep-servers: a way whose server was still starting joins once it answers (asked
        once before each round, no wait), warmed up as the others were."""
        joined = []
        for m in list(late):
            try:
                late[m].wait_up(time.monotonic())
            except ServerDown:
                continue
            servers[m] = late.pop(m)
            joined.append(m)
        if joined:
            say(f"round {rnd + 1}: {', '.join(joined)} up now: joining from this round")
            warm_up(servers, joined, rnd, bool(auto))

    def run_cells(servers: dict, rnd: int, round_cells: list) -> bool:
        """A round's cells; returns False when the deadline stopped it."""
        counts = dict(zip(rates, counts_given if len(counts_given) == len(rates)
                          else counts_given[:1] * len(rates)))
        ways = [m for m in modes if m in servers and not (
            m == "every" and a.every_rounds is not None and rnd >= a.every_rounds)]
        for m in round_order(ways, rnd):
            for rate in (rates if rnd % 2 == 0 else rates[::-1]):
                limit = cell_timeout(a, rate, counts[rate])
                if left() < limit * 0.5 + a.stop_grace:
                    say(f"round {rnd + 1}: the deadline is near, no more cells")
                    return False
                try:
                    got = run_client(servers[m].port, str(model_dir), rate, counts[rate], a,
                                     seed=1000 * rnd + int(rate * 10),
                                     tag=f"{m}-{rnd}-{rate:g}", env=cenv,
                                     timeout=min(limit, max(5.0, left())))
                except ClientFailed as exc:
                    say(f"round {rnd + 1} rate {rate:g} {m}: lost: {str(exc)[:300]}")
                    continue
                fig = cell_figures(got["recs"])
                ends = [r["end_s"] for r in got["recs"] if "end_s" in r]
                cell = {"round": rnd, "rate": rate, "mode": m, "fig": fig,
                        "window": [got["t0_unix"], got["t0_unix"] + max(ends or [0.0])]}
                cells.append(cell)
                round_cells.append(cell)
                with open(out / "cells.jsonl", "a") as f:
                    f.write(json.dumps(cell) + "\n")
                say(f"round {rnd + 1} rate {rate:g} {m}: {fig['ok']}/{fig['requests']} ok, "
                    f"{fig['tok_s'] or 0:.1f} tok/s, TTFT p50 {fig['ttft_p50'] or 0:.1f} ms, "
                    f"e2e p50 {fig['e2e_p50'] or 0:.1f} ms, TPOT p50 {fig['tpot_p50'] or 0:.1f}"
                    f" ms")
                write()
            if m == "live":   # the header as the user sees it, after the live app's cells
                with open(out / "screens.txt", "a") as f:
                    f.write(f"--- round {rnd + 1}, live app at 200x50 after its cells\n"
                            f"{servers[m].capture()}\n")
        return True

    servers = start_round(0)
    kept_cells: list = []     # --keep-servers: every round's cells, read at the one stop
    prepared = False
    for rnd in range(a.rounds):
        t_round = time.monotonic()
        round_cells: list = []
        stop_round = False
        cells_s = 0.0
        try:
            if not prepared:
                prepare(servers, rnd)
                prepared = a.keep_servers
            elif late:
                join_late(servers, rnd)
            t_cells = time.monotonic()
            stop_round = not run_cells(servers, rnd, round_cells)
            cells_s = time.monotonic() - t_cells
        except ServerDown as exc:   # no bare server: the round is lost, the next may do
            say(f"round {rnd + 1}: {exc}")
            stop_round = False
            prepared = False
        except BaseException:
            servers.update(late)
            finish(servers, rnd, kept_cells + round_cells)
            raise
        # a kept server's next round is its cells alone; a fresh one's, everything again
        busy_s = cells_s if a.keep_servers and prepared else time.monotonic() - t_round
        if a.every_rounds is not None and rnd + 1 == a.every_rounds and "every" in servers:
            busy_s *= (len(servers) - 1) / len(servers)   # the next rounds have no every-step cells
        more = (rnd + 1 < a.rounds and not stop_round
                and left() > busy_s + a.stop_grace + 10)
        if rnd + 1 < a.rounds and not more:
            say(f"no round {rnd + 2}: the deadline would pass ({left():.0f} s left, a round "
                f"took {busy_s:.0f} s)")
        if a.keep_servers and more:
            kept_cells += round_cells
            say(f"round {rnd + 1} done in {time.monotonic() - t_round:.0f} s")
            continue
        # the next round's servers start while these stop, if the next round fits
        if late:   # never joined: stopped with the others
            servers.update(late)
            late.clear()
        servers = finish(servers, rnd, kept_cells + round_cells,
                         then=(lambda r=rnd: start_round(r + 1)) if more else None)
        kept_cells = []
        say(f"round {rnd + 1} done in {time.monotonic() - t_round:.0f} s")
        if servers is None:
            break
    s = write({"self_report": last_reports})
    print(report(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
