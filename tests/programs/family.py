"""A program whose work happens in processes it starts: an engine process (multiprocessing,
spawn) that runs ``generate()`` and starts a helper of its own (``subprocess`` running Python:
a grandchild), a process that crashes (a segfault), one that ends with ``os._exit(3)``, a
forked one (multiprocessing's fork: no new interpreter) and one forked by multiprocessing's
forkserver.

Usage: python family.py [--new-tokens N]
"""
import argparse
import ctypes
import json
import multiprocessing as mp
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).parent
CONFIG = HERE.parents[1] / "models" / "qwen3-tiny.json"


def engine(new_tokens, requests, done):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    helper = subprocess.Popen([sys.executable, str(HERE / "custom_loop.py"), "--steps", "4"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**json.loads(
        CONFIG.read_text())["config"])).eval()
    for i in range(requests):
        ids = torch.tensor([[1 + i, 2, 3, 4, 5, 6, 7, 8]])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        print("engine: request", i, "->", out[0, 8:].tolist(), flush=True)
    helper.wait()
    done.put(helper.returncode)


def crasher():
    import torch

    import tuiprof
    for _ in range(3):
        with tuiprof.step("decode"):
            torch.ones(64).sum()
    time.sleep(2.5)              # a while after its last step (tuiprof fetches every second)
    print("crasher: about to crash", flush=True)
    ctypes.string_at(0)          # SIGSEGV


def quitter():
    import torch

    import tuiprof
    for _ in range(2):
        with tuiprof.step("decode"):
            torch.ones(64).sum()
    print("quitter: leaving with os._exit(3)", flush=True)
    os._exit(3)


def forked():
    import torch

    import tuiprof
    for _ in range(2):
        with tuiprof.step("decode"):
            torch.ones(64).sum()
    print("forked: done", flush=True)


def served(touch_cuda):
    """Forked from multiprocessing's forkserver (which never touched CUDA): CUPTI may start in
    it, at its first CUDA call (here on a CPU-only torch, the call fails after tuiprof's hook
    has run, as a program's first call would succeed on a GPU)."""
    import torch

    import tuiprof
    if touch_cuda:
        try:
            torch.cuda.init()
        except Exception as exc:
            print("served: no CUDA here:", type(exc).__name__, flush=True)
    for _ in range(2):
        with tuiprof.step("decode"):
            torch.ones(64).sum()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--new-tokens", type=int, default=5)
    p.add_argument("--requests", type=int, default=2)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    procs = [ctx.Process(target=engine, args=(args.new_tokens, args.requests, done),
                         name="EngineCore"),
             ctx.Process(target=crasher, name="crasher"), ctx.Process(target=quitter, name="quitter")]
    procs.append(mp.get_context("fork").Process(target=forked, name="forked"))
    procs.append(mp.get_context("forkserver").Process(target=served, args=(True,),
                                                      name="served"))
    for proc in procs:
        proc.start()
    print("helper exit", done.get(timeout=600), flush=True)
    for proc in procs:
        proc.join(120)
        print(proc.name, "exit code", proc.exitcode, flush=True)


if __name__ == "__main__":
    main()
