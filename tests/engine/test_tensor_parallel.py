"""Tensor parallelism: shards, head splits, and greedy outputs of real torch.distributed ranks
(gloo on the CPU, float32) equal to TP=1's on the same seeded weights.

Here tuiprof's own decoder with 3 heads, so that 2 ranks split them unevenly (2 and 1, as
nanochat-d34's 17 heads split 9/8); transformers' Qwen3 at TP=2 is compared in
tests/sessions/test_rank_launcher.py, through the whole `--tp` path."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from tuiprof.engine.tensor_parallel import head_split, split_range, split_sizes
from tuiprof.errors import TuiprofError

MODEL = "nanochat-odd"
TOKENS = 10
ODD = {"name": MODEL, "family": "nanochat", "description": "3 heads: an uneven TP=2 split",
       "dtype": "float32", "config": {"n_layer": 2, "n_embd": 48, "n_head": 3, "n_kv_head": 3,
                                      "vocab_size": 256, "sequence_len": 64}}


def test_heads_split_by_kv_group_and_unevenly_when_they_must():
    assert split_sizes(17, 2) == [9, 8] and split_range(17, 2, 1) == (9, 17)
    # Qwen3-0.6B: 16 query heads in 8 KV groups of 2
    assert [head_split(16, 8, 2, r).q for r in (0, 1)] == [(0, 8), (8, 16)]
    assert [head_split(16, 8, 2, r).kv for r in (0, 1)] == [(0, 4), (4, 8)]
    # nanochat-d34 (17 heads, MHA) at TP=2: 9 and 8
    assert [head_split(17, 17, 2, r).n_q for r in (0, 1)] == [9, 8]
    with pytest.raises(TuiprofError, match="--tp 4 needs at least 4 KV heads; qwen3 has 2"):
        head_split(4, 2, 4, 0, what="qwen3")


def _greedy(model: str, tp: int) -> tuple[list, dict]:
    from tuiprof.engine.events import CollectingListener
    from tuiprof.engine.load import load_engine

    engine = load_engine(model, device="cpu", dtype="float32", max_new_tokens=TOKENS,
                         prompt_len=8, tp=tp)
    listener = CollectingListener()
    engine.listener = listener
    engine.run()
    assert engine.error is None, engine.error
    return listener.token_ids, engine.info


def _rank(index: int, world: int, port: int, models: str, queue) -> None:
    import torch.distributed as dist

    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TUIPROF_MODELS_DIR=models)
    ids, info = _greedy(MODEL, world)
    queue.put((index, (ids, info["tp_shard"], info["params"], info["backend"],
                       info["lockstep"]["agreements"])))
    dist.barrier()      # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()
    # Interpreter finalisation with gloo's threads just stopped aborted a rank now and then
    # in CI ("terminate called without an active exception"); the session processes of
    # `--tp` end the same way (os._exit) once everything is handed over.
    os._exit(0)


def _run_ranks(world: int, models: Path) -> dict:
    import torch.multiprocessing as tmp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = tmp.get_context("spawn").SimpleQueue()
    ctx = tmp.start_processes(_rank, args=(world, port, str(models), queue), nprocs=world,
                              join=False, start_method="spawn")
    got = dict(queue.get() for _ in range(world))
    while not ctx.join(60):
        pass
    return got


def test_two_gloo_ranks_with_uneven_heads_decode_the_tokens_of_one_device(tmp_path, monkeypatch):
    (tmp_path / f"{MODEL}.json").write_text(json.dumps(ODD))
    monkeypatch.setenv("TUIPROF_MODELS_DIR", str(tmp_path))
    world, q_heads, mlp = 2, [[0, 2], [2, 3]], [[0, 96], [96, 192]]
    got = _run_ranks(world, tmp_path)
    ref, info = _greedy(MODEL, 1)
    assert len(set(ref)) > 3                          # varied tokens: a real comparison
    for r in range(world):
        ids, shard, params, backend, agreed = got[r]
        assert ids == ref, f"rank {r}"
        assert shard["q_heads"] == q_heads[r] and shard["mlp"] == mlp[r]
        assert backend == "gloo" and agreed >= 2      # lockstep agreements took place
        assert params < info["params"]                # each rank holds a shard


def test_the_engine_thread_makes_the_ranks_gpu_its_current_device(monkeypatch):
    """The current CUDA device is per thread: a rank on cuda:1 whose engine thread did not set
    it would read cuda:0's allocator statistics and capture graphs there. torch.cuda.set_device
    is the test double here (no GPU on this machine); it stops the engine at once."""
    import threading

    import torch

    from tuiprof.engine.load import load_engine

    engine = load_engine("qwen3-tiny", device="cpu", prompt_len=4, max_new_tokens=2)
    engine.cuda, engine.device = True, torch.device("cuda", 1)   # as a rank with LOCAL_RANK=1
    calls = []

    def set_device(device) -> None:
        calls.append((threading.current_thread().name, torch.device(device)))
        raise RuntimeError("stopped by the test")

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    engine.start()
    assert engine.join(30)
    assert calls == [("tuiprof-engine", torch.device("cuda", 1))]
    assert engine.error == "RuntimeError: stopped by the test"
