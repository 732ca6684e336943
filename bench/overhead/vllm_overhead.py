"""What tuiprof costs a vLLM server, and how well its requests agree with a real client's.

Rounds of two runs, interleaved (bare, then under ``tuiprof run --headless``, then bare, ...):
each starts vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``, CPU,
``--enforce-eager``) in the Python named by ``--python`` (``TUIPROF_VLLM_PYTHON``), sends the
same load from a streaming HTTP client of the standard library that knows nothing of tuiprof
(warm-up, then ``--requests`` at ``--concurrency``), and stops it with Ctrl-C. Per run: the
client's end-to-end and TTFT p50, requests/s. Per tuiprof run also the agreement: each
request's end-to-end as tuiprof has it (the engine's record joined with the API server's)
against the client's, and whether every request is there with the client's output tokens.

  python bench/overhead/vllm_overhead.py --model DIR --rounds 3 --out results.json

``--together``: both servers up at once (bare on PORT, under tuiprof on PORT+1), so a round
costs no start-up and many short cells fit where a few restarts did: each round sends one
seeded open-loop Poisson schedule (``--rate`` requests/s, ``--requests`` a cell; the same
arrival gaps, prompt and output lengths for both arms of a round, a new schedule each round)
to one server, then to the other (the order alternating a round). Per round: the arms' e2e
and TTFT p50 and the ratio of their totals (the same requests, so paired); over all rounds:
the ratio of totals, the median of the rounds' ratios and their spread (min, quartiles, max),
the load average, and the idle server's CPU during the other's cell (tuiprof's own work in
the idle server taxes the bare cells too: the figure bounds that bias). Each request is timed
twice (``tuiprof.engine.wire_client``): by the client program's clock, and between the kernel's
stamps of its bytes leaving and arriving at the client's socket (``wire``: the client's own
lateness on a loaded host left out, which otherwise spreads the rounds); the ratio of totals of
each comes with a 90 % interval (the rounds resampled in pairs). The agreement is checked on
the wire's interval.

  python bench/overhead/vllm_overhead.py --model DIR --together --rounds 12 --requests 40 \
      --rate 4 --out results.json

``--breakdown S``: where tuiprof's cost goes, measured inside the server's processes rather
than by an A/B (on a loaded machine the bare runs alone spread several-fold). One run under
``tuiprof run``, ``S`` seconds of load; for that window:

* every thread's CPU seconds of every process of the server (``/proc/PID/task/TID/stat``);
* with ``py-spy`` on the PATH (``pip install py-spy``; it reads the processes from outside,
  nothing is added to them): samples of the threads *holding the GIL* (``--gil``) in the API
  server and the engine core, split into the program's own work, tuiprof's code run on the
  program's threads (its hooks: the innermost tuiprof frame calls no program code) and
  tuiprof's own threads (serving pulls, samplers, windows). A GIL-holding sample is what the
  program's threads wait for, so this counts what a CPU-time figure misses: on two loaded
  cores a thread preempted while it holds the GIL stops every other thread of its process;
* tuiprof's own accounting of each process (the snapshot's ``overhead``: step hooks' and
  pulls' CPU) per engine step and per request, against the median step time.

  python bench/overhead/vllm_overhead.py --model DIR --breakdown 30 --out breakdown.json
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tuiprof.engine.vllm_load import Client, wait_up  # noqa: E402
from tuiprof.engine.lengths import parse_lengths  # noqa: E402


def vllm_command(args, port: int, snap: Path | None) -> list:
    """vLLM's OpenAI server on 127.0.0.1:PORT, under ``tuiprof run --headless`` with a snapshot
    path (bare without)."""
    server = [args.python, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
              "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
              "--host", "127.0.0.1", "--port", str(port)]
    if snap is None:
        return server
    return [args.python, "-m", "tuiprof", "run", "--headless", "--no-nvml", "--json", str(snap),
            "--", "python", *server[1:]]


@contextmanager
def serving(cmd: list, port: int, log_path: Path):
    """The server in a process group of its own, answering on ``port``, its output in
    ``log_path``; Ctrl-C to the whole group on the way out (SIGKILL after 180 s)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            wait_up(port, proc)
            yield proc
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(180)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def warm_client(args, port: int) -> Client:
    """The load's client, after one warm-up request."""
    vocab = int(json.loads((Path(args.model) / "config.json").read_text())["vocab_size"])
    client = Client(port, args.model, vocab, args.seed, parse_lengths(args.prompt_len),
                    parse_lengths(args.output_len))
    client.submit("warmup0", warmup=True)
    client.collect(1)
    return client


