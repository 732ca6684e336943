"""A hand-written loop that pushes an NVTX range per step, as servers do (vLLM, SGLang). Each
step launches a known number of kernels: 3 matmuls and 3 tanh. Knows nothing of tuiprof.

Usage: python nvtx_loop.py [--steps 40] [--device cpu]
"""
import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--device", default="cuda")
args = p.parse_args()

x = torch.randn(512, 512, device=args.device)
w = torch.randn(512, 512, device=args.device) / 32
cuda = args.device.startswith("cuda")
push, pop = ((torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop) if cuda
             else (lambda name: None, lambda: None))   # a CPU build of torch has no NVTX
for i in range(args.steps):
    push("decode_step")
    for _ in range(3):
        x = torch.tanh(x @ w)
    if cuda:
        torch.cuda.synchronize()   # the step's kernels end inside its range
    pop()
print(f"NVTX_STEPS={args.steps} KERNELS_PER_STEP=6 checksum={float(x.sum()):.3f}")
