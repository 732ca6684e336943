"""What tuiprof costs a real HTTP server, as the server's own clients see it.

``transformers serve DIR --continuous-batching`` runs bare and under tuiprof, in each way asked
(``--modes``):

* ``bare``: the server alone;
* ``headless``: ``tuiprof run --headless`` at its default (kernels sampled in bursts, as live);
* ``every``: ``tuiprof run --headless --sample-every 1`` (every step traced);
* ``live``: ``tuiprof run`` with the live app drawing in a pseudo-terminal of 200x50 (as in
  tmux: the UI process pulls the session as it does for a user).

Every server is started once and kept up (loaded, warmed up by a few requests); they then take
turns. The load comes from a client in a process of its own that knows nothing of tuiprof
(``serve_external.py client``): open loop, Poisson arrivals (the same arrival times for every
server of a round), streaming ``/v1/completions`` with an ``X-Request-ID`` per request. Each
round runs every rate against every server, the servers in an order that alternates between
rounds; each measured cell is paired with the bare server's cell of the same round and rate.

Reports, per rate and way, the ratios to bare (median over rounds, min-max spread) of:
throughput (output tokens/s over the load's wall time), TTFT p50/p99 and end-to-end p50/p99 as
the client measured them. Results are written as they come: ``OUT/cells.jsonl`` (one line a
cell), ``OUT/summary.md`` and ``OUT/summary.json`` after every round.

    python bench/overhead/serve_external.py --model-dir DIR --device cuda --rates 4,16 \\
        --requests 48 --rounds 5 --modes bare,headless,every,live --out out/serve_external

``--budget S`` stops starting rounds once S seconds would be passed (a device call's limit).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODES = ("bare", "headless", "every", "live")
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
                output_len: int, seed: int, tag: str) -> list:
    rng = random.Random(seed)
    t, due = 0.0, []
    for _ in range(requests):
        due.append(t)
        t += rng.expovariate(rate)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks = []
    for i, d in enumerate(due):
        body = json.dumps({"model": model, "prompt": _prompt(prompt_words, rng),
                           "max_tokens": output_len, "stream": True, "temperature": 0.0,
                           }).encode()
        tasks.append(_one(port, body, f"{tag}-{i}", d, t0))
    return await asyncio.gather(*tasks)


def client_main(argv: list) -> int:
    ap = argparse.ArgumentParser(prog="serve_external.py client")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--prompt-words", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="r")
    a = ap.parse_args(argv)
    recs = asyncio.run(_load(a.port, a.model, a.rate, a.requests, a.prompt_words,
                             a.output_len, a.seed, a.tag))
    print(json.dumps(recs))
    return 0


# ----------------------------------------------------------------------------- statistics
def pct(xs: list, q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def cell_figures(recs: list) -> dict:
    ok = [r for r in recs if r.get("ok")]
    ttft = [r["ttft_ms"] for r in ok]
    e2e = [r["e2e_ms"] for r in ok]
    wall = (max(r["end_s"] for r in ok) - min(r["due_s"] for r in recs)) if ok else None
    toks = sum(r["tokens"] for r in ok)
    return {"requests": len(recs), "ok": len(ok), "tokens": toks, "wall_s": wall,
            "tok_s": toks / wall if wall else None, "req_s": len(ok) / wall if wall else None,
            "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
            "e2e_p50": pct(e2e, 0.5), "e2e_p99": pct(e2e, 0.99),
            "errors": sorted({r["error"] for r in recs if r.get("error")})[:3]}


METRICS = ("tok_s", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99")


def summarize(cells: list) -> dict:
    """Per rate and way: each round's ratio to the bare server's cell of the same round."""
    bare = {(c["round"], c["rate"]): c for c in cells if c["mode"] == "bare"}
    out: dict = {}
    for c in cells:
        if c["mode"] == "bare":
            continue
        b = bare.get((c["round"], c["rate"]))
        if b is None:
            continue
        slot = out.setdefault(f"{c['rate']:g}", {}).setdefault(c["mode"], {m: [] for m in METRICS})
        for m in METRICS:
            if c["fig"].get(m) and b["fig"].get(m):
                slot[m].append(c["fig"][m] / b["fig"][m])
    table = {}
    for rate, modes in out.items():
        for mode, ms in modes.items():
            table.setdefault(rate, {})[mode] = {
                m: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
                for m, v in ms.items() if v}
    bare_abs = {}
    for c in bare.values():
        bare_abs.setdefault(f"{c['rate']:g}", []).append(c["fig"])
    return {"ratios": table, "bare": {r: {m: statistics.median([f[m] for f in fs if f.get(m)])
                                          for m in METRICS if any(f.get(m) for f in fs)}
                                      for r, fs in bare_abs.items()}}


def report(s: dict) -> str:
    lines = ["| rate (req/s) | tuiprof | rounds | throughput | TTFT p50 | TTFT p99 | e2e p50 "
             "| e2e p99 |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for rate in sorted(s["ratios"], key=float):
        for mode in MODES:
            r = s["ratios"][rate].get(mode)
            if not r:
                continue
            n = max(v["n"] for v in r.values())
            cells = []
            for m in METRICS:
                v = r.get(m)
                cells.append("–" if v is None else
                             f"{v['median']:.3f} ({v['min']:.3f}–{v['max']:.3f})")
            lines.append(f"| {rate} | {mode} | {n} | " + " | ".join(cells) + " |")
    lines += ["", "Ratios to the bare server of the same round (median, min–max over rounds); "
              "throughput is output tokens/s over the load's wall time.", "",
              "| rate | bare throughput (tok/s) | TTFT p50 (ms) | TTFT p99 | e2e p50 | e2e p99 |",
              "|---|---:|---:|---:|---:|---:|"]
    for rate, f in sorted(s["bare"].items(), key=lambda kv: float(kv[0])):
        lines.append(f"| {rate} | " + " | ".join(
            "–" if f.get(m) is None else f"{f[m]:,.1f}" for m in METRICS) + " |")
    for mode, ov in (s.get("self_report") or {}).items():
        lines.append(f"\n{mode}: the session's own figure: overhead {ov.get('pct')} % "
                     f"({ov.get('method')}; hooks {ov.get('hooks_s')} s, switches "
                     f"{ov.get('switch_s')} s over {ov.get('wall_s')} s)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the servers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``transformers serve`` process (bare or under tuiprof), its own process group."""

    def __init__(self, mode: str, model_dir: Path, device: str, out: Path, env: dict,
                 extra: list, nvml: bool) -> None:
        self.mode, self.port = mode, free_port()
        serve = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model_dir),
                 "--continuous-batching", "--device", device, "--host", "127.0.0.1",
                 "--port", str(self.port), *extra]
        tp = [sys.executable, "-m", "tuiprof", "run"] + ([] if nvml else ["--no-nvml"])
        snap = out / f"tuiprof-{mode}.json"
        cmd = {"bare": serve,
               "headless": [*tp, "--headless", "--json", str(snap), "--", "python", *serve[1:]],
               "every": [*tp, "--headless", "--sample-every", "1", "--json", str(snap), "--",
                         "python", *serve[1:]],
               "live": [*tp, "--export-dir", str(out / "live-exports"), "--", "python", *serve[1:]],
               }[mode]
        self.log = open(out / f"server-{mode}.log", "wb")
        self.master = None
        if mode == "live":
            import fcntl  # noqa: PLC0415
            import pty  # noqa: PLC0415
            import struct  # noqa: PLC0415
            import termios  # noqa: PLC0415
            (out / "live-exports").mkdir(exist_ok=True)
            self.master, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
            self.proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave,
                                         env=dict(env, TERM="xterm-256color"), cwd=out,
                                         start_new_session=True)
            os.close(slave)
            self.screen = b""
            self._drainer = threading.Thread(target=self._drain, daemon=True)
            self._drainer.start()
        else:
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                         env=env, cwd=out, start_new_session=True)

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

    def wait_up(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.mode}: the server ended (status {self.proc.returncode});"
                                 f" see server-{self.mode}.log")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2).read()
                return
            except Exception:
                time.sleep(0.5)
        raise SystemExit(f"{self.mode}: the server did not answer in {timeout:g} s")

    def ask_stop(self) -> None:
        """Ctrl-C (the live app: its q key), as a user stops it."""
        if self.proc.poll() is None:
            try:
                if self.master is not None:
                    os.write(self.master, b"q")
                else:
                    os.killpg(self.proc.pid, signal.SIGINT)
            except OSError:
                pass

    def stop(self, grace: float = 60.0) -> None:
        """After :meth:`ask_stop`: the whole group once ``grace`` has passed."""
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait(10)
        if self.master is not None:
            self._drainer.join(2)
            self.log.write(self.screen)
        self.log.close()


