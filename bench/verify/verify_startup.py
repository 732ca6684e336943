"""Start-up time, before and after a change: command start -> first frame -> first token.

For each model and each code tree (``--tree OLD`` is the code before the change, measured the
same way; the tree this script is in is "after"):

(a) headless: ``python -m tuiprof --model M --headless --max-new-tokens 1``, timed from its
    start to its exit (one token, the prefill's, then the snapshot); the session's own phase
    timestamps come from the snapshot (``meta["startup"]``, "after" only: the old code has none).
(b) the live app in tmux at 200x50, timed from ``tmux new-session``: first drawn frame (the
    header's first line on screen), first token on screen (the header's token counter > 0),
    polling ``capture-pane`` every 0.1 s; then ``q`` and the automatic snapshot, whose
    ``meta["startup"]`` holds the session process's phases.

A warm-up first imports torch, transformers and textual and compiles both trees' bytecode,
so that "before" and "after" both run warm (the warm-up's own time is reported as the cold
import figure). Prints one table; details go to $OUT (startup.json, startup_screens.txt,
startup_runs.log) when OUT is set.

  H100:  python bench/verify/verify_startup.py --tree /path/to/old --tmux "$T"
  CPU:   python bench/verify/verify_startup.py --tiny --tree /tmp/old

Expected on the H100: about 3 minutes (warm-up ~15 s; per model and tree a headless run and an
app run with its quit, ~55 s before and ~25 s after if the old code takes ~25 s). ``--parts app``
skips the headless runs (~1.8 minutes): the app's snapshot still gives the session's phases.
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
TOKENS = re.compile(r"(?:tokens|steps) ([\d,]+)")  # the header: "steps N" (batch), "tokens N" (older)
POLL_S = 0.1


def log(run_log: list[str], text: str) -> None:
    run_log.append(text)
    print(text, flush=True)


def env_for(tree: Path) -> dict:
    """The environment of a run of ``tree``: its code first, then the rest of PYTHONPATH (on the
    GPU machine the carried wheels, Textual among them) without any checkout of tuiprof."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and not (Path(p) / "tuiprof" / "__init__.py").exists()]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), *rest]), PYTHONUNBUFFERED="1")
    env.pop("TUIPROF_MODELS_DIR", None)
    return env


def warm_up(trees: dict[str, Path], run_log: list[str]) -> float:
    """Compile both trees' bytecode and import the heavy modules once (page cache, .pyc)."""
    for tree in trees.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "tuiprof")],
                       capture_output=True, timeout=300)
    code = ("import torch, transformers, textual.app\n"
            "from transformers import Qwen3ForCausalLM\n"
            "if torch.cuda.is_available(): torch.cuda.init(); torch.zeros(1, device='cuda')\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    log(run_log, f"warm-up (imports torch, transformers, textual; CUDA context): {took:.1f} s "
                 f"rc={r.returncode} {r.stderr.strip()[-300:]}")
    return took


def startup_of(snapshot: Path) -> dict | None:
    try:
        meta = json.loads(snapshot.read_text())["meta"]
    except (OSError, ValueError, KeyError):
        return None
    return {"startup": meta.get("startup"), "load_s": meta.get("load_s"),
            "device_name": meta.get("device_name"), "device": meta.get("device")}


def headless(tree: Path, model: str, device: str | None, work: Path, timeout: float,
             run_log: list[str]) -> dict:
    """(a): one token headless; seconds from start to exit, plus the snapshot's phases."""
    out = work / "headless.json"
    cmd = [sys.executable, "-m", "tuiprof", "--model", model, "--headless", "--max-new-tokens", "1",
           "--json", str(out)] + (["--device", device] if device else [])
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=work, env=env_for(tree), capture_output=True, text=True,
                           timeout=timeout)
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired as exc:
        rc, err = "timeout", str(exc.stderr or "")
    exit_s = time.monotonic() - t0
    log(run_log, f"  headless rc={rc} exit {exit_s:.1f} s | {err.strip()[-600:]}")
    res = {"exit_s": round(exit_s, 2), "rc": rc}
    res.update(startup_of(out) or {})
    return res


