"""llama.cpp under tuiprof on the GPU machine: the runs of one device call (bench/llamacpp/device.sh).

Each phase writes its files into a results folder and packs the folder into
``$OUT/results.tar.xz`` when it ends, so a call cut short still brings back what it measured.
The analysis (tuiprof against nsys, steps, overhead) is done afterwards, off the GPU, by
``bench/llamacpp/report.py`` on what comes back.

Phases (``--only a,b``; default all but ``live``):
  bench    llama-bench -p 128 -n 128 of qwen3-0.6b Q8_0 under tuiprof and under nsys, CUDA graphs
           on and off (``GGML_CUDA_DISABLE_GRAPHS=1``)
  simple   llama-simple (a prompt, then 48 greedy tokens) under tuiprof, graphs on and off, every
           step's records kept (the CPU tests' recordings)
  types    llama-bench of the f16 and Q4_K_M files under tuiprof (their kernels' names)
  overhead llama-bench's own pp128 / tg128 tokens/s in interleaved rounds: alone, under tuiprof
           as it samples by default (live), with every step traced (--sample-every 1), with
           graph-level trace (--cuda-graph-trace graph) and with --no-cupti (graphs on)
  graphs   one llama-bench run under each tracing choice (node every step, graph level, the
           live default, the graph-between-bursts try): records, steps, bursts, findings
  gputests bench/verify/verify_native.py --only steps,nvtx,cpu (the native path's GPU checks
           that need no nsys, and tests/native on the GPU machine)
  plan     what the earlier calls left open, most needed first, against --deadline
  server   llama-server -np 8 under tuiprof (headless), 32 streamed requests 8 at a time
  live     the same in the live app, in tmux at 200x50 and 80x24
  sampled  the server under the sampled default, 160 requests: kernel times after bursts
  idle     what an attached CUPTI costs between bursts: each switch of Run.IDLE screened,
           the best against alone in --rounds interleaved rounds
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from pathlib import Path

NSYS_CANDIDATES = ("/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys",)
IMPORTER = "/opt/nvidia/nsight-compute/2025.3.1/host/linux-desktop-glibc_2_11_3-x64/QdstrmImporter"
PORT = 18480             # llama-server's own port
PROXY = PORT + 1         # tuiprof's proxy in front of it (the clients talk to this one)
PROMPT = ("tell me a story about the mountain and the river " * 4).strip()


class Run:
    def __init__(self, a):
        self.a = a
        self.bin = Path(a.bin)
        self.models = Path(a.models)
        self.res = Path("/tmp/llres")
        self.res.mkdir(exist_ok=True)
        self.log = {"runs": []}
        self.q8 = str(self.models / "qwen3-0.6b-q8_0.gguf")

    def elapsed(self) -> float:
        return time.time() - self.a.t0

    def note(self, what: str, **kw) -> None:
        kw = {"what": what, "at_s": round(self.elapsed(), 1), **kw}
        self.log["runs"].append(kw)
        print(json.dumps(kw)[:600], flush=True)
        (self.res / "runs.json").write_text(json.dumps(self.log, indent=1))

    def pack(self) -> None:
        tmp = Path(self.a.out) / "results.tar.xz.tmp"
        with tarfile.open(tmp, "w:xz") as t:
            t.add(self.res, arcname="results")
        tmp.rename(Path(self.a.out) / "results.tar.xz")

    def sh(self, name: str, cmd: list, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess | None:
        e = dict(os.environ, **(env or {}))
        t = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
        except subprocess.TimeoutExpired as x:
            (self.res / f"{name}.log").write_text(f"TIMEOUT {timeout}s\n{x.stdout or ''}\n{x.stderr or ''}")
            self.note(name, rc="timeout", seconds=round(time.time() - t, 1))
            return None
        (self.res / f"{name}.log").write_text(
            f"$ {' '.join(cmd)}\nenv {env}\nrc {p.returncode}\n----- stdout\n{p.stdout}\n----- stderr\n{p.stderr}")
        self.note(name, rc=p.returncode, seconds=round(time.time() - t, 1),
                  tail=(p.stdout + p.stderr)[-300:])
        return p

    def tuiprof(self, name: str, argv: list, env=None, ring: int | None = None, timeout=240,
                tracing=("--sample-every", "1")):
        """``tracing``: every step traced by default (what nsys is compared with); () for the
        native default (kernels traced in bursts of time)."""
        snap = self.res / f"{name}.json"
        opts = ["--ring-tokens", str(ring)] if ring else []
        return self.sh(name, [sys.executable, "-m", "tuiprof", "run", "--headless", "--json",
                              str(snap), *opts, *tracing, "--", *argv], env=env, timeout=timeout)

    def nsys(self, name: str, argv: list, env=None):
        nsys = next((p for p in NSYS_CANDIDATES if Path(p).exists()), None)
        if nsys is None:
            self.note(name, error="no nsys")
            return
        rep = Path(f"/tmp/{name}")
        for p in rep.parent.glob(rep.name + ".*"):
            p.unlink()
        p = self.sh(name + "_profile", [nsys, "profile", "-o", str(rep), "--force-overwrite", "true",
                                        "--trace", "cuda", "--cuda-graph-trace=node", *argv],
                    env=env, timeout=200)
        qd = rep.with_suffix(".qdstrm")
        if not qd.exists():
            return
        self.sh(name + "_import", [IMPORTER, "-i", str(qd)],
                env={"LD_LIBRARY_PATH": self.a.nsys_importer_lib}, timeout=200)
        r = str(rep.with_suffix(".nsys-rep"))
        for report in ("cuda_gpu_kern_sum", "cuda_api_sum"):
            s = self.sh(f"{name}_{report}", [nsys, "stats", "--force-export=true", "--report",
                                             report, "--format", "csv", r], timeout=200)
            if s is not None:
                (self.res / f"{name}_{report}.csv").write_text(s.stdout)

    def bench_argv(self, model: str, reps: int = 3, extra=()) -> list:
        return [str(self.bin / "llama-bench"), "-m", model, "-p", "128", "-n", "128", "-r",
                str(reps), "-ngl", "99", "-o", "jsonl", *extra]

    # ------------------------------------------------------------------ phases
    def bench(self):
        for g, env in (("g1", {}), ("g0", {"GGML_CUDA_DISABLE_GRAPHS": "1"})):
            argv = self.bench_argv(self.q8)
            self.sh(f"bench_q8_{g}_alone", argv, env=env)
            self.tuiprof(f"bench_q8_{g}_tuiprof", argv, env=env)
            self.nsys(f"bench_q8_{g}_nsys", argv, env=env)
            self.pack()

    def quick(self):
        """The most valuable runs first, each started only while the call's limit leaves time
        for it (``--deadline``, seconds since the call's start): for a call whose device time
        is short (the build takes most of it)."""
        g0 = {"GGML_CUDA_DISABLE_GRAPHS": "1"}
        simple = [str(self.bin / "llama-simple"), "-m", self.q8, "-n", "48", PROMPT]
        jobs = [
            (8, lambda: self.tuiprof("bench_q8_g1_tuiprof", self.bench_argv(self.q8))),
            (40, lambda: self.nsys("bench_q8_g1_nsys", self.bench_argv(self.q8))),
            (5, lambda: self.sh("bench_q8_g1_alone", self.bench_argv(self.q8))),
            (8, lambda: self.tuiprof("bench_q8_g0_tuiprof", self.bench_argv(self.q8), env=g0)),
            (5, lambda: self.sh("bench_q8_g0_alone", self.bench_argv(self.q8), env=g0)),
            (6, lambda: self.tuiprof("simple_q8_g1_tuiprof", simple, ring=400)),
            (8, lambda: self.tuiprof("bench_q8_g1_tuiprof_2", self.bench_argv(self.q8))),
            (5, lambda: self.sh("bench_q8_g1_alone_2", self.bench_argv(self.q8))),
            (6, lambda: self.tuiprof("simple_q8_g0_tuiprof", simple, env=g0, ring=400)),
            (5, lambda: self.sh("bench_q8_g0_alone_2", self.bench_argv(self.q8), env=g0)),
            (8, lambda: self.tuiprof("bench_q8_g0_tuiprof_2", self.bench_argv(self.q8), env=g0)),
            (40, lambda: self.nsys("bench_q8_g0_nsys", self.bench_argv(self.q8), env=g0)),
            (8, lambda: self.tuiprof("bench_q8_g1_tuiprof_3", self.bench_argv(self.q8))),
            (5, lambda: self.sh("bench_q8_g1_alone_3", self.bench_argv(self.q8))),
        ]
        self.run_jobs(jobs)

    def run_jobs(self, jobs: list) -> None:
        """Each ``(estimated s, job)`` in order, while ``--deadline`` leaves time for it (a
        skipped one is noted); what each wrote is packed at once."""
        for est, job in jobs:
            if self.elapsed() + est > self.a.deadline:
                self.note("skipped", reason="deadline", est=est)
                continue
            job()
            self.pack()

    def plan(self):
        """The runs still open after the first calls, most needed first, each started only
        while ``--deadline`` leaves time for it: graphs off against nsys, the steps found with
        graphs on and off, a Q4_K model, llama-simple, the server through the proxy (headless,
        then the live app in tmux), and the overhead in interleaved rounds."""
        g0 = {"GGML_CUDA_DISABLE_GRAPHS": "1"}
        q4 = str(self.models / "qwen3-0.6b-q4_k_m.gguf")
        simple = [str(self.bin / "llama-simple"), "-m", self.q8, "-n", "48", PROMPT]
        jobs = [
            (8, lambda: self.tuiprof("bench_q8_g0_tuiprof", self.bench_argv(self.q8), env=g0)),
            (45, lambda: self.nsys("bench_q8_g0_nsys", self.bench_argv(self.q8), env=g0)),
            (8, lambda: self.tuiprof("bench_q8_g1_tuiprof", self.bench_argv(self.q8))),
            (8, lambda: self.tuiprof("bench_q4k_g1_tuiprof", self.bench_argv(q4))),
            (6, lambda: self.tuiprof("simple_q8_g1_tuiprof", simple, ring=400)),
            (6, lambda: self.tuiprof("simple_q8_g0_tuiprof", simple, env=g0, ring=400)),
            (40, self.server),
            (45, self.live),
        ]
        self.run_jobs(jobs)
        self.overhead(est=22)

    def simple(self):
        for g, env in (("g1", {}), ("g0", {"GGML_CUDA_DISABLE_GRAPHS": "1"})):
            argv = [str(self.bin / "llama-simple"), "-m", self.q8, "-n", "48", PROMPT]
            self.tuiprof(f"simple_q8_{g}_tuiprof", argv, env=env, ring=400)
            self.pack()
        self.nsys("simple_q8_g1_nsys", [str(self.bin / "llama-simple"), "-m", self.q8, "-n", "48",
                                        PROMPT])
        self.pack()

    def types(self):
        for t in ("f16", "q4_k_m"):
            m = str(self.models / f"qwen3-0.6b-{t}.gguf")
            self.tuiprof(f"bench_{t}_g1_tuiprof", self.bench_argv(m, reps=1))
        self.tuiprof("bench_tiny_g1_tuiprof",
                     self.bench_argv(str(self.models / "tiny-f16.gguf"), reps=1))
        self.pack()

    ARMS = {"alone": None, "live": (), "every": ("--sample-every", "1"),
            "graph": ("--cuda-graph-trace", "graph"), "nocupti": ("--no-cupti",),
            # CUPTI's records in pinned host memory: nothing reserved on the device, the
            # program's buffers where they land with no tool (docs/native.md, "Placement")
            "live_pinned": ((), {"TUIPROF_CUPTI_HOST_PINNED": "1"}),
            "graph_pinned": (("--cuda-graph-trace", "graph"), {"TUIPROF_CUPTI_HOST_PINNED": "1"})}

    def overhead(self, est: float = 40):
        """llama-bench's own tokens/s in rounds whose order turns: alone, under tuiprof as it
        samples by default (live), with every step traced, with graph-level trace, and with
        --no-cupti; graphs on (llama.cpp's default). Then, while the deadline allows, rounds
        with graphs off (GGML_CUDA_DISABLE_GRAPHS=1)."""
        rounds = []
        arms = self.a.arms.split(",")
        plan = [("g1", r) for r in range(self.a.rounds)] + [("g0", r) for r in range(self.a.g0_rounds)]
        for g, r in plan:
            if est and self.elapsed() + est > self.a.deadline:
                self.note("skipped", reason="deadline", round=r, graphs=g)
                break
            env = {"GGML_CUDA_DISABLE_GRAPHS": "1"} if g == "g0" else {}
            k = r % len(arms)
            order = arms[k:] + arms[:k]
            for which in order:
                argv = self.bench_argv(self.q8, reps=5)
                name = f"overhead_{g}_{r}_{which}"
                opts = self.ARMS[which]
                extra = {}
                if isinstance(opts, tuple) and len(opts) == 2 and isinstance(opts[1], dict):
                    opts, extra = opts
                if opts is None:
                    p = self.sh(name, argv, env=env)
                else:
                    p = self.sh(name, [sys.executable, "-m", "tuiprof", "run", "--headless",
                                       "--json", str(self.res / f"{name}.json"), *opts, "--",
                                       *argv], env=dict(env, **extra), timeout=120)
                rows = [json.loads(x) for x in (p.stdout if p else "").splitlines()
                        if x.startswith("{") and "avg_ts" in x]
                rounds.append({"round": r, "which": which, "graphs": g,
                               "tests": [{"n_prompt": x.get("n_prompt"), "n_gen": x.get("n_gen"),
                                          "avg_ts": x.get("avg_ts"), "stddev_ts": x.get("stddev_ts"),
                                          "samples_ts": x.get("samples_ts")} for x in rows]})
                (self.res / "overhead.json").write_text(json.dumps(rounds, indent=1))
            self.pack()
        print(overhead_table(rounds), flush=True)

    # What an attached CUPTI costs llama-bench's graph launches between bursts, one switch at
    # a time (tuiprof/injection/inject.c says what each does); "noburst" traces nothing and is
    # a probe only (CUPTI attached, no kernel kind ever on), and "detached" never attaches it.
    IDLE = {"live": {}, "pinned": {"TUIPROF_CUPTI_HOST_PINNED": "1"},
            "nomem": {"TUIPROF_CUPTI_MEMORY_BURSTS": "1"},
            "apiclear": {"TUIPROF_CUPTI_API_CLEAR": "1"},
            "between": {"TUIPROF_CUPTI_GRAPH_BETWEEN_BURSTS": "1"},
            "lazy": {"TUIPROF_CUPTI_LAZY": "1"},
            "all": {"TUIPROF_CUPTI_HOST_PINNED": "1", "TUIPROF_CUPTI_MEMORY_BURSTS": "1",
                    "TUIPROF_CUPTI_API_CLEAR": "1", "TUIPROF_CUPTI_LAZY": "1"},
            "noburst": {"TUIPROF_CUPTI_NO_BURSTS": "1"},
            "detached": {"TUIPROF_CUPTI_NO_BURSTS": "1", "TUIPROF_CUPTI_LAZY": "1"}}
    PROBES = ("noburst", "detached")   # trace nothing: never the chosen variant

    def _idle_run(self, name: str, which: str) -> dict:
        argv = self.bench_argv(self.q8, reps=5)
        if which == "alone":
            p = self.sh(name, argv)
        else:
            p = self.sh(name, [sys.executable, "-m", "tuiprof", "run", "--headless", "--json",
                               str(self.res / f"{name}.json"), "--", *argv],
                        env=self.IDLE[which], timeout=120)
        rows = [json.loads(x) for x in (p.stdout if p else "").splitlines()
                if x.startswith("{") and "avg_ts" in x]
        snap = {}
        try:
            f = self.res / f"{name}.json"
            d = json.loads(f.read_text())
            f.unlink()          # packed, a snapshot a run makes the call's packing slow
            ch = (d.get("meta", {}).get("native") or {}).get("channel", {})
            snap = {k: ch.get(k) for k in ("kernels", "bursts", "burst_warmup", "burst_straddled",
                                           "burst_overlapping", "burst_dropped")}
            snap["decode_steps"] = d.get("meta", {}).get("auto_steps", {}).get("decode_steps")
        except (OSError, ValueError):
            pass
        return {"which": which, "snap": snap,
                "tests": [{"n_prompt": x.get("n_prompt"), "n_gen": x.get("n_gen"),
                           "avg_ts": x.get("avg_ts"), "samples_ts": x.get("samples_ts")}
                          for x in rows]}

    def idle(self):
        """Between bursts: each switch of IDLE once in --screen-rounds rounds (their order
        turns), alone in each; the variant with the best tg128 that still traced kernels in its
        burst is then run against alone and the default in --rounds interleaved rounds."""
        rounds: list = []
        out = Path(self.a.out) / "idle.json"      # written as it grows: a cut call keeps it
        names = list(self.IDLE)
        for r in range(self.a.screen_rounds):
            order = ["alone"] + (names if r % 2 == 0 else names[::-1])
            for which in order:
                if self.elapsed() + 6 > self.a.deadline - self.a.reserve:
                    break
                rounds.append(dict(self._idle_run(f"idle_screen{r}_{which}", which),
                                   round=r, stage="screen", graphs="g1"))
                out.write_text(json.dumps(rounds, indent=1))

        def tg(which: str) -> float:
            xs = [t["avg_ts"] for x in rounds if x["which"] == which and x["stage"] == "screen"
                  for t in x["tests"] if t["n_gen"]]
            return sum(xs) / len(xs) if xs else 0.0
        ok = [w for w in names if w not in self.PROBES and all(
            (x["snap"].get("kernels") or 0) > 0 for x in rounds if x["which"] == w)]
        best = sorted(ok, key=tg, reverse=True)[:1] or ["live"]
        self.note("idle_screen", best=best, tg={w: round(tg(w), 1) for w in ["alone"] + names})
        arms = ["alone", "live"] + [w for w in best if w != "live"]
        for r in range(self.a.rounds):
            if self.elapsed() + 5 * len(arms) > self.a.deadline - self.a.reserve:
                self.note("skipped", reason="deadline", round=r)
                break
            k = r % len(arms)
            for which in arms[k:] + arms[:k]:
                rounds.append(dict(self._idle_run(f"idle_round{r}_{which}", which),
                                   round=r, stage="rounds", graphs="g1"))
                out.write_text(json.dumps(rounds, indent=1))
        table = overhead_table([x for x in rounds if x["stage"] == "rounds"])
        (self.res / "idle_table.txt").write_text(table + "\n")
        for f in (out, self.res / "idle_table.txt"):
            (self.res / f.name).write_bytes(f.read_bytes()) if f.parent != self.res else \
                (Path(self.a.out) / f.name).write_bytes(f.read_bytes())
        print(overhead_table([x for x in rounds if x["stage"] == "screen"]), flush=True)
        print(table, flush=True)

    def graphs(self):
        """One llama-bench run under each tracing choice, graphs on: every node traced (the
        reference), graph level, the live default, and the live default trying graph records
        between bursts (TUIPROF_CUPTI_GRAPH_BETWEEN_BURSTS=1); then llama-simple at graph level
        (every token a step?)."""
        argv = self.bench_argv(self.q8)
        simple = [str(self.bin / "llama-simple"), "-m", self.q8, "-n", "48", PROMPT]
        jobs = [
            (8, lambda: self.tuiprof("graphs_node_every", argv)),
            (8, lambda: self.tuiprof("graphs_graph_every", argv,
                                     tracing=("--sample-every", "1", "--cuda-graph-trace", "graph"))),
            (8, lambda: self.tuiprof("graphs_node_live", argv, tracing=())),
            (8, lambda: self.tuiprof("graphs_graph_live", argv,
                                     tracing=("--cuda-graph-trace", "graph"))),
            (8, lambda: self.tuiprof("graphs_between_live", argv, tracing=(),
                                     env={"TUIPROF_CUPTI_GRAPH_BETWEEN_BURSTS": "1"})),
            (6, lambda: self.tuiprof("graphs_simple_graph", simple, ring=400,
                                     tracing=("--sample-every", "1", "--cuda-graph-trace", "graph"))),
            (6, lambda: self.tuiprof("graphs_simple_live", simple, ring=400, tracing=())),
        ]
        self.run_jobs(jobs)
        print(snapshot_table(self.res, "graphs_"), flush=True)

    def gputests(self):
        """The native path's GPU checks that need no nsys (decode_like's steps, automatic and
        NVTX) and tests/native on this machine (its compiler, CUPTI headers, libcupti)."""
        out = self.res / "verify"
        out.mkdir(exist_ok=True)
        self.sh("gputests", [sys.executable, "bench/verify/verify_native.py", "--out", str(out),
                             "--only", "steps,nvtx,cpu"], timeout=max(60, self.a.deadline - self.elapsed() - 10))
        for f in out.glob("*"):
            if f.is_file():
                try:
                    (Path(self.a.out) / f"verify_{f.name}").write_bytes(f.read_bytes()) \
                        if f.name.endswith(".json") else None
                except OSError:
                    pass

    def _client(self, n: int, conc: int, max_tokens: int, port: int | None = None,
                tag: str = "c") -> list:
        port = port or PROXY
        out: list = []
        lock = threading.Lock()
        todo = list(range(n))

        def one(i: int) -> None:
            body = json.dumps({"prompt": f"{PROMPT} {i}", "max_tokens": max_tokens,
                               "stream": True, "temperature": 0,
                               "stream_options": {"include_usage": True}}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json",
                                                  "X-Request-ID": f"{tag}{i}"})
            t0 = time.time()
            first = None
            chunks = 0
            status = None
            usage = None
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    status = r.status
                    for line in r:
                        if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                            chunks += 1
                            first = first or time.time()
                            try:
                                d = json.loads(line[6:])
                                usage = d.get("usage") or usage
                            except ValueError:
                                pass
            except Exception as x:  # noqa: BLE001 - recorded, not raised
                status = repr(x)[:200]
            with lock:
                out.append({"i": i, "id": f"{tag}{i}", "start": t0, "first": first,
                            "end": time.time(),
                            "chunks": chunks, "status": status, "usage": usage})

        def worker() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop(0)
                one(i)

        ts = [threading.Thread(target=worker) for _ in range(conc)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return sorted(out, key=lambda r: r["i"])

    def _wait_health(self, limit: float = 90) -> bool:
        end = time.time() + limit
        while time.time() < end:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                    if r.status == 200:
                        return True
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.5)
        return False

    def server_argv(self) -> list:
        return [str(self.bin / "llama-server"), "-m", self.q8, "-np", "8", "-cb", "-c", "16384",
                "-ngl", "99", "--host", "127.0.0.1", "--port", str(PORT), "--no-webui"]

    def server(self, name: str = "server", tracing=("--sample-every", "1"), n: int = 32,
               max_tokens: int = 64, ring: int = 300):
        """llama-server -np 8 -cb under tuiprof, its requests through tuiprof's proxy: 32
        streamed completions, 8 at a time (each with its X-Request-ID)."""
        snap = self.res / f"{name}_tuiprof.json"
        logf = open(self.res / f"{name}_tuiprof.log", "w")
        p = subprocess.Popen([sys.executable, "-m", "tuiprof", "run", "--headless", "--json",
                              str(snap), "--ring-tokens", str(ring), *tracing, "--proxy",
                              f"127.0.0.1:{PROXY}=127.0.0.1:{PORT}", "--",
                              *self.server_argv()], stdout=logf,
                             stderr=subprocess.STDOUT, start_new_session=True)
        up = self._wait_health()
        self.note(f"{name}_up", ok=up)
        if up:
            t = time.time()
            self._client(1, 1, 8, tag="warm")       # the first request loads the graphs
            reqs = self._client(n, 8, max_tokens)
            (self.res / f"{name}_client.json").write_text(json.dumps(reqs, indent=1))
            self.note(f"{name}_client", seconds=round(time.time() - t, 1),
                      ok=sum(1 for r in reqs if r["status"] == 200), n=len(reqs),
                      tokens=sum((r.get("usage") or {}).get("completion_tokens", 0)
                                 for r in reqs))
        os.killpg(p.pid, signal.SIGINT)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
        logf.close()
        self.note(f"{name}_done", rc=p.returncode)
        try:
            summary = server_summary(json.loads(snap.read_text()))
        except (OSError, ValueError) as x:
            summary = {"error": repr(x)[:200]}
        (Path(self.a.out) / f"{name}_summary.json").write_text(json.dumps(summary, indent=1))
        (self.res / f"{name}_summary.json").write_text(json.dumps(summary, indent=1))
        snap.unlink(missing_ok=True)    # tens of MB: too big to come back, slow to pack
        print(json.dumps(summary)[:3000], flush=True)
        self.pack()

    def sampled(self):
        """llama-server under the sampled default (kernels in bursts of 250 ms every 8 s),
        160 streamed requests of 128 tokens 8 at a time (~20 s, two or three bursts): every
        kernel's time after the bursts (a burst's wrong-timed graph launch shows as kernels of
        the whole launch's length)."""
        self.server("sampled", tracing=(), n=160, max_tokens=128, ring=2000)

    def live(self):
        root = self.a.tmux_root
        env = dict(os.environ, LD_LIBRARY_PATH=f"{root}/usr/lib/x86_64-linux-gnu:"
                   + os.environ.get("LD_LIBRARY_PATH", ""), TERM="xterm-256color")
        t = [f"{root}/usr/bin/tmux", "-S", f"/tmp/tmx{PORT}.sock"]
        exp = self.res / "live_export"
        exp.mkdir(exist_ok=True)
        cmd = (f"cd {os.getcwd()} && {sys.executable} -m tuiprof run --export-dir {exp} "
               f"--proxy 127.0.0.1:{PROXY}=127.0.0.1:{PORT} -- "
               + " ".join(self.server_argv()) + "; sleep 30")
        subprocess.run([*t, "new-session", "-d", "-s", "ll", "-x", "200", "-y", "50", cmd],
                       env=env, check=False)
        screens = self.res / "live_screens.txt"

        def cap(name: str) -> str:
            txt = subprocess.run([*t, "capture-pane", "-p", "-t", "ll"], capture_output=True,
                                 text=True, env=env).stdout
            with screens.open("a") as fh:
                fh.write(f"===== {name} at {self.elapsed():.1f}s\n{txt}\n")
            return txt

        up = self._wait_health()
        self.note("live_up", ok=up)
        time.sleep(2)
        cap("200x50_idle")

        def keys(*k: str) -> None:
            subprocess.run([*t, "send-keys", "-t", "ll", *k], env=env)
            time.sleep(1.0)

        if up:
            res: dict = {}
            # 160 requests of 128 tokens, 8 at a time, keep the slots busy for about 25 s:
            # the captures below (after the sampled default's first bursts, one every 8 s)
            # are of a server still under load
            th = threading.Thread(target=lambda: res.setdefault(
                "r", self._client(160, 8, 128, tag="live")))
            th.start()
            time.sleep(10)
            cap("200x50_serving")
            keys("7")
            cap("200x50_requests")
            keys("2")
            cap("200x50_kernels")
            keys("1")
            cap("200x50_latency")
            subprocess.run([*t, "resize-window", "-t", "ll", "-x", "80", "-y", "24"], env=env)
            time.sleep(2)
            cap("80x24_serving")
            keys("7")
            cap("80x24_requests")
            keys("Enter")
            cap("80x24_request_story")
            keys("Escape")
            keys("2")
            cap("80x24_kernels")
            keys("1")
            cap("80x24_latency")
            keys("5")
            cap("80x24_findings")
            th.join(120)
            (self.res / "live_client.json").write_text(json.dumps(res.get("r"), indent=1))
            subprocess.run([*t, "resize-window", "-t", "ll", "-x", "200", "-y", "50"], env=env)
            time.sleep(3)
            cap("200x50_after")
            keys("5")
            cap("200x50_findings")
        keys("q")
        time.sleep(8)
        cap("quit")
        subprocess.run([*t, "kill-server"], env=env, capture_output=True)
        try:
            (Path(self.a.out) / "live_screens.txt").write_text(screens.read_text())
        except OSError:
            pass
        self.pack()


def _median(xs: list) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def overhead_table(rounds: list) -> str:
    """Per graphs setting, test and arm: median, min-max of llama-bench's own avg_ts over the
    rounds, and the ratio of totals (sum over rounds) against alone."""
    by: dict = {}
    for r in rounds:
        for t in r["tests"]:
            test = f"pp{t['n_prompt']}" if t["n_prompt"] else f"tg{t['n_gen']}"
            by.setdefault((r["graphs"], test), {}).setdefault(r["which"], []).append(t["avg_ts"])
    lines = ["graphs test  arm      n  median    min-max            ratio_of_totals"]
    for (g, test), arms in sorted(by.items()):
        base = sum(arms.get("alone", [])) or None
        for arm, xs in arms.items():
            ratio = (sum(xs) / base * len(arms["alone"]) / len(xs)) if base else None
            lines.append(f"{g:6} {test:5} {arm:8} {len(xs):2} {_median(xs):9.1f} "
                         f"{min(xs):9.1f}-{max(xs):<9.1f} "
                         + (f"{ratio:.4f}" if ratio else "-"))
    return "\n".join(lines)


def snapshot_table(res: Path, prefix: str) -> str:
    """One line per snapshot: kernel records, graph records, steps found, bursts, traced
    seconds, the decode-profile finding's title, llama-bench's own tg/pp tokens/s."""
    lines = []
    for f in sorted(res.glob(prefix + "*.json")):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        m = d.get("meta", {})
        ch = (m.get("native") or {}).get("channel", {})
        auto = m.get("auto_steps", {})
        cnt = d.get("counters", {})
        dp = [x.get("title") for x in d.get("findings", []) if x.get("id") == "decode-profile"]
        toks = [t for t in d.get("tokens", []) if t.get("phase") == "decode"]
        lines.append(json.dumps({
            "run": f.stem, "kernels": ch.get("kernels"), "graphs": cnt.get("graphs"),
            "bursts": ch.get("bursts"), "traced_s": ch.get("traced_s"),
            "decode_steps": auto.get("decode_steps"), "prefill_steps": auto.get("prefill_steps"),
            "kernels_per_step": auto.get("kernels_per_step"),
            "decode_traced_in_series": sum(1 for t in toks if t.get("sampled")),
            "decode_untraced_in_series": sum(1 for t in toks if not t.get("sampled")),
            "tracing": m.get("tracing"), "decode_profile": dp[:1]})[:900])
    return "\n".join(lines)


def server_summary(d: dict) -> dict:
    """What a server snapshot says of steps, requests and kernel times (the raw snapshot is
    tens of MB): steps by phase, batch and kernels, requests joined to steps, the tokens the
    decode steps hold against the requests', the channel's counts, and each kernel's count,
    mean and max (a wrong-timed launch shows as a max far above the mean)."""
    toks = d.get("tokens", [])
    dec = [t for t in toks if t.get("phase") == "decode"]
    count = lambda xs: {str(k): xs.count(k) for k in sorted(set(xs), key=str)}  # noqa: E731
    reqs = [r for r in d.get("requests", []) if not r.get("warmup")]
    ks = sorted(d.get("kernels", []), key=lambda k: -k["stats"]["total"])
    ch = (d.get("meta", {}).get("native") or {}).get("channel", {})
    return {
        "phases": count([t.get("phase") for t in toks]),
        "decode_batch": count([t.get("batch") for t in dec]),
        "decode_kernels_per_step": count([t.get("kernels") for t in dec]),
        "decode_sampled": sum(1 for t in dec if t.get("sampled")),
        "decode_tokens_in_steps": sum(t.get("batch") or 0 for t in dec),
        "requests": len(reqs), "request_tokens": sum(r.get("output_tokens") or 0 for r in reqs),
        "requests_with_steps": sum(1 for r in reqs if r.get("steps")),
        "request_steps_p50": _median([len(r.get("steps") or ()) for r in reqs]),
        "request_stats": d.get("request_stats", {}).get("counts"),
        "auto_steps": {k: v for k, v in d.get("meta", {}).get("auto_steps", {}).items()
                       if k != "consensus"},
        "channel": ch, "tracing": d.get("meta", {}).get("tracing"),
        "kernels": [{"name": k["name"][:60], "phase": k.get("phase"), "mode": k.get("mode"),
                     "count": k["stats"]["count"], "total_ms": k["stats"]["total"] / 1e6,
                     "mean_us": k["stats"]["mean"] / 1e3, "max_us": k["stats"]["max"] / 1e3}
                    for k in ks[:14]],
        "findings": [f.get("title") for f in d.get("findings", [])][:8],
    }


def main() -> int:
    global PORT, PROXY
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--t0", type=float, default=time.time())
    ap.add_argument("--nsys-importer-lib", default="")
    ap.add_argument("--tmux-root", default="/tmp/tmxroot")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--g0-rounds", type=int, default=0, help="overhead rounds with graphs off")
    ap.add_argument("--arms", default="alone,live,every,graph,nocupti",
                    help="the overhead phase's arms (of Run.ARMS), in the first round's order")
    ap.add_argument("--skip-done", action="store_true",
                    help="skip the phases an earlier call on this (warm) machine finished")
    ap.add_argument("--only", default="bench,simple,types,overhead,server")
    ap.add_argument("--screen-rounds", type=int, default=1, help="the idle phase's screening")
    ap.add_argument("--reserve", type=float, default=0,
                    help="seconds the idle phase leaves before --deadline (for phases after it)")
    ap.add_argument("--deadline", type=float, default=560, help="seconds since t0: no new phase after")
    ap.add_argument("--port", type=int, default=PORT, help="llama-server's (the proxy's: +1)")
    a = ap.parse_args()
    PORT, PROXY = a.port, a.port + 1
    r = Run(a)
    try:
        subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                        "clocks.max.sm", "--format=csv"], check=False)
    except OSError:     # a CPU machine (the phases' plumbing tried there)
        print("no nvidia-smi")
    done_dir = Path("/tmp/llw/done")   # phases an earlier call on this warm machine finished
    done_dir.mkdir(parents=True, exist_ok=True)
    for phase in a.only.split(","):
        if a.skip_done and (done_dir / phase).exists():
            r.note("skipped", phase=phase, reason="done by an earlier call on this machine")
            continue
        if r.elapsed() > a.deadline:
            r.note("skipped", phase=phase, reason="deadline")
            continue
        r.note("phase", phase=phase)
        try:
            getattr(r, phase)()
            if r.elapsed() <= a.deadline:
                (done_dir / phase).touch()
        except Exception as x:  # noqa: BLE001 - the next phase still runs
            r.note("phase_error", phase=phase, error=repr(x)[:500])
        r.pack()
    return 0


if __name__ == "__main__":
    sys.exit(main())
