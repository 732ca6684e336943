"""Continuous batching (transformers' ContinuousBatchingManager): requests of different
lengths, so the number of sequences per step varies. Knows nothing of tuiprof.

Usage: python cb_qwen.py [--requests 8] [--tiny --device cpu]
"""
import argparse
import json
import pathlib

import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

p = argparse.ArgumentParser()
p.add_argument("--requests", type=int, default=8)
p.add_argument("--device", default="cuda")
p.add_argument("--tiny", action="store_true")
args = p.parse_args()

if not hasattr(transformers, "ContinuousBatchingConfig"):
    print(f"NO_CONTINUOUS_BATCHING transformers {transformers.__version__}")
    raise SystemExit(0)
name = "qwen3-tiny" if args.tiny else "qwen3-0.6b"
spec = json.loads((pathlib.Path(__file__).parents[2] / "models" / f"{name}.json").read_text())
dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
torch.manual_seed(0)
with torch.device(args.device):
    model = AutoModelForCausalLM.from_config(Qwen3Config(**spec["config"]), dtype=dtype).eval()
gc = GenerationConfig(max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
cbc = transformers.ContinuousBatchingConfig(num_blocks=64, max_batch_tokens=256)
lengths = [4 + 4 * (i % 4) for i in range(args.requests)]   # 4..16 new tokens: the batch shrinks
with model.continuous_batching_context_manager(generation_config=gc, continuous_batching_config=cbc,
                                               block=True, timeout=30, warmup=False) as manager:
    for i, n in enumerate(lengths):
        manager.add_request(list(range(1 + i, 9 + i)), max_new_tokens=n)
    done = 0
    while done < len(lengths):
        res = manager.get_result(timeout=60)
        if res is None:
            raise SystemExit("continuous batching stalled")
        done += res.is_finished()
print(f"CB_REQUESTS={len(lengths)} CB_TOKENS={sum(lengths)}")
