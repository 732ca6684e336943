"""Why eager steps beside a background compile are ~10x slower, and what throttling the compile
would buy: decode steps on this thread while another thread (a) spins in pure Python or (b)
runs a real ``torch.compile`` of the same step, plain or throttled by a per-thread profile hook
that sleeps a share of each 5 ms slice (a prototype: tuiprof's engine does not throttle).

Every torch op releases the GIL around its dispatch and must take it back, so each op of the
step waits for the other thread to give the GIL up (one switch interval, or the OS's handoff
latency when the interval is tiny). Run on the CPU (qwen3-tiny) or a GPU (``--model``)::

    python bench/probes/beside_compile.py --part gil                 # spinning thread, 4 intervals
    python bench/probes/beside_compile.py --part compile --share 1   # a real compile, not throttled
    python bench/probes/beside_compile.py --part compile --share 0.5 # throttled to half the time
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tuiprof.engine.compile_support import beside_compile  # noqa: E402
from tuiprof.engine.load import load_model  # noqa: E402

SLICE_S = 0.005


class Stepper:
    """Eager decode steps of a loaded model on a static cache, wrapping before it is full."""

    def __init__(self, model: str, device: str) -> None:
        self.loaded = load_model(model, device=device, seed=0, max_len=512)
        self.ad, self.cuda = self.loaded.adapter, device.startswith("cuda")
        self.cache = self.ad.new_cache(1)
        self.tok = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.pos = torch.tensor([0], device=device)

    def step(self) -> float:
        t = time.perf_counter()
        beside_compile(self.ad.decode, self.tok, self.pos, self.cache)
        if self.cuda:
            torch.cuda.synchronize()
        if int(self.pos) + 1 >= 400:
            self.pos.fill_(0)
            self.ad.truncate(0, self.cache)
        else:
            self.pos.add_(1)
        return (time.perf_counter() - t) * 1e3

    def median(self, n: int) -> float:
        return statistics.median(self.step() for _ in range(n))


def throttle_hook(share: float):
    """A profile hook for the compile thread: after each ``SLICE_S`` of running, sleep so that
    it runs ``share`` of the time (sleeping releases the GIL to the decode thread)."""
    state = {"n": 0, "t": time.perf_counter()}
    clock, sleep = time.perf_counter, time.sleep

    def hook(frame, event, arg):
        state["n"] += 1
        if state["n"] & 255 == 0 and clock() - state["t"] > SLICE_S:
            sleep(SLICE_S * (1 - share) / share)
            state["t"] = clock()
    return hook


def part_gil(s: Stepper) -> None:
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i * i
    print(f"alone: {s.median(200):.2f} ms/step")
    for interval in (2e-5, 1e-4, 1e-3, 5e-3):
        sys.setswitchinterval(interval)
        stop.clear()
        th = threading.Thread(target=spin, daemon=True)
        th.start()
        r = s.median(10)
        stop.set()
        th.join()
        sys.setswitchinterval(5e-3)
        print(f"beside a spinning thread, switch interval {interval * 1e6:5.0f} µs: {r:.2f} ms/step")


def part_compile(s: Stepper, share: float, mode: str) -> None:
    clean = s.median(200)
    sys.setswitchinterval(2e-5)   # as the engine sets it while a compile runs
    done, out = threading.Event(), {}
    scratch = s.ad.new_cache(1)

    def compile_() -> None:
        torch.set_grad_enabled(False)
        if share < 1:
            sys.setprofile(throttle_hook(share))
        t = time.perf_counter()
        fn = torch.compile(s.ad.decode, mode=mode)
        fn(torch.zeros_like(s.tok), torch.tensor([5], device=s.tok.device), scratch)
        sys.setprofile(None)
        out["s"] = time.perf_counter() - t
        done.set()
    th = threading.Thread(target=compile_, daemon=True)
    th.start()
    steps = []
    while not done.is_set():
        steps.append(s.step())
    th.join()
    print(f"share {share}: clean {clean:.2f} ms/step; beside the compile median "
          f"{statistics.median(steps):.2f}, mean {statistics.mean(steps):.2f} ms/step over "
          f"{len(steps)} steps; compile {out['s']:.1f} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=("gil", "compile"), default="gil")
    p.add_argument("--model", default="qwen3-tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--share", type=float, default=1.0)
    p.add_argument("--compile-mode", default="default")
    a = p.parse_args()
    torch.set_grad_enabled(False)
    s = Stepper(a.model, a.device)
    for _ in range(30):
        s.step()
    if a.part == "gil":
        part_gil(s)
    else:
        part_compile(s, a.share, a.compile_mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
