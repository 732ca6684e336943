"""A user's run of the multi-host attach, in a real terminal: a two-node ``torchrun --nnodes 2``
job (two agents, c10d rendezvous on 127.0.0.1, gloo on the CPU, one worker each), each node
under ``tuiprof run --detach --listen 127.0.0.1:PORT --token-file F``; ``tuiprof attach A=…
B=… --token-file F`` in tmux at each size; every footer key of the main screen and of the
all-processes screen; node B killed whole (its keeper's process group and its processes),
then the job restarted on both nodes (re-attached). Each screen is captured with tmux
capture-pane, one after another in ``screenshots/fleet_attach_<cols>x<rows>.txt`` with a line
naming what was just done.

Usage: python bench/verify/fleet_tmux.py [--sizes 200x50,80x24] [--out screenshots]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.sessions.fleet_nodes import (env, free_port, kill_node, new_token,  # noqa: E402
                                        nodes, private_runtime)
from tuiprof.sessions import runtime  # noqa: E402

# the main screen's footer, then the all-processes screen's (each key, what to wait for after)
MAIN_KEYS = ["1", "2", "3", "4", "5", "6", "7", "8", "9", "g", "c", "b", "B", "l", "Escape",
             "v", "Escape", "Space", "Space", "r", "e", "n", "?", "Escape"]
# after these keys, wait for the screen to say so (space pauses one rank at its next step:
# the second space resumes it only once it is paused, else the job stays stuck on that rank)
WAIT_AFTER = {("main", 17): "paused", ("main", 18): "resum"}
ALL_KEYS = ["a", "g", "g", "c", "b", "B", "l", "Escape", "v", "Escape", "r", "e", "?",
            "Escape", "Escape"]


def pids_of(sid: str) -> list:
    """The session's processes (the keeper's ``procs``): the agent, its worker."""
    from tuiprof.sessions import protocol

    try:
        c = protocol.Client.unix(str(runtime.runtime_root() / sid / "s.sock"), role="control")
        procs = c.request("procs", timeout=10)
        c.close(bye=True)
    except protocol.ProtocolError:
        return []
    return [p["pid"] for p in procs if isinstance(p.get("pid"), int)]


class Tmux:
    def __init__(self, sock: str, name: str) -> None:
        self.base = ["tmux", "-S", sock]
        self.name = name

    def start(self, cols: int, rows: int, command: str) -> None:
        subprocess.run(self.base + ["new-session", "-d", "-s", self.name, "-x", str(cols), "-y",
                                    str(rows), command], check=True, env=env())

    def keys(self, key: str) -> None:
        out = subprocess.run(self.base + ["send-keys", "-t", self.name, key],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"tmux send-keys {key}: {out.stderr.strip()}")

    def capture(self) -> str:
        return subprocess.run(self.base + ["capture-pane", "-p", "-t", self.name],
                              capture_output=True, text=True).stdout

    def wait_for(self, text: str, seconds: float) -> bool:
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            if text in self.capture():
                return True
            time.sleep(0.5)
        return False

    def kill(self) -> None:
        subprocess.run(self.base + ["kill-server"], capture_output=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="200x50,80x24")
    p.add_argument("--out", default=str(REPO / "screenshots"))
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleettmux-"))
    private_runtime()
    token = new_token(tmp)
    ports = (free_port(), free_port())
    sessions: list = []
    try:
        for size in args.sizes.split(","):
            cols, rows = (int(x) for x in size.split("x"))
            for sid in sessions:         # each size starts from a fresh job
                kill_node(sid, pids_of(sid))
            time.sleep(2)
            sessions = nodes(tmp, ports, token, seconds=900)
            tmux = Tmux(str(tmp / f"tmux-{size}.sock"), "fleet")
            shots: list = []

            def shot(what: str, pause: float = 1.5) -> None:
                time.sleep(pause)
                shots.append(f"===== {size} · {what}\n{tmux.capture().rstrip()}\n")

            cmd = (f"{sys.executable} -m tuiprof attach A=127.0.0.1:{ports[0]} "
                   f"B=127.0.0.1:{ports[1]} --token-file {token} --export-dir {tmp}; "
                   f"echo exit status $?; sleep 900")   # what q leaves on the terminal
            tmux.start(cols, rows, cmd)
            try:
                tmux.wait_for("tp_job", 90)
                time.sleep(40)      # the model loads on both nodes, the job decodes
                shot("attached to A and B")
                for i, key in enumerate(MAIN_KEYS):
                    tmux.keys(key)
                    if ("main", i) in WAIT_AFTER:
                        tmux.wait_for(WAIT_AFTER[("main", i)], 30)
                    shot(f"main screen, key {key}")
                for key in ALL_KEYS:
                    tmux.keys(key)
                    shot(f"all-processes screen, key {key}")
                tmux.keys("a")
                shot("all processes (a), before B goes")
                kill_node(sessions[1], pids_of(sessions[1]))
                shot("node B killed (keeper's process group and its processes, SIGKILL)", 4)
                shot("15 s later", 15)
                for sid in sessions:
                    kill_node(sid, pids_of(sid))   # A's rank failed with B's; the job restarts on both
                time.sleep(2)
                sessions = nodes(tmp, ports, token, seconds=900)
                tmux.wait_for("attached again", 90)
                shot("the job restarted on both nodes: attached again", 30)
                tmux.keys("Escape")
                shot("main screen after the restart")
                tmux.keys("q")
                shot("q: detached", 3)
            except Exception as exc:   # what the screen showed when it went wrong
                shots.append(f"===== {size} · the driver failed: {exc}\n{tmux.capture()}\n")
                raise
            finally:
                Path(args.out, f"fleet_attach_{size}.txt").write_text("\n".join(shots))
                tmux.kill()
            print(f"wrote {args.out}/fleet_attach_{size}.txt ({len(shots)} screens)", flush=True)
    finally:
        for sid in sessions:
            kill_node(sid, pids_of(sid))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
