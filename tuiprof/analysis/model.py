"""Model description for the roofline: config, linear layers in forward order, bytes, FLOPs.

The description comes from ``meta["model_def"]`` (the model registry's JSON); recordings
without one fall back to a built-in config when ``meta["model"]`` names a known model.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["ModelConfig", "Linear", "model_config", "linear_layers", "param_counts",
           "decode_token_bytes", "decode_token_flops", "decode_step_bytes", "decode_step_flops",
           "kv_bytes_per_position", "BUILTIN"]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    dtype_bytes: int = 2          # bf16 weights and KV cache
    qk_norm: bool = False         # Qwen3: RMSNorm on q and k per head
    mlp: str = "swiglu"           # "swiglu" (gate, up, down) or "plain" (fc, proj: nanochat)


@dataclass(frozen=True, slots=True)
class Linear:
    """One matmul with weights: y[m, out] = x[m, in] @ W[in, out]."""

    name: str                     # q, k, v, o, gate, up, down, lm_head
    layer: int                    # -1 for the LM head
    in_features: int
    out_features: int

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        return self.in_features * self.out_features * dtype_bytes

    def bytes(self, m: int = 1, dtype_bytes: int = 2) -> int:
        """Weights read once + activations read (m x in) and written (m x out)."""
        return (self.in_features * self.out_features
                + m * (self.in_features + self.out_features)) * dtype_bytes

    def flops(self, m: int = 1) -> int:
        return 2 * m * self.in_features * self.out_features


BUILTIN: dict[str, ModelConfig] = {
    "qwen3-0.6b": ModelConfig("qwen3-0.6b", 1024, 28, 16, 8, 128, 3072, 151936, True, 2, True),
}


_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "bf16": 2, "fp16": 2, "fp32": 4}


def model_config(meta: dict) -> ModelConfig | None:
    """:func:`_model_config` with the element size of the session's dtype (``meta["dtype"]``)."""
    cfg = _model_config(meta)
    size = _DTYPE_BYTES.get(str(meta.get("dtype") or "").replace("torch.", ""))
    if cfg is not None and size and size != cfg.dtype_bytes:
        cfg = replace(cfg, dtype_bytes=size)
    return cfg


