"""`c` (eager -> compiled) and then `b` (batch 2, compiled) in the live app, cold and warm.

The app runs in tmux at 200x50 as a user runs it. Per run: wait for the first token, decode
eager for ``--eager-s`` seconds (the rate before `c`), press `c`, poll the header every 0.5 s
until it says ``mode compiled`` with no compile running; then `b` the same way (batch 2).
The screen is captured every 5 s. From the header's step counter it reports: seconds from `c`
to compiled mode, eager steps/s before `c` and beside the compile (whole window, per 5 s and
the slowest 5 s window), and the same for `b`.

"cold": a fresh, empty inductor cache; "warm": the same cache again (the second session on the
machine). ``--code after`` is this tree's default (cold: a helper process fills the persistent
cache while this process traces, see tuiprof/engine/compile_helper.py; warm: the compile is
marked in the cache and runs from it with decoding paused); ``--code before`` is the compile beside decoding
in one process (TUIPROF_COMPILE_HELPER=off) with inductor's cache in a fresh directory of its
own (TORCHINDUCTOR_CACHE_DIR), i.e. the earlier behaviour. On the H100, each call about
4-5 minutes::

    python bench/verify/compile_live.py --tmux "$T" --code after
    python bench/verify/compile_live.py --tmux "$T" --code before

Writes ``$OUT/compile_live_<code>.json`` and ``$OUT/compile_live_<code>_screens.txt``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
STEPS = re.compile(r"steps ([\d,]+)")


class Tmux:
    def __init__(self, command: str) -> None:
        self.base = shlex.split(command)

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=30)

    def screen(self, name: str) -> list[str]:
        return self("capture-pane", "-p", "-t", name).stdout.splitlines()

    def alive(self, name: str) -> bool:
        return self("has-session", "-t", name).returncode == 0


def header(lines: list[str]) -> tuple[int | None, str, str]:
    """(steps, line 1, line 2) of the app's header."""
    l1 = lines[0] if lines else ""
    l2 = lines[1] if len(lines) > 1 else ""
    m = STEPS.search(l2)
    return (int(m[1].replace(",", "")) if m else None), l1, l2


def settled(l1: str, batch: int) -> bool:
    return "mode compiled" in l1 and f"batch {batch}" in l1 and "compiling" not in l1


class Run:
    def __init__(self, tmux: Tmux, name: str, screens: list[str]) -> None:
        self.tmux, self.name, self.screens = tmux, name, screens
        self.t0 = time.monotonic()
        self.last_capture = -1e9
        self.samples: list[tuple[float, int | None, str]] = []

    def poll(self, tag: str) -> tuple[int | None, str, str]:
        lines = self.tmux.screen(self.name)
        steps, l1, l2 = header(lines)
        now = time.monotonic() - self.t0
        self.samples.append((round(now, 2), steps, tag))
        if now - self.last_capture >= 5.0:
            self.last_capture = now
            self.screens.append(f"===== {self.name} t={now:.1f}s [{tag}] steps={steps}\n"
                                + "\n".join(lines))
        return steps, l1, l2

    def wait(self, cond, timeout: float, tag: str, every: float = 0.5):
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.tmux.alive(self.name):
            steps, l1, l2 = self.poll(tag)
            if cond(steps, l1, l2):
                return time.monotonic() - self.t0, steps
            time.sleep(every)
        return None, None


def rate(samples, t_from: float, t_to: float) -> float | None:
    pts = [(t, s) for t, s, _ in samples if s is not None and t_from <= t <= t_to]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return round((pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]), 2)


def per_5s(samples, t_from: float, t_to: float) -> list[float | None]:
    out, t = [], t_from
    while t < t_to:
        out.append(rate(samples, t, min(t + 5.0, t_to)))
        t += 5.0
    return out


def kernels_by_config(path: Path) -> dict:
    """Median kernels per traced decode step (whole step and model forward) for each (mode,
    batch) of the snapshot, steps beside a compile left out: the compiled mode reached through
    the helper must launch what the one-process compile launched (522 a step, batch 1)."""
    import statistics

    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    out: dict = {}
    groups: dict = {}
    for t in doc.get("tokens", []):
        if t.get("done") and t.get("phase") == "decode" and t.get("sampled") \
                and not t.get("compiling"):
            groups.setdefault(f"{t['mode']} b{t['batch']}", []).append(t)
    for key, ts in groups.items():
        model = [t["model_kernels"] for t in ts if t.get("model_start_ns") and t.get("kernels")]
        out[key] = {"steps": len(ts), "kernels": statistics.median(t["kernels"] for t in ts),
                    "model": statistics.median(model) if model else None,
                    "graph": statistics.median(t.get("graph_kernels", 0) for t in ts)}
    return out


