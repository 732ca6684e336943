"""A user's HF ``generate()`` script: qwen3-0.6b with random weights built from its config on
the GPU, eager or with a static cache (transformers compiles the decode forward and replays
it as CUDA graphs); eager also uses a static cache, with transformers' auto-compile off. Knows
nothing of tuiprof. Prints its own decode timing:

    DECODE_MS_PER_STEP=<median over --repeats windows of (T(generate N) - T(generate 1)) / (N-1)>

Usage: python hf_qwen.py [--mode eager|compiled] [--batch B] [--new-tokens N] [--repeats R]
       [--tiny --device cpu]   (qwen3-tiny on the CPU: the same code path, for a dry run)
"""
import argparse
import json
import pathlib
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, CompileConfig, Qwen3Config

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=("eager", "compiled"), default="eager")
p.add_argument("--batch", type=int, default=1)
p.add_argument("--prompt-len", type=int, default=16)
p.add_argument("--new-tokens", type=int, default=65)
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--device", default="cuda")
p.add_argument("--tiny", action="store_true")
args = p.parse_args()

name = "qwen3-tiny" if args.tiny else "qwen3-0.6b"
spec = json.loads((pathlib.Path(__file__).parents[2] / "models" / f"{name}.json").read_text())
dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
torch.manual_seed(0)
with torch.device(args.device):  # weights made on the device: no host copy
    model = AutoModelForCausalLM.from_config(Qwen3Config(**spec["config"]), dtype=dtype).eval()
ids = torch.randint(0, spec["config"]["vocab_size"], (args.batch, args.prompt_len),
                    device=args.device)
# A static cache in both modes, as tuiprof's own engine has: the eager forward is then the same
# model code as the engine's eager step (a dynamic cache runs other kernels).
kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0,
          cache_implementation="static")
if args.mode == "eager":
    kw["disable_compile"] = True   # generate() would compile a static-cache forward by itself
else:
    if not args.device.startswith("cuda"):  # transformers compiles by itself on a GPU only
        cc = CompileConfig(backend="eager")
        cc._compile_all_devices = True
        kw["compile_config"] = cc


def timed(n):
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


t0 = time.perf_counter()
timed(args.new_tokens)  # warm-up (and, compiled, the compilation and CUDA-graph capture)
print(f"warm-up {time.perf_counter() - t0:.1f} s", flush=True)
per_step = []
for _ in range(args.repeats):
    full, one = timed(args.new_tokens), timed(1)
    per_step.append((full - one) * 1e3 / (args.new_tokens - 1))
print(f"DECODE_MS_PER_STEP={statistics.median(per_step):.4f} windows={per_step}", flush=True)