def one_run(args, under: bool, port: int, tmp: Path) -> dict:
    snap = tmp / f"run-{port}.json"
    with serving(vllm_command(args, port, snap if under else None), port,
                 tmp / f"run-{port}.log"):
        client = warm_client(args, port)
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        sent = in_flight = 0
        while in_flight < args.concurrency and sent < args.requests:
            client.submit()
            sent += 1
            in_flight += 1
        while in_flight:
            in_flight -= client.collect(1)
            if sent < args.requests:
                client.submit()
                sent += 1
                in_flight += 1
        wall = time.monotonic() - t0
    seen = {k: v for k, v in client.seen.items() if not k.startswith("warmup")}
    e2e = [v[1] for v in seen.values()]
    ttft = [v[0] for v in seen.values() if v[0] is not None]
    out = {"under_tuiprof": under, "requests": len(seen), "failed": client.failed,
           "wall_s": wall, "requests_per_s": len(seen) / wall,
           "load_average_1min": [load0, os.getloadavg()[0]],
           "e2e_p50_ms": statistics.median(e2e), "ttft_p50_ms": statistics.median(ttft)}
    if under:
        out.update(agreement(snap, client.seen, client.wall, client.wire))
    return out


def _pairs(runs: list) -> list:
    """(bare, under tuiprof) of each round."""
    by: dict = {}
    for r in runs:
        by.setdefault(r["round"], {})[r["under_tuiprof"]] = r
    return [(v[False], v[True]) for v in by.values() if len(v) == 2]


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc's children lists)."""
    out = [pid]
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            kids = open(f"/proc/{pid}/task/{t}/children").read().split()
        except OSError:
            kids = []
        for k in kids:
            out += _tree(int(k))
    return out


