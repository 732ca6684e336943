"""Write a GGUF model from seeded random weights, with a byte-level BPE tokenizer trained here.

No download can reach the GPU machine, so llama.cpp's models are made there: the weights are
random (scaled so that activations stay finite in f16), the architecture is ``qwen3`` with the
shape of Qwen3-0.6B (or a tiny one), and the tokenizer is a GPT-2-style byte-level BPE
(``tokenizer.ggml.model = gpt2``, pre-tokenizer ``qwen2``, vocab and merges) trained offline
with the ``tokenizers`` library on a made-up corpus of the words tuiprof's serving tests use.
Qwen3's vocabulary has 151,936 ids: the trained BPE has a few thousand, and the rest are filler
tokens that no merge produces (so the output head has Qwen3's size: its GEMV is a large part of
a decode step). A random model seldom samples its end token, so a request runs to its
``max_tokens``.

    python3 bench/llamacpp/gguf_model.py OUT.gguf [--shape qwen3-0.6b|tiny] [--seed 0]

Needs numpy, tokenizers and ``gguf`` (the registry's package, or llama.cpp's own ``gguf-py`` on
``PYTHONPATH``). Quantised files come from ``llama-quantize OUT.gguf Q8.gguf Q8_0``.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time

SHAPES = {
    # Qwen3-0.6B's config.json: hidden 1024, 28 layers, 16 heads of 128, 8 KV heads,
    # intermediate 3072, vocab 151936, rope theta 1e6, rms eps 1e-6, tied embeddings
    "qwen3-0.6b": dict(n_embd=1024, n_layer=28, n_head=16, n_head_kv=8, head_dim=128,
                       n_ff=3072, n_vocab=151936, ctx=40960),
    "tiny": dict(n_embd=256, n_layer=4, n_head=4, n_head_kv=2, head_dim=64,
                 n_ff=512, n_vocab=4096, ctx=4096),
}
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
LETTERS = "abcdefghijklmnopqrstuvwxyz"
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def corpus(n_words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 7))) for _ in range(n_words)]
    return [" ".join(words[i:i + 64]) for i in range(0, len(words), 64)]


def train_bpe(size: int, seed: int):
    """(tokens, merges) of a byte-level BPE of at most ``size`` ids, specials first."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=1, show_progress=False)
    tok.train_from_iterator(corpus(200_000, seed), trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def write(path: str, shape: str, seed: int) -> dict:
    import numpy as np
    import gguf

    s = SHAPES[shape]
    t0 = time.monotonic()
    tokens, merges = train_bpe(min(8192, s["n_vocab"]), seed)
    n_trained = len(tokens)
    tokens += [f"zzfill{i}" for i in range(s["n_vocab"] - n_trained)]
    types = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens]

    w = gguf.GGUFWriter(path, "qwen3")
    w.add_name(f"random {shape}")
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    rng = np.random.default_rng(seed)
    E, H, KV, D, F = s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"], s["n_ff"]

    def mat(rows: int, cols: int):
        # std 1/sqrt(cols): each projection keeps its input's scale, so 28 layers stay finite
        a = rng.standard_normal((rows, cols), dtype=np.float32)
        a *= 1.0 / np.sqrt(cols)
        return a.astype(np.float16)

    def ones(n: int):
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", mat(s["n_vocab"], E))  # tied: also the output head
    w.add_tensor("output_norm.weight", ones(E))
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones(E))
        w.add_tensor(b + "attn_q.weight", mat(H * D, E))
        w.add_tensor(b + "attn_k.weight", mat(KV * D, E))
        w.add_tensor(b + "attn_v.weight", mat(KV * D, E))
        w.add_tensor(b + "attn_output.weight", mat(E, H * D))
        w.add_tensor(b + "attn_q_norm.weight", ones(D))
        w.add_tensor(b + "attn_k_norm.weight", ones(D))
        w.add_tensor(b + "ffn_norm.weight", ones(E))
        w.add_tensor(b + "ffn_gate.weight", mat(F, E))
        w.add_tensor(b + "ffn_up.weight", mat(F, E))
        w.add_tensor(b + "ffn_down.weight", mat(E, F))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"path": path, "shape": shape, "n_vocab": s["n_vocab"], "trained_tokens": n_trained,
            "merges": len(merges), "seconds": round(time.monotonic() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(json.dumps(write(a.out, a.shape, a.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
