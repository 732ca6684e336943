"""A tensor-parallel decode of one's own, launched with torchrun (it calls init_process_group
itself): every rank holds a slice of each MLP of a Qwen3 built from a model file of
``models/`` (transformers, random weights, same seed on every rank) and all-reduces the MLP's
output, so each token costs one all-reduce per layer; ``generate()`` runs on every rank in
lockstep (greedy: every rank decodes the same tokens).

Usage: torchrun --standalone --nproc-per-node N tp_job.py [--model qwen3-tiny]
           [--device cpu|cuda] [--new-tokens N] [--requests N] [--prompt-len N] [--compiled]

``--compiled``: a static cache, so that ``generate()`` compiles its decode forward itself
(on a GPU: inductor, CUDA graphs with the all-reduces inside; on a CPU: dynamo's eager backend,
no graphs), as transformers does for a user's program.
"""
import argparse
import json
import os
import pathlib
import time

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, CompileConfig, Qwen3Config

MODELS = pathlib.Path(__file__).resolve().parents[2] / "models"


def shard_mlp(mlp, rank, world):
    """Column-parallel gate/up, row-parallel down, then the all-reduce of the partial sums."""
    inter = mlp.gate_proj.out_features
    assert inter % world == 0, "intermediate size must split evenly"
    part = slice(rank * inter // world, (rank + 1) * inter // world)
    for lin in (mlp.gate_proj, mlp.up_proj):
        lin.weight = torch.nn.Parameter(lin.weight.data[part].clone())
        lin.out_features = inter // world
    mlp.down_proj.weight = torch.nn.Parameter(mlp.down_proj.weight.data[:, part].clone())
    mlp.down_proj.in_features = inter // world
    local = mlp.forward

    def forward(x):
        out = local(x)
        dist.all_reduce(out)
        return out

    mlp.forward = forward


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen3-tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--requests", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--seconds", type=float, default=0.0, help="keep decoding this long")
    p.add_argument("--compiled", action="store_true", help="generate()'s own compiled decode")
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    local = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = json.loads((MODELS / f"{args.model}.json").read_text())["config"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**config)).eval()
    for layer in model.model.layers:
        shard_mlp(layer.mlp, rank, world)
    if cuda:
        model = model.to(f"cuda:{local}", torch.bfloat16)
    dev = model.device
    kw = {}
    if args.compiled:
        kw["cache_implementation"] = "static"
        if not cuda:  # transformers compiles by itself on a GPU only (hf_qwen.py does the same)
            cc = CompileConfig(backend="eager")
            cc._compile_all_devices = True
            kw["compile_config"] = cc
    t_end = time.monotonic() + args.seconds
    i = 0
    more = torch.zeros(1, dtype=torch.int64, device=dev)
    while True:
        # rank 0 decides whether to go on; every rank follows (their collectives must match)
        more.fill_(int(i < args.requests or time.monotonic() < t_end))
        dist.broadcast(more, 0)
        if not more.item():
            break
        ids = torch.arange(1 + i, 1 + i + args.prompt_len, device=dev).unsqueeze(0) % 1000
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 do_sample=False, pad_token_id=0, **kw)
        if rank == 0:
            print(f"rank 0 of {world}: request {i} -> {out[0, args.prompt_len:].tolist()}",
                  flush=True)
        i += 1
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