def _comm(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return "?"


def thread_cpu(pids: list[int]) -> dict:
    """(pid, tid) -> (thread name, CPU seconds so far)."""
    tck = os.sysconf("SC_CLK_TCK")
    out = {}
    for p in pids:
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            try:
                st = open(f"/proc/{p}/task/{t}/stat").read()
            except OSError:
                continue
            f = st[st.rindex(")") + 2:].split()
            out[(p, int(t))] = (st[st.index("(") + 1:st.rindex(")")],
                                (int(f[11]) + int(f[12])) / tck)
    return out


STDLIB = set(getattr(sys, "stdlib_module_names", ())) | {"<string>"}


def _top(frame: str) -> str:
    m = re.search(r"\(([^:()]+):\d+\)$", frame)
    return (m.group(1) if m else "").split("/")[0].removesuffix(".py")


def gil_split(raw: Path) -> dict:
    """py-spy's raw (collapsed) GIL-holding samples of one process: per thread name, the
    samples in all, in tuiprof's own code, and the tuiprof functions most seen."""
    threads: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    where: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        name = re.sub(r"^thread \(\d+\): ", "", re.sub(r"\s+", " ", frames[0])).strip()
        name = re.sub(r"\(0x[0-9a-f]+\)|\(\d+\)", "", name).strip(" :")
        threads[name] += int(n)
        fr = frames[1:]
        mine = [i for i, f in enumerate(fr) if _top(f) == "tuiprof"]
        if not mine:
            continue
        after = fr[mine[-1] + 1:]
        if after and _top(after[0]) not in STDLIB:   # a wrapper running the program's code
            continue
        own[name] += int(n)
        where[fr[mine[-1]].split(" (")[0]] += int(n)
    total = sum(threads.values())
    main = threads.get("MainThread", 0)
    tuiprof_threads = sum(n for k, n in threads.items() if k.startswith("tuiprof"))
    return {"samples": total, "main_thread": main, "main_thread_in_tuiprof": own["MainThread"],
            "tuiprof_threads": tuiprof_threads,
            "tuiprof_share": (own["MainThread"] + tuiprof_threads) / total if total else None,
            "threads": dict(threads.most_common()),
            "tuiprof_functions": dict(where.most_common(12))}


def breakdown(args, port: int, tmp: Path) -> dict:
    """One run under tuiprof, ``args.breakdown`` seconds of closed-loop load: where the
    server's time goes (the module docstring)."""
    snap = tmp / f"breakdown-{port}.json"
    spy = shutil.which("py-spy")
    out: dict = {"load_before": os.getloadavg(), "py_spy": spy}
    with serving(vllm_command(args, port, snap), port, tmp / f"breakdown-{port}.log") as proc:
        client = warm_client(args, port)
        pids = _tree(proc.pid)
        names = {p: _comm(p) for p in pids}
        engine = next((p for p, c in names.items() if c.startswith("VLLM::EngineCor")), None)
        api = None
        if engine is not None:   # the engine core's parent runs vLLM's API server
            api = int(open(f"/proc/{engine}/stat").read().rsplit(")", 1)[1].split()[1])
        roles = {proc.pid: "tuiprof run"}
        roles.update({p: c.removeprefix("VLLM::") for p, c in names.items()
                      if c.startswith("VLLM::")})
        if api is not None:
            roles[api] = "API server"
        spies = {}
        if spy:
            for p, role in roles.items():
                if p == proc.pid:
                    continue
                spies[role] = (tmp / f"gil-{role.replace(' ', '_')}.txt", subprocess.Popen(
                    [spy, "record", "-p", str(p), "-d", str(int(args.breakdown)), "-r", "100",
                     "--gil", "--nonblocking", "--threads", "--format", "raw", "-o",
                     str(tmp / f"gil-{role.replace(' ', '_')}.txt")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        c0 = thread_cpu(list(roles))
        t0 = time.monotonic()
        in_flight = 0
        while time.monotonic() - t0 < args.breakdown or in_flight:
            while in_flight < args.concurrency and time.monotonic() - t0 < args.breakdown:
                client.submit()
                in_flight += 1
            in_flight -= client.collect(1)
        wall = time.monotonic() - t0
        c1 = thread_cpu(list(roles))
        for _path, sp in spies.values():
            sp.wait(120)
    seen = {k: v for k, v in client.seen.items() if not k.startswith("warmup")}
    cpu: dict = {}
    for (p, t), (name, s1) in c1.items():
        d = s1 - c0.get((p, t), (name, 0.0))[1]
        role = roles.get(p, "?")
        per = cpu.setdefault(role, {"cpu_s": 0.0, "threads": collections.Counter()})
        per["cpu_s"] += d
        per["threads"][name] += d
    for per in cpu.values():
        per["cpu_s"] = round(per["cpu_s"], 2)
        per["threads"] = {k: round(v, 2) for k, v in per["threads"].most_common() if v >= 0.01}
    out.update({"wall_s": wall, "requests": len(seen), "requests_per_s": len(seen) / wall,
                "e2e_p50_ms": statistics.median(v[1] for v in seen.values()),
                "load_after": os.getloadavg(), "cpu": cpu,
                "gil": {role: gil_split(path) for role, (path, _sp) in spies.items()
                        if path.exists()}})
    doc = json.loads(snap.read_text())
    own = {}
    for r in doc.get("ranks") or [doc]:
        name = (r["meta"].get("process") or {}).get("name") or r["meta"].get("model")
        ov = r.get("overhead") or {}
        steps = r["counters"].get("tokens", 0)
        reqs = len(r.get("requests") or ())
        modes = (r.get("summary") or {}).get("modes") or {}
        med = next((m.get("ms_per_token_median") for m in modes.values()
                    if m.get("ms_per_token_median")), None)
        own[name] = {"step_source": r["meta"].get("step_source"), "steps": steps,
                     "requests": reqs, "overhead": ov,
                     "hooks_us_per_step": (ov.get("hooks_s", 0) / steps * 1e6) if steps else None,
                     "serve_s": ov.get("serve_s"), "step_ms_median": med,
                     "hooks_share_of_step": (ov.get("hooks_s", 0) / steps / (med / 1e3))
                     if steps and med and r["meta"].get("step_source") == "vllm" else None}
    out["tuiprof_accounting"] = own
    return out


def _within(d: float, e2e: float) -> bool:
    return abs(d) <= max(20.0, 0.05 * e2e)


def agreement(snap: Path, seen: dict, wall: dict | None = None,
              wire: dict | None = None) -> dict:
    """Each request's end-to-end as tuiprof has it against the client's: the wire's (from the
    kernel's stamp of the request's last byte leaving the client's socket to its stamp of the
    answer's last bytes arriving; ``wire_client``), which is what the target is checked on, and
    the client program's own (its clock around its connect, send and reads), which adds the
    client's own delays on a loaded host."""
    doc = json.loads(snap.read_text())
    ranks = doc.get("ranks") or [doc]
    engine = next((r for r in ranks if r["meta"].get("step_source") == "vllm"), None)
    if engine is None:
        return {"agreement": "no vLLM steps in the snapshot"}
    rows = {r["client_id"]: r for r in engine["requests"]}
    diffs, wdiffs, worst_share, missing, tokens_equal = [], [], 0.0, [], True
    within, wwithin, outside, woutside = [], [], [], []
    for rid, (_ttft, e2e, tokens) in seen.items():
        r = rows.get(rid)
        if r is None or r.get("e2e_ms") is None:
            missing.append(rid)
            continue
        tokens_equal = tokens_equal and r.get("output_tokens") == tokens
        d = e2e - r["e2e_ms"]
        diffs.append(d)
        within.append(_within(d, e2e))
        w = (wall or {}).get(rid)
        if w and not within[-1]:   # where the difference lies, on the host's one clock
            outside.append({"id": rid, "client_minus_tuiprof_ms": round(d, 2),
                            "client_e2e_ms": round(e2e, 2),
                            "before_the_arrival_ms": round((r["arrival_ns"] - w[0]) / 1e6, 2),
                            "after_the_end_ms": round((w[1] - r["finish_ns"]) / 1e6, 2),
                            "in_socket_ms": r.get("in_socket_ms")})
        we2e = ((wire or {}).get(rid) or (None, None))[1]
        if we2e is not None:
            wd = we2e - r["e2e_ms"]
            wdiffs.append(wd)
            worst_share = max(worst_share, abs(wd) / we2e)
            wwithin.append(_within(wd, we2e))
            if not wwithin[-1]:
                woutside.append({"id": rid, "wire_minus_tuiprof_ms": round(wd, 2),
                                 "wire_e2e_ms": round(we2e, 2),
                                 "sent_to_arrival_ms": round((r["arrival_ns"] - w[2]) / 1e6, 2),
                                 "end_to_received_ms": round((w[3] - r["finish_ns"]) / 1e6, 2),
                                 "in_socket_ms": r.get("in_socket_ms")})
    steps = [t for t in engine["tokens"] if t.get("requests")]
    split = {}
    for key in ("before_the_arrival_ms", "after_the_end_ms"):
        xs = sorted(o[key] for o in outside)
        if xs:
            split[key] = {"p50": statistics.median(xs), "max": xs[-1],
                          "share_of_difference": sum(xs) / sum(
                              o["client_minus_tuiprof_ms"] for o in outside)}

    def _span(xs):
        return {"p50": statistics.median(xs) if xs else None,
                "max": max(xs) if xs else None, "min": min(xs) if xs else None}

    return {"tuiprof_requests": len(rows), "missing": missing,
            # the target's check: tuiprof against the wire's interval
            "wire_requests": len(wdiffs),
            "wire_minus_tuiprof_e2e_ms": _span(wdiffs),
            "worst_share": worst_share,
            "within_5pct_or_20ms": bool(wwithin) and all(wwithin) and not missing
            and len(wwithin) == len(seen),
            "within_share": sum(wwithin) / len(wwithin) if wwithin else None,
            "wire_outside": woutside[:200],
            # the client program's own clock, its delays included
            "client_minus_tuiprof_e2e_ms": _span(diffs),
            "client_within_share": sum(within) / len(within) if within else None,
            # the requests outside 5 % or 20 ms by the client program's clock: how much of
            # each one's difference lies before tuiprof's arrival (the client's connect and
            # send, a jiffy of the kernel's clock) and after its end (the client's reading)
            "outside_split": split, "outside": outside[:200],
            "steps": len(steps), "max_batch": max((t["batch"] for t in steps), default=0),
            "tokens_equal": tokens_equal,
            "engine_line": engine["meta"]["process"].get("line", "")}


def _quartiles(xs: list) -> list:
    xs = sorted(xs)
    if len(xs) < 2:
        return xs * 3
    q = statistics.quantiles(xs, n=4)
    return [xs[0], q[0], q[1], q[2], xs[-1]]


def _bootstrap_totals(rounds: list, key: str, n: int = 2000, seed: int = 1) -> list:
    """A 90 % interval of the ratio of totals (tuiprof / bare), rounds resampled in their
    pairs (seeded: the same rounds give the same interval)."""
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    pairs = [(r["tuiprof"][key], r["bare"][key]) for r in rounds]
    if len(pairs) < 2:
        return []
    ratios = []
    for _ in range(n):
        pick = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        ratios.append(sum(t for t, _ in pick) / sum(b for _, b in pick))
    ratios.sort()
    return [ratios[int(0.05 * n)], ratios[int(0.95 * n) - 1]]


def poisson_cell(client: Client, rate: float, n: int, seed: int) -> dict:
    """``n`` requests sent on a seeded Poisson schedule at ``rate``/s; what the client saw
    (id -> (ttft, e2e, chunks)) once all came back."""
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    gaps = [rng.expovariate(rate) for _ in range(n)]
    t0 = time.monotonic()
    at = 0.0
    for g in gaps:
        at += g
        delay = t0 + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        client.submit()
    client.collect(n)
    return {"wall_s": time.monotonic() - t0}


def together(args, tmp: Path) -> dict:
    """Both servers up at once; rounds of one seeded Poisson schedule to each (see
    ``--together`` in the module docstring)."""
    snap = tmp / "together.json"
    port_b, port_t = args.port, args.port + 1
    vocab = int(json.loads((Path(args.model) / "config.json").read_text())["vocab_size"])
    rounds: list = []
    seen_t: dict = {}
    wall_t: dict = {}
    wire_t: dict = {}
    with serving(vllm_command(args, port_b, None), port_b, tmp / "bare.log") as pb, \
            serving(vllm_command(args, port_t, snap), port_t, tmp / "tuiprof.log") as pt:
        trees = {False: _tree(pb.pid), True: _tree(pt.pid)}
        for under, port in ((False, port_b), (True, port_t)):   # warm both up
            c = Client(port, args.model, vocab, args.seed, parse_lengths(args.prompt_len),
                       parse_lengths(args.output_len))
            for i in range(2):
                c.submit(f"warmup{i}", warmup=True)
            c.collect(2)
        time.sleep(args.settle)     # both servers past their start-up's last work
        for i in range(args.rounds):
            seed = args.seed * 1000 + i
            row: dict = {"round": i, "seed": seed}
            for under in ((False, True) if i % 2 == 0 else (True, False)):
                port = port_t if under else port_b
                client = Client(port, args.model, vocab, seed, parse_lengths(args.prompt_len),
                                parse_lengths(args.output_len))
                client.k = (i + 1) * 100000          # ids apart from the other rounds'
                idle = trees[not under]
                c0 = sum(v[1] for v in thread_cpu(idle).values())
                load0 = os.getloadavg()[0]
                cell = poisson_cell(client, args.rate, args.requests, seed)
                c1 = sum(v[1] for v in thread_cpu(idle).values())
                seen = client.seen
                order = sorted(seen, key=lambda k: int(k[1:]))
                e2e = [seen[k][1] for k in order]
                ttft = [seen[k][0] for k in seen if seen[k][0] is not None]
                # the same requests between the kernel's stamps of their bytes: the server's
                # time without the client's own lateness (wire_client)
                wire = [client.wire[k] for k in order if client.wire.get(k, (0, None))[1]]
                w_e2e = [w[1] for w in wire]
                w_ttft = [w[0] for w in wire if w[0] is not None]
                arm = "tuiprof" if under else "bare"
                row[arm] = {"e2e_p50_ms": statistics.median(e2e),
                            "ttft_p50_ms": statistics.median(ttft), "e2e_total_ms": sum(e2e),
                            "wire_e2e_p50_ms": statistics.median(w_e2e) if w_e2e else None,
                            "wire_ttft_p50_ms": statistics.median(w_ttft) if w_ttft else None,
                            "wire_e2e_total_ms": sum(w_e2e),
                            "wire_requests": len(w_e2e),
                            "e2e_ms": e2e, "failed": client.failed,
                            "requests": len(seen), "wall_s": cell["wall_s"],
                            "load_average_1min": [load0, os.getloadavg()[0]],
                            "idle_other_cpu_s": round(c1 - c0, 3)}
                if under:
                    seen_t.update(seen)
                    wall_t.update(client.wall)
                    wire_t.update(client.wire)
                time.sleep(args.pause)
            b, t = row["bare"], row["tuiprof"]
            row["e2e_total_ratio"] = t["e2e_total_ms"] / b["e2e_total_ms"]
            row["e2e_p50_ratio"] = t["e2e_p50_ms"] / b["e2e_p50_ms"]
            row["ttft_p50_ratio"] = t["ttft_p50_ms"] / b["ttft_p50_ms"]
            if b["wire_requests"] == t["wire_requests"] == args.requests:
                row["wire_e2e_total_ratio"] = t["wire_e2e_total_ms"] / b["wire_e2e_total_ms"]
                row["wire_e2e_p50_ratio"] = t["wire_e2e_p50_ms"] / b["wire_e2e_p50_ms"]
                row["wire_ttft_p50_ratio"] = t["wire_ttft_p50_ms"] / b["wire_ttft_p50_ms"]
            rounds.append(row)
            print(json.dumps({k: (v if not isinstance(v, dict) else
                                  {x: y for x, y in v.items() if x != "e2e_ms"})
                              for k, v in row.items()}), flush=True)
    tot_b = sum(r["bare"]["e2e_total_ms"] for r in rounds)
    tot_t = sum(r["tuiprof"]["e2e_total_ms"] for r in rounds)
    loads = [x for r in rounds for a in ("bare", "tuiprof") for x in r[a]["load_average_1min"]]
    out = {"mode": "together", "e2e_total_ratio": tot_t / tot_b,
           "e2e_overhead": tot_t / tot_b - 1,
           "round_e2e_total_ratio_median": statistics.median(r["e2e_total_ratio"]
                                                             for r in rounds),
           "round_e2e_total_ratio_spread": _quartiles([r["e2e_total_ratio"] for r in rounds]),
           "round_e2e_p50_ratio_median": statistics.median(r["e2e_p50_ratio"] for r in rounds),
           "round_e2e_p50_ratio_spread": _quartiles([r["e2e_p50_ratio"] for r in rounds]),
           "round_ttft_p50_ratio_median": statistics.median(r["ttft_p50_ratio"]
                                                            for r in rounds),
           "bare_e2e_p50_ms_spread": _quartiles([r["bare"]["e2e_p50_ms"] for r in rounds]),
           "load_average_1min": [min(loads), max(loads)],
           "idle_tuiprof_server_cpu_s_per_bare_cell": statistics.median(
               r["bare"]["idle_other_cpu_s"] for r in rounds),
           "idle_bare_server_cpu_s_per_tuiprof_cell": statistics.median(
               r["tuiprof"]["idle_other_cpu_s"] for r in rounds),
           "cell_wall_s_median": statistics.median(r["bare"]["wall_s"] for r in rounds),
           # the client program's clock: its own lateness on a loaded host included
           "e2e_total_ratio_90pct": _bootstrap_totals(rounds, "e2e_total_ms")}
    wired = [r for r in rounds if "wire_e2e_total_ratio" in r]
    if wired:   # the target's figures: the wire's, the client's own delays left out
        out["wire"] = {
            "rounds": len(wired),
            "e2e_total_ratio": sum(r["tuiprof"]["wire_e2e_total_ms"] for r in wired)
            / sum(r["bare"]["wire_e2e_total_ms"] for r in wired),
            "e2e_total_ratio_90pct": _bootstrap_totals(wired, "wire_e2e_total_ms"),
            "round_e2e_total_ratio_spread": _quartiles([r["wire_e2e_total_ratio"]
                                                        for r in wired]),
            "round_e2e_p50_ratio_median": statistics.median(r["wire_e2e_p50_ratio"]
                                                            for r in wired),
            "round_e2e_p50_ratio_spread": _quartiles([r["wire_e2e_p50_ratio"] for r in wired]),
            "round_ttft_p50_ratio_median": statistics.median(r["wire_ttft_p50_ratio"]
                                                             for r in wired),
            "round_ttft_p50_ratio_spread": _quartiles([r["wire_ttft_p50_ratio"]
                                                       for r in wired]),
            "bare_e2e_p50_ms_spread": _quartiles([r["bare"]["wire_e2e_p50_ms"]
                                                  for r in wired])}
    out.update(agreement(snap, seen_t, wall_t, wire_t))
    out.update({"rounds": rounds, "args": vars(args), "logs": str(tmp)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--python", default=os.environ.get("TUIPROF_VLLM_PYTHON", sys.executable))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prompt-len", default="32")
    ap.add_argument("--output-len", default="32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=18250)
    ap.add_argument("--out", default=None)
    ap.add_argument("--breakdown", type=float, default=None, metavar="S",
                    help="one run under tuiprof with S seconds of load: where the time goes")
    ap.add_argument("--together", action="store_true",
                    help="both servers up at once, rounds of a seeded Poisson schedule each")
    ap.add_argument("--rate", type=float, default=4.0,
                    help="--together: requests/s of the Poisson schedule")
    ap.add_argument("--pause", type=float, default=2.0,
                    help="--together: seconds between two cells")
    ap.add_argument("--settle", type=float, default=15.0,
                    help="--together: seconds after the warm-ups before the first cell")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vllm-overhead-"))
    if args.together:
        res = together(args, tmp)
        print(json.dumps({k: v for k, v in res.items() if k != "rounds"}, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
        return 0
    if args.breakdown:
        res = breakdown(args, args.port, tmp)
        res["logs"] = str(tmp)
        print(json.dumps(res, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
        return 0
    runs = []
    for i in range(args.rounds):
        # the order alternates a round: neither arm always follows the other
        for under in ((False, True) if i % 2 == 0 else (True, False)):
            r = one_run(args, under, args.port + len(runs), tmp)
            r["round"] = i
            runs.append(r)
            print(json.dumps(r), flush=True)
    bare = [r["e2e_p50_ms"] for r in runs if not r["under_tuiprof"]]
    prof = [r["e2e_p50_ms"] for r in runs if r["under_tuiprof"]]
    rps_b = [r["requests_per_s"] for r in runs if not r["under_tuiprof"]]
    rps_p = [r["requests_per_s"] for r in runs if r["under_tuiprof"]]
    summary = {"e2e_p50_ms_bare": statistics.median(bare),
               "e2e_p50_ms_tuiprof": statistics.median(prof),
               "e2e_overhead": statistics.median(prof) / statistics.median(bare) - 1,
               "rps_bare": statistics.median(rps_b), "rps_tuiprof": statistics.median(rps_p),
               "throughput_cost": 1 - statistics.median(rps_p) / statistics.median(rps_b),
               # each round's own ratio (tuiprof / bare), whose median is steadier than the
               # ratio of medians when the machine's load drifts between rounds
               "round_e2e_ratio_median": statistics.median(
                   p["e2e_p50_ms"] / b["e2e_p50_ms"] for b, p in _pairs(runs)),
               "round_rps_ratio_median": statistics.median(
                   p["requests_per_s"] / b["requests_per_s"] for b, p in _pairs(runs)),
               "load_average_1min": [min(x for r in runs for x in r["load_average_1min"]),
                                     max(x for r in runs for x in r["load_average_1min"])],
               "runs": runs, "args": vars(args), "logs": str(tmp)}
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
