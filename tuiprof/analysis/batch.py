"""Batch configurations: throughput, MBU, MFU and the bottleneck of each, and the batch knee.

Definitions (all per decode step of a configuration, medians over its clean steps):

* tokens/s counts every sequence: ``batch x 1000 / mean ms per step``;
* MBU (model bandwidth utilisation) = bytes the step must move (weights once, each sequence's
  KV cache read and written: :func:`.model.decode_step_bytes`) / step time / peak bandwidth;
* MFU (model FLOP utilisation) = FLOPs of the step (:func:`.model.decode_step_flops`) / step
  time / peak dense bf16 FLOP/s;
* class: ``launch-bound`` when the GPU is busy less than ``LAUNCH_BUSY`` of the step (it waits
  for the host to launch work; the busy share is the traced steps' kernel-busy time over an
  untraced step's wall time where untraced steps were measured, see :mod:`.tracing`), else ``compute-bound`` when MFU >= MBU (equivalently: the step's
  arithmetic intensity is at or past the ridge point, peak FLOP/s / peak bytes/s), else
  ``memory-bound``;
* predicted knee: the batch at which the matmuls' arithmetic intensity reaches the ridge point,
  from their shapes: with ``W = sum in x out`` and ``A = sum (in + out)`` over the linear layers
  and the LM head and ``d`` bytes per element, a step's matmuls do ``2BW`` FLOPs on
  ``d(W + BA)`` bytes, so ``B* = ridge d W / (2W - ridge d A)`` (none when the denominator is not
  positive: the intensity never reaches the ridge);
* measured knee: the first batch past which doubling the batch adds less than ``KNEE_GAIN``
  tokens/s (gains between measured batches are scaled to one doubling).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .gpus import GpuSpec, gpu_spec
from .model import ModelConfig, decode_step_bytes, decode_step_flops, linear_layers, model_config
from .tokens import mode_summaries, steady_tokens
from .tracing import busy_basis_label

__all__ = ["ConfigSummary", "config_summaries", "summarize_config", "classify_step",
           "predicted_knee", "measured_knee", "roofline_tokens_per_s", "Knee", "LAUNCH_BUSY",
           "KNEE_GAIN"]

LAUNCH_BUSY = 0.5      # GPU busy less than half of the step: launch-bound
KNEE_GAIN = 1.25       # a doubling that adds less than 25 % tokens/s: scaling has stopped


@dataclass(frozen=True, slots=True)
class ConfigSummary:
    """One configuration (batch x mode) of a session, decode steps only."""

    batch: Any                    # the configuration key (an int for the engine's batches)
    mode: str
    seqs: float                   # sequences per step (mean)
    steps: int                    # clean decode steps (steps beside a compile left out)
    ms_step: float                # median ms per step
    tok_s: float                  # tokens/s, every sequence counted
    kernels_step: float | None    # kernels per step (traced steps)
    busy: float | None            # GPU busy share of a step (traced steps)
    context: int                  # median context length of the steps
    bytes_step: float | None
    flops_step: float | None
    mbu: float | None
    mfu: float | None
    intensity: float | None       # FLOPs / bytes of the step
    ridge: float                  # peak FLOP/s / peak bytes/s of the GPU
    klass: str                    # launch-bound | memory-bound | compute-bound | unknown
    why: str                      # the numbers that decide the class
    compiling_steps: int = 0      # steps decoded beside a compile (timed apart)
    compiling_ms: float | None = None   # their median ms per step
    busy_basis: str = "traced"    # the busy share's denominator: an untraced step's wall time
                                  # ("untraced") or the traced steps' own ("traced")

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


CPU_RUN = "a CPU run: launch-, memory- and compute-bound are classes of a GPU's decode step"


def on_gpu(meta: dict) -> bool:
    """False for a session that ran on the CPU (the GPU roofline does not apply)."""
    return not str(meta.get("device") or "").lower().startswith("cpu")


def classify_step(busy: float | None, mbu: float | None, mfu: float | None,
                  intensity: float | None, ridge: float, gpu: bool = True,
                  basis: str = "traced") -> tuple[str, str]:
    """``(class, the numbers that decide it)``; see the module docstring. ``basis``: the busy
    share's denominator (``untraced``: an untraced step's wall time; ``traced``: the traced
    step's own)."""
    if not gpu:
        return "unknown", CPU_RUN
    if busy is not None and busy < LAUNCH_BUSY:
        return "launch-bound", (f"GPU busy {busy:.0%} {busy_basis_label(basis == 'untraced')} "
                                f"(< {LAUNCH_BUSY:.0%}): it waits for the host to launch "
                                "kernels")
    if mbu is None or mfu is None or intensity is None:
        return "unknown", "no model description: bytes and FLOPs per step unknown"
    busy_note = "" if busy is not None else "; launch-bound not assessed (no kernel data)"
    if mfu >= mbu:
        return "compute-bound", (f"MFU {mfu:.1%} >= MBU {mbu:.1%}: intensity {intensity:.0f} "
                                 f"FLOP/B at or past the ridge {ridge:.0f}{busy_note}")
    return "memory-bound", (f"MBU {mbu:.1%} > MFU {mfu:.1%}: intensity {intensity:.0f} FLOP/B "
                            f"below the ridge {ridge:.0f}{busy_note}")