def _model_config(meta: dict) -> ModelConfig | None:
    """Config from ``meta["model_def"]`` (Hugging Face keys, or the nanochat and cs336
    families' own); else the built-in one whose key starts ``meta["model"]`` (e.g.
    ``"qwen3-0.6b (random bf16)"``); else None (MoE and single-layer workloads included)."""
    md = meta.get("model_def")
    if isinstance(md, dict) and isinstance(md.get("config"), dict):
        c = md["config"]
        family = str(md.get("family", "")).lower()
        if family in _OWN_KEYS:
            try:
                return _OWN_KEYS[family](str(md.get("name", meta.get("model", ""))), c)
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                return None
        if family in ("deepseek", "llama_layer"):
            return None  # MoE routing / one layer behind a fixed embedding: not described here
        try:
            h = int(c["hidden_size"])
            nh = int(c["num_attention_heads"])
            return ModelConfig(
                name=str(md.get("name", meta.get("model", ""))), hidden_size=h,
                num_hidden_layers=int(c["num_hidden_layers"]), num_attention_heads=nh,
                num_key_value_heads=int(c.get("num_key_value_heads") or nh),
                head_dim=int(c.get("head_dim") or h // nh),
                intermediate_size=int(c["intermediate_size"]), vocab_size=int(c["vocab_size"]),
                tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
                dtype_bytes=int(c.get("dtype_bytes", 2)),
                qk_norm=str(md.get("family", "")).lower().startswith("qwen3"))
        except (KeyError, TypeError, ValueError):
            return None
    name = str(meta.get("model") or "").lower()
    for key, cfg in BUILTIN.items():
        if name.startswith(key):
            return cfg
    return None


def _nanochat(name: str, c: dict) -> ModelConfig:
    """nanochat GPT: model dim 64 x depth unless given, heads of 128, ReLU² MLP of 4x, untied."""
    layers = int(c["n_layer"])
    d = int(c.get("n_embd") or 64 * layers)
    heads = int(c.get("n_head") or -(-d // int(c.get("head_dim") or 128)))
    return ModelConfig(name, d, layers, heads, int(c.get("n_kv_head") or heads), d // heads,
                       4 * d, int(c.get("vocab_size") or 65536), False, 2, False, "plain")


def _cs336(name: str, c: dict) -> ModelConfig:
    """CS336 Transformer LM: MHA, SwiGLU of ``d_ff``, untied LM head."""
    d, heads = int(c["d_model"]), int(c["num_heads"])
    return ModelConfig(name, d, int(c["num_layers"]), heads, heads, d // heads, int(c["d_ff"]),
                       int(c.get("vocab_size") or 10000), False, 2, False, "swiglu")


_OWN_KEYS = {"nanochat": _nanochat, "cs336": _cs336}


def linear_layers(cfg: ModelConfig, eager_attention: bool = False) -> list[Linear]:
    """The matmuls of one forward pass in launch order: per layer q, k, v, o, gate, up, down,
    then the LM head. ``eager_attention`` adds the two attention batched matmuls (q·kᵀ and
    p·v, weights-free) after v, as HF's eager attention path launches them."""
    h, hd = cfg.hidden_size, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    out: list[Linear] = []
    for i in range(cfg.num_hidden_layers):
        out += [Linear("q", i, h, q_out), Linear("k", i, h, kv_out), Linear("v", i, h, kv_out)]
        if eager_attention:
            out += [Linear("attn_qk", i, 0, 0), Linear("attn_pv", i, 0, 0)]
        out.append(Linear("o", i, q_out, h))
        if cfg.mlp == "plain":
            out += [Linear("fc", i, h, cfg.intermediate_size),
                    Linear("proj", i, cfg.intermediate_size, h)]
        else:
            out += [Linear("gate", i, h, cfg.intermediate_size),
                    Linear("up", i, h, cfg.intermediate_size),
                    Linear("down", i, cfg.intermediate_size, h)]
    out.append(Linear("lm_head", -1, h, cfg.vocab_size))
    return out


def param_counts(cfg: ModelConfig) -> dict:
    """Parameter counts: embedding, per-layer linears and norms, LM head (0 when tied)."""
    lin = sum(l.in_features * l.out_features for l in linear_layers(cfg)[:-1])
    gains = 0 if cfg.mlp == "plain" else 1   # nanochat's norms have no parameters
    norms = gains * (cfg.num_hidden_layers * (2 * cfg.hidden_size
                                              + (2 * cfg.head_dim if cfg.qk_norm else 0))
                     + cfg.hidden_size)
    emb = cfg.vocab_size * cfg.hidden_size
    head = 0 if cfg.tie_word_embeddings else emb
    return {"embedding": emb, "layers_linear": lin, "norms": norms, "lm_head": head,
            "total": emb + lin + norms + head}


def kv_bytes_per_position(cfg: ModelConfig) -> int:
    """K and V of one position, all layers."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * cfg.dtype_bytes


def decode_step_bytes(cfg: ModelConfig, context: int, batch: int = 1) -> dict:
    """Bytes one decode step over ``batch`` sequences must move: every weight once whatever
    the batch (the LM head reads the embedding matrix again when tied; the embedding lookup
    reads one row per sequence), each sequence's KV cache for ``context`` positions, and the
    new K/V written. Activations are left out (small beside these at decode)."""
    d = cfg.dtype_bytes
    pc = param_counts(cfg)
    head = cfg.vocab_size * cfg.hidden_size * d
    weights = (pc["layers_linear"] + pc["norms"]) * d + head + batch * cfg.hidden_size * d
    kv_read = batch * kv_bytes_per_position(cfg) * context
    kv_write = batch * kv_bytes_per_position(cfg)
    return {"weights": weights, "kv_read": kv_read, "kv_write": kv_write,
            "total": weights + kv_read + kv_write}


def decode_step_flops(cfg: ModelConfig, context: int, batch: int = 1) -> dict:
    """FLOPs of one decode step over ``batch`` sequences: 2 x matmul parameters (linears + LM
    head) plus attention (q·kᵀ and p·v: 4 x heads x head_dim x context per layer), per
    sequence."""
    mm = batch * sum(l.flops() for l in linear_layers(cfg))
    attn = batch * 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * context
    return {"matmul": mm, "attention": attn, "total": mm + attn}


def decode_token_bytes(cfg: ModelConfig, context: int) -> dict:
    """:func:`decode_step_bytes` at batch 1."""
    return decode_step_bytes(cfg, context, 1)


def decode_token_flops(cfg: ModelConfig, context: int) -> dict:
    """:func:`decode_step_flops` at batch 1."""
    return decode_step_flops(cfg, context, 1)