class Tmux:
    def __init__(self, command: str) -> None:
        self.base = shlex.split(command)

    def __call__(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, check=check,
                              timeout=30)

    def screen(self, name: str) -> list[str]:
        return self("capture-pane", "-p", "-t", name).stdout.splitlines()

    def alive(self, name: str) -> bool:
        return self("has-session", "-t", name).returncode == 0


def live_app(tmux: Tmux, tree: Path, model: str, device: str | None, work: Path, name: str,
             timeout: float, run_log: list[str], screens: list[str]) -> dict:
    """(b): the app in tmux at 200x50: first frame, first token on screen, then q."""
    exp = work / "exp"
    exp.mkdir(exist_ok=True)
    cmd = (f"cd {shlex.quote(str(work))} && PYTHONPATH={shlex.quote(env_for(tree)['PYTHONPATH'])} "
           f"{shlex.quote(sys.executable)} -m tuiprof --model {shlex.quote(model)} "
           f"--export-dir {shlex.quote(str(exp))}" + (f" --device {device}" if device else "")
           + " || sleep 4")  # a failed start stays on screen for a moment: its reason is logged
    t0 = time.monotonic()
    started = tmux("new-session", "-d", "-s", name, "-x", "200", "-y", "50", cmd)
    if started.returncode != 0:
        log(run_log, f"  tmux new-session failed: {started.stderr.strip()[:300]}")
        return {"error": "tmux new-session failed"}
    first_frame = first_token = None
    frame_text = token_text = ""
    seen: list[str] = []
    while time.monotonic() - t0 < timeout and tmux.alive(name):
        lines = tmux.screen(name)
        now = time.monotonic() - t0
        seen = lines or seen
        if first_frame is None and lines and "tuiprof" in lines[0]:
            first_frame, frame_text = now, "\n".join(lines[:3])
        m = TOKENS.search(lines[1]) if len(lines) > 1 else None
        if first_frame is not None and m and int(m[1].replace(",", "")) > 0:
            first_token, token_text = now, "\n".join(lines[:3])
            break
        time.sleep(POLL_S)
    last = "\n".join(seen) if first_token is None else ""
    tmux("send-keys", "-t", name, "q")
    t_quit = time.monotonic()
    while tmux.alive(name) and time.monotonic() - t_quit < 40:
        time.sleep(0.2)
    if tmux.alive(name):
        tmux("kill-session", "-t", name)
    screens.append(f"=== {name}: first frame at {_r(first_frame)} s\n{frame_text}\n"
                   f"=== {name}: first token at {_r(first_token)} s\n{token_text}\n"
                   + (f"=== {name}: screen without a token\n{last}\n" if last else ""))
    snaps = sorted(exp.glob("tuiprof-*.json"))
    res = {"first_frame_s": _r(first_frame), "first_token_s": _r(first_token),
           "quit_s": round(time.monotonic() - t_quit, 1), "frame": frame_text}
    res.update(startup_of(snaps[-1]) if snaps else {})
    log(run_log, f"  app first frame {res['first_frame_s']} s, first token {res['first_token_s']} s, quit "
                 f"{res['quit_s']} s, snapshot {'yes' if snaps else 'no'}")
    return res


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


def shows_progress(frame: str, model: str) -> str:
    """What the first frame says: the model, the device and a progress line, or placeholders."""
    lines = frame.splitlines()
    if not lines:
        return "no frame"
    head = lines[0]
    known = model in head and "· ? ·" not in head
    progress = len(lines) > 1 and "loading" in lines[1]
    return ("model+device+progress" if known and progress else
            "model+device" if known else "placeholders (?)")