def summarize_config(batch: Any, mode: str, *, seqs: float, steps: int, ms_median: float,
                     ms_mean: float, context: int, cfg: ModelConfig | None, spec: GpuSpec,
                     kernels_step: float | None = None, busy: float | None = None,
                     compiling_steps: int = 0,
                     compiling_ms: float | None = None, gpu: bool = True,
                     busy_basis: str = "traced") -> ConfigSummary:
    """A :class:`ConfigSummary` from measured step times (ms) and the model description."""
    ridge = spec.bf16_flops / spec.bandwidth_Bps
    bsz = max(1, round(seqs))
    nbytes = flops = mbu = mfu = ai = None
    step_s = ms_median / 1e3 if ms_median else 0.0
    if cfg is not None:
        nbytes = decode_step_bytes(cfg, int(context), bsz)["total"]
        flops = decode_step_flops(cfg, int(context), bsz)["total"]
        ai = flops / nbytes
        if step_s > 0:
            mbu = nbytes / step_s / spec.bandwidth_Bps
            mfu = flops / step_s / spec.bf16_flops
    klass, why = classify_step(busy, mbu, mfu, ai, ridge, gpu, busy_basis)
    return ConfigSummary(batch, mode, seqs, steps, ms_median,
                         seqs * 1000.0 / ms_mean if ms_mean else 0.0, kernels_step, busy,
                         int(context), nbytes, flops, mbu, mfu, ai, ridge, klass, why,
                         compiling_steps, compiling_ms, busy_basis)


def config_summaries(view: Any, cfg: ModelConfig | None = None,
                     spec: GpuSpec | None = None, basis: str = "auto") -> list[ConfigSummary]:
    """Every configuration of the session with decode steps, batches in increasing order
    (``basis``: the busy share's, see :func:`.tokens.mode_summaries`)."""
    cfg = cfg or model_config(view.meta)
    spec = spec or gpu_spec(view.meta)
    prompt = int(view.meta.get("prompt_tokens") or 0)
    out = []
    for key in view.config_keys:
        sub = view.select(key)
        by_mode = mode_summaries(sub, "decode", basis)
        for mode in sorted(by_mode, key=lambda m: (m != "eager", m != "compiled", m)):
            ms = by_mode[mode]
            ts = sub.token_stats.get(("decode", mode), {})
            comp = ts.get("compiling_ms")
            if not ms.tokens and not (comp is not None and comp.count):
                continue
            steady = steady_tokens(sub, "decode", mode) or [
                t for t in sub.tokens if t.done and t.phase == "decode" and t.mode == mode]
            ctx = _median([prompt + max(0, t.step) + 1 for t in steady]) if steady else prompt + 1
            traced = ms.kernels_per_token > 0
            out.append(summarize_config(
                key, mode, seqs=ms.batch, steps=ms.tokens, ms_median=ms.ms_median,
                ms_mean=ms.ms_mean, context=int(ctx), cfg=cfg, spec=spec,
                kernels_step=ms.kernels_per_token if traced else None,
                busy=ms.busy_fraction if traced else None,
                compiling_steps=comp.count if comp is not None else 0,
                compiling_ms=comp.median if comp is not None and comp.count else None,
                gpu=on_gpu(view.meta), busy_basis=ms.busy_basis))
    return out


def roofline_tokens_per_s(cfg: ModelConfig, spec: GpuSpec, batch: int, context: int) -> float:
    """The most tokens/s the roofline allows at ``batch``: ``batch`` / the slower of bytes at
    peak bandwidth and FLOPs at peak FLOP/s."""
    t = max(decode_step_bytes(cfg, context, batch)["total"] / spec.bandwidth_Bps,
            decode_step_flops(cfg, context, batch)["total"] / spec.bf16_flops)
    return batch / t


def predicted_knee(cfg: ModelConfig, spec: GpuSpec) -> float | None:
    """The batch at which the matmuls' arithmetic intensity reaches the ridge point (module
    docstring); None when it never does."""
    lins = linear_layers(cfg)
    w = sum(l.in_features * l.out_features for l in lins)
    a = sum(l.in_features + l.out_features for l in lins)
    d = cfg.dtype_bytes
    ridge = spec.bf16_flops / spec.bandwidth_Bps
    denom = 2 * w - ridge * d * a
    return ridge * d * w / denom if denom > 0 else None


@dataclass(frozen=True, slots=True)
class Knee:
    """Where measured tokens/s stops scaling with the batch, for one mode."""

    mode: str
    batch: int | None             # None: still scaling at the largest batch measured
    gain: float | None            # tokens/s factor per doubling past ``batch``
    largest: int                  # largest batch measured
    gains: list                   # (batch, next batch, factor per doubling)


def measured_knee(summaries: list[ConfigSummary], mode: str) -> Knee | None:
    """The first measured batch past which every doubling adds less than ``KNEE_GAIN`` (the
    gain given is per doubling from there to the largest batch); None with fewer than two
    batch sizes of ``mode``."""
    pts = sorted((s.batch, s.tok_s) for s in summaries
                 if s.mode == mode and isinstance(s.batch, int) and s.tok_s > 0 and s.steps)
    if len(pts) < 2:
        return None
    gains = []
    for (b1, t1), (b2, t2) in zip(pts, pts[1:]):
        doublings = math.log2(b2 / b1)
        gains.append((b1, b2, (t2 / t1) ** (1 / doublings)))
    # Sustained: every doubling from the knee on adds less (one noisy cell that dips, e.g. an
    # eager step slowed by the host, is not a knee when the next doublings scale again).
    for i, (b1, _b2, _g) in enumerate(gains):
        if all(g < KNEE_GAIN for _a, _b, g in gains[i:]):
            per = (pts[-1][1] / pts[i][1]) ** (1 / math.log2(pts[-1][0] / b1))
            return Knee(mode, b1, per, pts[-1][0], gains)
    return Knee(mode, None, None, pts[-1][0], gains)


def _median(xs: list) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
