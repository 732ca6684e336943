"""Run the live app in tmux as a user would and capture the screen after each step.

One GPU call can drive a whole session: start ``tuiprof ...`` in a detached tmux session of
the given size, then for each step wait, send keys and capture the pane into one text file.

    python bench/verify/tmux_capture.py --tmux "$T" --size 200x50 --name tp2 \\
        --steps "40:;0:g;5:a;5:Escape;2:q" -- python -m tuiprof --model qwen3-0.6b --tp 2

A step is ``SECONDS:KEYS`` (keys separated by spaces, as tmux send-keys takes them; empty:
only capture). Captures go to ``$OUT/<name>.txt`` (or stdout without $OUT), each headed by
the time since start and the keys sent before it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tmux", default="tmux -L tuiprof-capture", help="tmux command")
    ap.add_argument("--size", default="200x50")
    ap.add_argument("--name", default="capture")
    ap.add_argument("--steps", required=True, help="SECONDS:KEYS;SECONDS:KEYS;...")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command after --")
    tmux = shlex.split(args.tmux)
    w, h = args.size.split("x")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in os.environ.items()
                   if k in ("PYTHONPATH", "NCCL_NVLS_ENABLE", "CUDA_VISIBLE_DEVICES"))
    shell = f"cd {shlex.quote(os.getcwd())} && env {env} TERM=xterm-256color {shlex.join(cmd)}; sleep 3"
    run = lambda *a: subprocess.run([*tmux, *a], capture_output=True, text=True, timeout=30)  # noqa: E731
    run("kill-session", "-t", args.name)
    started = run("new-session", "-d", "-s", args.name, "-x", w, "-y", h, shell)
    if started.returncode != 0:
        print(f"tmux new-session failed: {started.stderr.strip()}", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    out: list[str] = []
    for step in args.steps.split(";"):
        wait, _, keys = step.partition(":")
        time.sleep(float(wait or 0))
        if keys.strip():
            run("send-keys", "-t", args.name, *keys.split())
            time.sleep(0.7)
        screen = run("capture-pane", "-p", "-t", args.name).stdout
        out.append(f"===== {args.name} {args.size} t={time.monotonic() - t0:.1f}s "
                   f"after keys [{keys.strip()}]\n{screen}")
        if run("has-session", "-t", args.name).returncode != 0:
            out.append("===== session ended")
            break
    deadline = time.monotonic() + 60
    while run("has-session", "-t", args.name).returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    run("kill-session", "-t", args.name)
    text = "\n".join(out)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"{args.name}.txt").write_text(text)
        print(f"{args.name}: {len(out)} captures -> $OUT/{args.name}.txt")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
