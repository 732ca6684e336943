"""Roofline: model level (bytes and FLOPs one decode token needs vs its time) and kernel level
(GEMM launches matched to the model's matmuls by launch order).

Kernel classes (``GemmLaunch.klass``), with ``ridge = peak FLOP/s / peak bytes/s``,
``roof = min(peak FLOP/s, intensity x peak bytes/s)`` and ``roof_fraction = achieved / roof``:

* ``under-utilised``: ``roof_fraction < 0.5`` -- neither roof within reach (latency, grid or
  launch bound);
* ``memory-bound``: otherwise, intensity < ridge;
* ``compute-bound``: otherwise, intensity >= ridge.

``regime`` says where the intensity lies: ``memory`` (< ridge/2), ``balanced`` (within a factor
2 of the ridge) or ``compute`` (> 2 x ridge).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..store.records import K_BLOCK, K_END, K_GRID, K_NAME, K_REGS, K_SMEM, K_START, KERNEL, KIND
from .gpus import GpuSpec, gpu_spec
from .kernels import ATTENTION, GEMM, REDUCTION, KernelInfo, is_gemm_aux, kernel_info
from .occupancy import launch_info
from .model import (Linear, ModelConfig, decode_step_bytes, decode_step_flops, linear_layers,
                    model_config)
from .tokens import steady_tokens, token_timing

__all__ = ["ModelRoofline", "model_roofline", "GemmLaunch", "GemmMatch", "match_gemms",
           "classify", "UNDER_UTILISED_FRACTION"]

UNDER_UTILISED_FRACTION = 0.5


@dataclass(frozen=True, slots=True)
class ModelRoofline:
    """One decode step against the GPU's peaks (medians over steady steps; ``batch`` sequences
    per step: bytes and FLOPs are the whole step's)."""

    model: str
    gpu: str
    peaks_source: str             # "datasheet" | "measured" | "assumed ..."
    bandwidth_Bps: float
    flops_peak: float
    context: int                  # median context length (prompt + generated)
    bytes: dict                   # weights, kv_read, kv_write, total
    flops: dict                   # matmul, attention, total
    floor_bw_ms: float            # bytes / peak bandwidth
    floor_compute_ms: float       # FLOPs / peak FLOP/s
    floor_ms: float               # max of the two
    measured_ms: float            # median wall time per token
    busy_ms: float                # median GPU busy time per token
    over_floor: float             # measured / floor
    busy_over_floor: float        # busy / floor
    achieved_Bps: float           # bytes / measured
    achieved_frac: float          # of peak bandwidth
    busy_achieved_Bps: float      # bytes / busy (bandwidth while the GPU works)
    busy_achieved_frac: float
    intensity: float              # FLOPs / bytes
    batch: int = 1                # sequences per step


def model_roofline(view, mode: str | None = None, phase: str = "decode",
                   cfg: ModelConfig | None = None, spec: GpuSpec | None = None) -> ModelRoofline | None:
    """Model-level roofline of ``mode``'s decode tokens; None without a model config or tokens."""
    cfg = cfg or model_config(view.meta)
    if cfg is None or phase != "decode":
        return None
    toks = steady_tokens(view, phase, mode) or [t for t in view.tokens if t.done and
                                                t.phase == phase and (mode is None or t.mode == mode)]
    if not toks:
        return None
    spec = spec or gpu_spec(view.meta)
    prompt = int(view.meta.get("prompt_tokens") or 0)
    ctx = int(np.median([prompt + max(0, t.step) + 1 for t in toks]))
    batch = max(1, round(sum(t.batch for t in toks) / len(toks)))
    b = decode_step_bytes(cfg, ctx, batch)
    f = decode_step_flops(cfg, ctx, batch)
    tt = [token_timing(t) for t in toks]
    wall = float(np.median([x.wall_ms for x in tt]))
    sampled = [x for x, t in zip(tt, toks) if t.sampled and x.kernels]
    busy = float(np.median([x.busy_ms for x in sampled])) if sampled else 0.0
    fbw = b["total"] / spec.bandwidth_Bps * 1e3
    fc = f["total"] / spec.bf16_flops * 1e3
    floor = max(fbw, fc)
    ach = b["total"] / (wall / 1e3) if wall else 0.0
    bach = b["total"] / (busy / 1e3) if busy else 0.0
    return ModelRoofline(cfg.name, spec.name, spec.source, spec.bandwidth_Bps, spec.bf16_flops,
                         ctx, b, f, fbw, fc, floor, wall, busy, wall / floor if floor else 0.0,
                         busy / floor if floor else 0.0, ach, ach / spec.bandwidth_Bps, bach,
                         bach / spec.bandwidth_Bps, f["total"] / b["total"], batch)


def classify(intensity: float, achieved_flops: float, spec: GpuSpec) -> tuple[str, str, float]:
    """``(regime, klass, roof_fraction)`` for one launch; see the module docstring."""
    ridge = spec.bf16_flops / spec.bandwidth_Bps
    roof = min(spec.bf16_flops, intensity * spec.bandwidth_Bps)
    frac = achieved_flops / roof if roof > 0 else 0.0
    regime = "memory" if intensity < ridge / 2 else ("compute" if intensity > 2 * ridge else "balanced")
    if frac < UNDER_UTILISED_FRACTION:
        klass = "under-utilised"
    else:
        klass = "memory-bound" if intensity < ridge else "compute-bound"
    return regime, klass, frac


