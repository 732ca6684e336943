"""An ordinary script: greedy ``generate()`` of a tiny Qwen3 built from a config.

Usage: python hf_generate.py [--batch N ...] [--new-tokens N] [--static]
One ``generate()`` per batch size given, in order.
"""
import argparse
import json
import pathlib
import time

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, nargs="+", default=[1])
p.add_argument("--prompt-len", type=int, default=8)
p.add_argument("--new-tokens", type=int, default=6)
p.add_argument("--static", action="store_true", help="static KV cache")
args = p.parse_args()

config = json.loads((pathlib.Path(__file__).parents[2] / "models" / "qwen3-tiny.json").read_text())
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(Qwen3Config(**config["config"])).eval()
kw = {"cache_implementation": "static"} if args.static else {}
for batch in args.batch:
    ids = torch.randint(0, 1024, (batch, args.prompt_len))
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                         min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0, **kw)
    print(f"batch {batch}: generated {tuple(out.shape)} in {time.perf_counter() - t0:.3f} s")
    print("first sequence:", out[0, args.prompt_len:].tolist())
