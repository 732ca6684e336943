"""A hand-written decode loop (a toy recurrent LM in plain torch) that marks its steps with
tuiprof.step, which does nothing when the script runs without tuiprof.

Usage: python custom_loop.py [--batch N] [--steps N]
"""
import argparse

import torch

import tuiprof

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=3)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--prompt-len", type=int, default=7)
args = p.parse_args()

torch.manual_seed(0)
embed = torch.nn.Embedding(256, 32)
cell = torch.nn.GRUCell(32, 32)
head = torch.nn.Linear(32, 256)
prompt = torch.randint(0, 256, (args.batch, args.prompt_len))

with torch.no_grad():
    with tuiprof.step("prefill", tokens=args.batch):
        h = torch.zeros(args.batch, 32)
        for t in range(args.prompt_len):
            h = cell(embed(prompt[:, t]), h)
        tok = head(h).argmax(-1)
    out = [tok]
    for _ in range(args.steps):
        with tuiprof.step("decode", tokens=args.batch):
            h = cell(embed(tok), h)
            tok = head(h).argmax(-1)
        out.append(tok)
print("tokens of sequence 0:", [int(t[0]) for t in out])