@dataclass(frozen=True, slots=True)
class GemmLaunch:
    """One GEMM launch with the shape of the model matmul it was matched to."""

    linear: Linear
    name: str
    info: KernelInfo
    start_ns: int
    duration_ns: int              # the main kernel
    aux_ns: int                   # split-K reduce kernels that followed it
    grid: tuple
    blocks: int
    waves: float
    bytes: int
    flops: int
    achieved_Bps: float           # bytes / duration
    bw_frac: float                # of peak bandwidth
    flops_per_s: float
    flops_frac: float
    intensity: float
    regime: str
    klass: str
    roof_fraction: float


@dataclass(frozen=True, slots=True)
class GemmMatch:
    ok: bool
    reason: str
    seq: int | None = None
    expected: int = 0
    observed: int = 0
    launches: list = field(default_factory=list)
    skipped: list = field(default_factory=list)   # (short name, why) of GEMMs left out


def _token_raw(view, phase: str, mode: str | None, seq: int | None):
    rows = {t.seq: t for t in view.tokens}
    for s, recs in reversed(view.raw):
        t = rows.get(s)
        if t is None or not t.done or not t.sampled or t.phase != phase:
            continue
        if (mode is None or t.mode == mode) and (seq is None or s == seq):
            return t, recs
    return None, None


def match_gemms(view, mode: str | None = None, phase: str = "decode", seq: int | None = None,
                cfg: ModelConfig | None = None, spec: GpuSpec | None = None) -> GemmMatch:
    """Attach shapes to the GEMM launches of one token (the latest in ``view.raw`` unless
    ``seq``) by launch order; ``ok`` False with a reason when the counts do not line up.

    GEMM-category kernels are taken in start order; split-K reduce kernels are folded into the
    launch before them; GEMMs whose element type differs from the model's (the fp32 rotary
    ``inv_freq @ positions`` product) are skipped and listed."""
    cfg = cfg or model_config(view.meta)
    if cfg is None:
        return GemmMatch(False, "no model description (meta['model_def']) for this session")
    token, recs = _token_raw(view, phase, mode, seq)
    if token is None:
        return GemmMatch(False, f"no {phase} token with raw records in the window")
    spec = spec or gpu_spec(view.meta)
    kernels = sorted((r for r in recs if r[KIND] == KERNEL), key=lambda r: r[K_START])
    infos = [kernel_info(r[K_NAME]) for r in kernels]
    eager_attn = (not any(i.category == ATTENTION for i in infos)
                  and any(i.category == REDUCTION and "softmax" in i.short.lower() for i in infos))
    expected = linear_layers(cfg, eager_attention=eager_attn)
    model_dtype = {2: ("bf16", "fp16"), 4: ("fp32",), 1: ("fp8",)}.get(cfg.dtype_bytes, ())
    picked: list[list] = []       # [record, info, aux_ns]
    skipped = []
    for r, info in zip(kernels, infos):
        if info.category != GEMM:
            continue
        if is_gemm_aux(info):
            if picked:
                picked[-1][2] += r[K_END] - r[K_START]
            continue
        if info.dtype and info.dtype not in model_dtype:
            skipped.append((info.short, f"{info.dtype} GEMM: not one of the model's {cfg.dtype_bytes * 8}-bit matmuls"))
            continue
        picked.append([r, info, 0])
    if len(picked) != len(expected):
        return GemmMatch(False, f"{len(picked)} GEMM launches in token {token.seq}, the model has "
                         f"{len(expected)} matmuls: shapes not attached", token.seq,
                         len(expected), len(picked), [], skipped)
    m = token.batch if phase == "decode" else \
        token.batch * max(1, int(view.meta.get("prompt_tokens") or 1))
    ctx = int(view.meta.get("prompt_tokens") or 0) + max(0, token.step) + 1
    d = cfg.dtype_bytes
    out = []
    for (r, info, aux), lin in zip(picked, expected):
        if lin.name.startswith("attn_"):
            kvh, h, hd = cfg.num_key_value_heads, cfg.num_attention_heads, cfg.head_dim
            seqs = token.batch  # each sequence reads its own K/V; m queries over them all
            nbytes = (seqs * kvh * hd * ctx + h * (hd + ctx) * m) * d
            flops = 2 * h * hd * ctx * m
        else:
            nbytes, flops = lin.bytes(m, d), lin.flops(m)
        dur = max(1, r[K_END] - r[K_START])
        li = launch_info(tuple(r[K_GRID]), tuple(r[K_BLOCK]), r[K_REGS], r[K_SMEM], spec.sm_count,
                         spec.limits)
        bps = nbytes / (dur / 1e9)
        fps = flops / (dur / 1e9)
        ai = flops / nbytes if nbytes else 0.0
        regime, klass, frac = classify(ai, fps, spec)
        out.append(GemmLaunch(lin, r[K_NAME], info, r[K_START], dur, aux, tuple(r[K_GRID]),
                              li.blocks, li.waves,
                              nbytes, flops, bps, bps / spec.bandwidth_Bps, fps,
                              fps / spec.bf16_flops, ai, regime, klass, frac))
    return GemmMatch(True, "", token.seq, len(expected), len(picked), out, skipped)