def table(results: list[dict], warm_s: float) -> str:
    rows = [f"warm-up (cold imports + CUDA context): {warm_s:.1f} s. Seconds from the "
            f"command's start; 'session' = the session's own first-token time (after only)",
            "| model | code | headless: exit | headless: 1st token (session) | app: 1st frame | "
            "app: 1st token (session) | app: 1st token on screen | first frame shows |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        h, a = r.get("headless", {}), r.get("app", {})
        hs, as_ = (h.get("startup") or {}), (a.get("startup") or {})
        rows.append(f"| {r['model']} | {r['code']} | {_s(h.get('exit_s'))} | "
                    f"{_s(hs.get('first_token_s'))} | {_s(a.get('first_frame_s'))} | "
                    f"{_s(as_.get('first_token_s'))} | {_s(a.get('first_token_s'))} | "
                    f"{shows_progress(a.get('frame', ''), r['model']) if a else '–'} |")
    rows.append("")
    for r in results:
        for part in ("headless", "app"):
            st = (r.get(part) or {}).get("startup")
            if not st:
                continue
            phases = " · ".join(f"{p['name']} {p['start_s']:.1f}+{p['seconds']:.2f}"
                                for p in st["phases"] if p.get("seconds") is not None)
            rows.append(f"{r['model']} {r['code']} {part} phases (start+seconds): {phases}; "
                        f"first token {_s(st.get('first_token_s'))} s")
        load = (r.get("headless") or {}).get("load_s") or (r.get("app") or {}).get("load_s")
        if r["code"] == "before" and load is not None:
            rows.append(f"{r['model']} before: model build (meta load_s) {load:.2f} s")
    dev = next((x.get(p, {}).get("device_name") for x in results for p in ("headless", "app")
                if x.get(p, {}).get("device_name")), None)
    if dev:
        rows.insert(0, f"device: {dev}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated (default qwen3-0.6b,nanochat-d34; "
                                     "--tiny: qwen3-tiny,nanochat-tiny)")
    ap.add_argument("--tree", help="checkout of the code before the change (the 'before' column)")
    ap.add_argument("--tmux", default="tmux -L tuiprof-startup",
                    help="tmux command, e.g. '/tmp/tmxroot/usr/bin/tmux -S /tmp/tmx.sock'")
    ap.add_argument("--device", help="passed to tuiprof (default: its own choice)")
    ap.add_argument("--tiny", action="store_true",
                    help="CPU check: qwen3-tiny and nanochat-tiny on --device cpu")
    ap.add_argument("--parts", default="headless,app")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per run")
    args = ap.parse_args()
    if args.tiny:
        args.device = args.device or "cpu"
    args.models = args.models or ("qwen3-tiny,nanochat-tiny" if args.tiny
                                  else "qwen3-0.6b,nanochat-d34")
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    trees = {"after": HERE}
    if args.tree:
        trees = {"before": Path(args.tree).resolve(), "after": HERE}
    parts = set(args.parts.split(","))
    run_log: list[str] = []
    screens: list[str] = []
    results: list[dict] = []
    tmux = Tmux(args.tmux)
    t_all = time.monotonic()
    if "app" in parts:
        tmux("kill-session", "-t", "tuiprof-warm")
        tmux("new-session", "-d", "-s", "tuiprof-warm", "sleep 900")  # the server is up
    warm_s = warm_up(trees, run_log)
    models = args.models.split(",")
    for i, model in enumerate(models):
        codes = list(trees) if i % 2 == 0 else list(reversed(trees))  # alternate the order
        for code in codes:
            log(run_log, f"{model} {code} ({trees[code]})")
            r = {"model": model, "code": code}
            with tempfile.TemporaryDirectory(prefix="tuiprof-startup-") as tmp:
                work = Path(tmp)
                if "headless" in parts:
                    r["headless"] = headless(trees[code], model, args.device, work, args.timeout,
                                             run_log)
                if "app" in parts:
                    r["app"] = live_app(tmux, trees[code], model, args.device, work,
                                        f"su-{i}-{code}", args.timeout, run_log, screens)
            results.append(r)
    if "app" in parts:
        tmux("kill-session", "-t", "tuiprof-warm")
    text = table(results, warm_s)
    print("\n" + text)
    print(f"\n(total {time.monotonic() - t_all:.0f} s)")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "startup.json").write_text(json.dumps({"warm_s": warm_s, "results": results},
                                                     indent=1))
        (out / "startup_screens.txt").write_text("\n".join(screens))
        (out / "startup_runs.log").write_text("\n".join(run_log) + "\n\n" + text + "\n")
    ok = all((r.get("app") or {"first_token_s": 1}).get("first_token_s") is not None
             for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