def kernel_names(path: Path, mode: str = "compiled") -> list[str]:
    """The names of the kernels ``mode``'s decode steps launched, every configuration of the
    snapshot: a step loaded from the file a cold compile saved must launch the same ones."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    parts = [doc, *doc.get("configurations", [])]
    return sorted({k["name"] for p in parts for k in p.get("kernels", [])
                   if k.get("mode") == mode and k.get("phase") == "decode"})


def switch(run: Run, tmux: Tmux, name: str, key: str, batch: int, timeout: float,
           res: dict) -> float | None:
    """Press ``key``, wait for compiled mode at ``batch``; into ``res``: ``<key>_to_compiled_s``,
    the steps/s decoded meanwhile (``<key>_rate``) and per 5 s (``<key>_per_5s``)."""
    t0 = time.monotonic() - run.t0
    tmux("send-keys", "-t", name, key)
    t_done, _ = run.wait(lambda s, a, b: settled(a, batch), timeout, f"after {key}")
    res[f"{key}_to_compiled_s"] = None if t_done is None else round(t_done - t0, 1)
    # the status line's own account ("compiled in 9.8 s (dynamo …, inductor …, CUDA graphs …)")
    said = [ln for ln in tmux.screen(name) if "compiled in" in ln or "compiled for batch" in ln]
    res[f"{key}_status"] = said[-1].split("│")[0].strip() if said else None
    end = t_done if t_done is not None else time.monotonic() - run.t0
    res[f"{key}_rate"] = rate(run.samples, t0, end)
    res[f"{key}_per_5s"] = per_5s(run.samples, t0, end)
    # the worst 5 s window beside the compile (a mean hides the moments decoding nearly stops)
    windows = [r for r in res[f"{key}_per_5s"] if r is not None]
    res[f"{key}_min_5s"] = min(windows) if windows else None
    return t_done


def one(tmux: Tmux, args, code: str, kind: str, env: dict, screens: list[str],
        cache: Path | None = None) -> dict:
    name = f"cl-{code}-{kind}"
    tmux("kill-session", "-t", name)
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    exp = Path(tempfile.mkdtemp(prefix=f"tuiprof-snap-{code}-{kind}-"))
    cmd = (f"cd {shlex.quote(str(HERE))} && env {envs} TERM=xterm-256color "
           f"{shlex.quote(sys.executable)} -m tuiprof --model {shlex.quote(args.model)} "
           f"--export-dir {shlex.quote(str(exp))}; sleep 3")
    tmux("new-session", "-d", "-s", name, "-x", "200", "-y", "50", cmd)
    run = Run(tmux, name, screens)
    res: dict = {"code": code, "kind": kind, "env": env}
    t_first, _ = run.wait(lambda s, a, b: (s or 0) > 1, args.start_timeout, "start")
    res["first_step_s"] = t_first
    if t_first is None:
        res["error"] = "no step on screen"
        tmux("kill-session", "-t", name)
        return res
    end_eager = time.monotonic() + args.eager_s
    run.wait(lambda s, a, b: time.monotonic() >= end_eager, args.eager_s + 5, "eager")
    t_c = time.monotonic() - run.t0
    res["eager_rate"] = rate(run.samples, t_c - min(10.0, args.eager_s - 1), t_c)
    t_done = switch(run, tmux, name, "c", 1, args.compile_timeout, res)
    if res["eager_rate"] and res.get("c_rate") is not None:
        res["beside_share"] = round(res["c_rate"] / res["eager_rate"], 3)
    if t_done is not None:
        run.wait(lambda s, a, b: time.monotonic() - run.t0 >= t_done + 5, 8, "compiled")
        res["compiled_rate"] = rate(run.samples, t_done + 1, t_done + 5)
        if args.wait_saved and cache is not None and kind == "cold":
            # a cold compile's helper saves the compiled step for the next session after it
            # (tuiprof/engine/precompiled.py); a session that quits first stops it
            end = time.monotonic() + args.wait_saved
            while time.monotonic() < end and not list(cache.glob("*/precompiled/*.bin")):
                time.sleep(0.5)
            found = list(cache.glob("*/precompiled/*.bin"))
            res["saved_after_s"] = (round(min(p.stat().st_mtime for p in found) - time.time()
                                          + (time.monotonic() - run.t0) - t_done, 1)
                                    if found else None)
        if args.batch:
            switch(run, tmux, name, "b", 2, args.compile_timeout, res)
    lines = tmux.screen(name)
    res["last_header"] = lines[:2]
    res["status_line"] = next((ln.strip()[:240] for ln in lines if "compile" in ln), "")
    tmux("send-keys", "-t", name, "q")
    t_q = time.monotonic()
    while tmux.alive(name) and time.monotonic() - t_q < 30:
        time.sleep(0.2)
    res["quit_s"] = round(time.monotonic() - t_q, 1)
    tmux("kill-session", "-t", name)
    helpers = subprocess.run(["pgrep", "-f", "tuiprof.engine.compile_helper"],
                             capture_output=True, text=True).stdout.split()
    res["helpers_left"] = len(helpers)
    snaps = sorted(exp.glob("tuiprof-*.json"))
    res["kernels"] = kernels_by_config(snaps[-1]) if snaps else None
    res["compiled_kernel_names"] = kernel_names(snaps[-1]) if snaps else []
    res["samples"] = run.samples
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tmux", default="tmux -L tuiprof-compile")
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--code", choices=("after", "before"), default="after")
    ap.add_argument("--kinds", default="cold,warm")
    ap.add_argument("--eager-s", type=float, default=20.0, help="eager decoding before `c`")
    ap.add_argument("--compile-timeout", type=float, default=140.0)
    ap.add_argument("--start-timeout", type=float, default=60.0)
    ap.add_argument("--no-batch", dest="batch", action="store_false", help="skip `b`")
    ap.add_argument("--env", action="append", default=[],
                    help="KEY=VALUE for the app (e.g. TUIPROF_COMPILE_OVERLAP=0, "
                         "TUIPROF_WARM_COMPILE=beside); repeatable")
    ap.add_argument("--tag", default="", help="appended to the output files' names")
    ap.add_argument("--wait-saved", type=float, default=0.0, metavar="S",
                    help="after compiled mode, wait up to S s for the helper to save the compiled "
                         "step (the next session's `c` loads it) before quitting")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", ".")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmux = Tmux(args.tmux)
    tmux("kill-session", "-t", "cl-keep")
    tmux("new-session", "-d", "-s", "cl-keep", "sleep 900")  # the server stays up
    cache = Path(tempfile.mkdtemp(prefix=f"tuiprof-inductor-{args.code}-"))
    base = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "NCCL_NVLS_ENABLE": "0"}
    if args.code == "after":
        env = {**base, "TUIPROF_INDUCTOR_CACHE": str(cache)}
    else:
        env = {**base, "TUIPROF_COMPILE_HELPER": "off", "TUIPROF_INDUCTOR_CACHE": "off",
               "TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(cache / "triton")}
    env.update(kv.split("=", 1) for kv in args.env)
    tag = f"{args.code}{('_' + args.tag) if args.tag else ''}"
    screens: list[str] = []
    results = []
    t_all = time.monotonic()
    for kind in args.kinds.split(","):
        r = one(tmux, args, args.code, kind, env, screens, cache)
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k not in ("samples", "env")}), flush=True)
    tmux("kill-session", "-t", "cl-keep")
    print(f"\n{args.model}, code {args.code} (cache {cache}); total {time.monotonic() - t_all:.0f} s")
    print("| code | cache | `c` → compiled s | eager before tok/s | eager beside tok/s (share) | "
          "beside `c`: min over 5 s windows (share) | compiled tok/s | `b` → compiled s | "
          "beside `b` tok/s (min 5 s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        low, before = r.get("c_min_5s"), r.get("eager_rate")
        low_share = round(low / before, 3) if low is not None and before else None
        print(f"| {r['code']} | {r['kind']} | {r.get('c_to_compiled_s')} | {before} | "
              f"{r.get('c_rate')} ({r.get('beside_share')}) | {low} ({low_share}) | "
              f"{r.get('compiled_rate')} | {r.get('b_to_compiled_s')} | {r.get('b_rate')} "
              f"({r.get('b_min_5s')}) |")
    for r in results:
        print(f"{r['code']} {r['kind']}: per 5 s beside `c` {r.get('c_per_5s')}; "
              f"beside `b` {r.get('b_per_5s')}; helpers left {r.get('helpers_left')}; "
              f"quit {r.get('quit_s')} s; kernels/step {r.get('kernels')}; "
              f"status: {r.get('status_line')}")
        print(f"{r['code']} {r['kind']}: `c` said {r.get('c_status')!r}; `b` said {r.get('b_status')!r}; "
              f"compiled step saved {r.get('saved_after_s')} s after compiled mode")
    named = {r["kind"]: r.get("compiled_kernel_names") or [] for r in results}
    if named.get("cold") and named.get("warm"):
        cold, warm = set(named["cold"]), set(named["warm"])
        print(f"compiled kernel names, cold vs warm: {len(cold)} / {len(warm)}, "
              + ("the same" if cold == warm else
                 f"only cold {sorted(cold - warm)[:8]}, only warm {sorted(warm - cold)[:8]}"))
    (out / f"compile_live_{tag}.json").write_text(json.dumps(results, indent=1))
    (out / f"compile_live_{tag}_screens.txt").write_text("\n".join(screens))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