def run_client(port: int, model: str, rate: float, requests: int, a, seed: int, tag: str,
               env: dict) -> list:
    cmd = [sys.executable, str(Path(__file__).resolve()), "client", "--port", str(port),
           "--model", model, "--rate", f"{rate:g}", "--requests", str(requests),
           "--prompt-words", str(a.prompt_words), "--output-len", str(a.output_len),
           "--seed", str(seed), "--tag", tag]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env,
                         timeout=max(120.0, 20 * requests / rate))
    if res.returncode != 0:
        raise SystemExit(f"the client failed: {res.stderr[-500:]}")
    return json.loads(res.stdout)


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        return client_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-tiny", help="registry model for a new directory")
    ap.add_argument("--model-dir", default=None, help="an existing model directory")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--modes", default="bare,headless,every,live")
    ap.add_argument("--rates", default="4,16", help="Poisson rates, req/s (one low, one near "
                                                    "saturation)")
    ap.add_argument("--requests", default="48",
                    help="requests a cell: N, or one count a rate (e.g. 16,32)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=4, help="requests each server gets first")
    ap.add_argument("--prompt-words", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--no-nvml", action="store_true", help="tuiprof without NVML")
    ap.add_argument("--cb-num-blocks", type=int, default=256,
                    help="KV-cache blocks of each server (servers share the machine: the default "
                         "share of memory would let the first take it all)")
    ap.add_argument("--serve-args", default="", help="more options of transformers serve")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds: start no round that would end past it")
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--out", default="out/serve_external")
    ap.add_argument("--work", default=None,
                    help="where the servers' logs, snapshots and the model go (default "
                         "OUT/servers; outside OUT keeps a device call's returned files few)")
    a = ap.parse_args(argv)
    t_start = time.monotonic()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work).resolve() if a.work else out / "servers"
    work.mkdir(parents=True, exist_ok=True)
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or "bare" not in modes:
        raise SystemExit(f"--modes: give bare and any of {', '.join(MODES[1:])}")
    rates = [float(r) for r in a.rates.split(",")]
    counts = [int(n) for n in a.requests.split(",")]
    counts = dict(zip(rates, counts if len(counts) == len(rates) else counts[:1] * len(rates)))
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
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
    say = lambda msg: print(f"[{time.monotonic() - t_start:6.1f} s] {msg}", flush=True)  # noqa: E731
    servers = {}
    cells: list = []
    try:
        for m in modes:      # started together: loads overlap; then each warmed up alone
            servers[m] = Server(m, model_dir, a.device, work, env,
                                ["--cb-num-blocks", str(a.cb_num_blocks), *a.serve_args.split()],
                                not a.no_nvml)
        for m in modes:
            servers[m].wait_up(a.start_timeout)
            run_client(servers[m].port, str(model_dir), max(rates), a.warmup, a, 999, "warm",
                       cenv)
            say(f"{m}: up and warmed (port {servers[m].port})")
        round_s = None
        for rnd in range(a.rounds):
            if a.budget and round_s and time.monotonic() - t_start + round_s > a.budget:
                say(f"stopping before round {rnd + 1}: the budget ({a.budget:g} s) would pass")
                break
            t_round = time.monotonic()
            order = modes if rnd % 2 == 0 else modes[::-1]
            for rate in rates:
                for m in order:
                    recs = run_client(servers[m].port, str(model_dir), rate, counts[rate], a,
                                      seed=1000 * rnd + int(rate * 10), tag=f"{m}-{rnd}-{rate:g}",
                                      env=cenv)
                    cell = {"round": rnd, "rate": rate, "mode": m, "fig": cell_figures(recs)}
                    cells.append(cell)
                    with open(out / "cells.jsonl", "a") as f:
                        f.write(json.dumps(cell) + "\n")
                    fig = cell["fig"]
                    say(f"round {rnd + 1} rate {rate:g} {m}: {fig['ok']}/{fig['requests']} ok, "
                        f"{fig['tok_s'] or 0:.1f} tok/s, TTFT p50 {fig['ttft_p50'] or 0:.1f} ms, "
                        f"e2e p50 {fig['e2e_p50'] or 0:.1f} ms")
            round_s = time.monotonic() - t_round
            s = summarize(cells)
            (out / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
            (out / "summary.md").write_text(report(s) + "\n")
    finally:
        for srv in servers.values():
            srv.ask_stop()
        end = time.monotonic() + 60
        for srv in servers.values():
            srv.stop(max(1.0, end - time.monotonic()))
    s = summarize(cells)
    s["self_report"] = self_reports(work, modes)
    (out / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    (out / "summary.md").write_text(report(s) + "\n")
    print(report(s))
    return 0


def self_reports(work: Path, modes: list) -> dict:
    """What each tuiprof session said it cost (its snapshot's ``overhead``), beside what the
    client measured: the live app's is its auto snapshot."""
    found = {}
    for m in modes:
        if m == "bare":
            continue
        path = work / f"tuiprof-{m}.json"
        if m == "live":
            snaps = sorted((work / "live-exports").glob("tuiprof-*.json"))
            path = snaps[-1] if snaps else path
        try:
            ov = json.loads(path.read_text()).get("overhead") or {}
        except (OSError, ValueError):
            continue
        found[m] = {k: ov.get(k) for k in ("pct", "method", "hooks_s", "switch_s", "cupti_s",
                                           "nvml_s", "serve_s", "wall_s")}
    return found


if __name__ == "__main__":
    raise SystemExit(main())
