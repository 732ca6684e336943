"""Tensor parallelism at TP=8 on the CPU (gloo): what can run without the 8-GPU machine.

For each tiny model with 8 KV heads (written to a temporary models folder): a headless
``tuiprof --tp 8 --device cpu`` run, its snapshot's 8 ranks checked (rank, world, backend,
steps), and the greedy token ids of every rank compared with one process's TP=1 engine on the
same seeded weights. Prints one table.

    python bench/verify/verify_tp8_cpu.py [--tp 8] [--new-tokens 12]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = {
    "qwen3-tp8": {"name": "qwen3-tp8", "family": "qwen3", "description": "8 KV heads: TP=8",
                  "dtype": "float32", "config": {
                      "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                      "vocab_size": 1024, "hidden_size": 128, "intermediate_size": 256,
                      "num_hidden_layers": 2, "num_attention_heads": 16,
                      "num_key_value_heads": 8, "head_dim": 16, "hidden_act": "silu",
                      "max_position_embeddings": 512, "rms_norm_eps": 1e-06,
                      "rope_theta": 1000000.0, "attention_bias": False,
                      "attention_dropout": 0.0, "tie_word_embeddings": True,
                      "use_sliding_window": False, "initializer_range": 0.5}},
    "nanochat-tp8": {"name": "nanochat-tp8", "family": "nanochat",
                     "description": "8 heads: TP=8", "dtype": "float32", "config": {
                         "n_layer": 2, "n_embd": 128, "n_head": 8, "n_kv_head": 8,
                         "vocab_size": 256, "sequence_len": 64}},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=12)
    args = ap.parse_args()
    models_dir = Path(tempfile.mkdtemp(prefix="tuiprof-tp8-models-"))
    for name, spec in MODELS.items():
        (models_dir / f"{name}.json").write_text(json.dumps(spec))
    os.environ["TUIPROF_MODELS_DIR"] = str(models_dir)
    from tuiprof.engine.events import CollectingListener
    from tuiprof.engine.load import load_engine
    from tuiprof.export.snapshot import read_any_snapshot

    rows = []
    for name in MODELS:
        out = models_dir / f"{name}.json.snap"
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "tuiprof", "--model", name, "--tp", str(args.tp),
             "--headless", "--device", "cpu", "--max-new-tokens", str(args.new_tokens),
             "--prompt-len", "8", "--json", str(out)],
            capture_output=True, text=True, timeout=900, env=dict(os.environ))
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            rows.append((name, False, f"FAILED rc={proc.returncode}: "
                                      f"{proc.stderr.strip()[-300:]}"))
            continue
        rv = read_any_snapshot(out)
        ids, ok = [], True
        for r, view in enumerate(rv.views):
            m = view.meta
            ok &= (m["rank"], m["world_size"], m["backend"]) == (r, args.tp, "gloo")
            ids.append([t.token_id for t in view.tokens if t.done])
        engine = load_engine(name, device="cpu", dtype="float32", prompt_len=8,
                             max_new_tokens=args.new_tokens)
        engine.listener = ref = CollectingListener()
        engine.run()
        same = all(i == ref.token_ids for i in ids)
        steps = sorted({len(i) for i in ids})
        shards = [v.meta.get("tp_shard") for v in rv.views]
        rows.append((name, ok and same, f"ranks {rv.world_size}, meta ok {ok}, steps/rank {steps}, "
                           f"tokens equal TP=1 on every rank: {same}, run {wall:.1f} s; "
                           f"rank 0 shard: {json.dumps(shards[0])[:160]}"))
    print(f"TP={args.tp} on the CPU (gloo), {os.cpu_count()} cores, torch via {sys.executable}")
    for name, _, what in rows:
        print(f"  {name:<14} {what}")
    return 0 if all(good for _, good, _ in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
