"""Findings: what limits this run, with the numbers behind it and what to try.

:func:`find` returns findings ranked by estimated impact (ms per decode token); caveats about
the data (dropped records, sampling) carry no impact and come after. Rules and thresholds are
in ``docs/analysis.md``.
"""
from __future__ import annotations

import numpy as np

from .batch import KNEE_GAIN, config_summaries, measured_knee, on_gpu, predicted_knee
from .breakdown import FUSABLE, category_shares, launch_bound
from .finding import SEVERITIES, Finding, severity as _severity
from .gpus import gpu_spec
from .intervals import union_length
from .kernels import GEMM, kernel_info
from .occupancy import launch_info, small_grid_launches
from .period import detect
from .request_rules import REQUEST_RULES
from .model import model_config
from .model_split import COVERAGE_OK, model_split
from .roofline import match_gemms, model_roofline
from ..store.records import (API, GRAPH_KERNEL, K_CORR, K_END, K_GRAPH, K_NAME, K_START, K_STREAM,
                             KERNEL, KIND, R_NAME)
from .tokens import mode_summaries, steady_tokens, token_timing, traced_tokens

__all__ = ["Finding", "find", "SEVERITIES"]

IDLE_FRACTION = 0.3          # GPU idle share of a step that makes a compiled run worth a finding
FUSABLE_SHARE = 0.25         # elementwise + copy/cast share of decode GPU time
COMPILED_SLOWER = 1.05       # compiled median ms/token over eager median
BELOW_ROOF = 0.5             # memory-regime GEMM at < 50% of peak bandwidth
MALLOC_COST_MS = 0.01        # assumed cost of one cudaMalloc when no API timing is recorded
DEFAULT_SKIP = 2             # warm-up decode tokens left out of steady-state numbers
LOOP_SHARE = 0.05            # kernel time launched outside the model forward, share of a step


def _is_graph_run(lb) -> bool:
    return lb is not None and lb.graph_fraction >= 0.5


def find(view) -> list:
    """All findings for ``view``, ranked (see module docstring): the rules of
    :data:`MODE_RULES` for every mode that decoded, then those of :data:`SESSION_RULES`."""
    out: list[Finding] = []
    summaries = mode_summaries(view, "decode")
    for mode in summaries:
        for rule in MODE_RULES:
            out += rule(view, mode)
    for rule in SESSION_RULES:
        out += rule(view, summaries)
    impact = [f for f in out if f.impact_ms_per_token is not None]
    rest = [f for f in out if f.impact_ms_per_token is None]
    impact.sort(key=lambda f: -f.impact_ms_per_token)
    rest.sort(key=lambda f: SEVERITIES.index(f.severity))
    return impact + rest


# ------------------------------------------------------------------------------- rules
def _launch_or_idle(view, mode: str) -> list:
    lb = launch_bound(view, mode)
    if lb is None or lb.kernels_per_token == 0:
        return []
    idle = max(0.0, lb.wall_ms - lb.busy_ms)
    nums = {"mode": mode, "wall_ms": lb.wall_ms, "busy_ms": lb.busy_ms,
            "busy_fraction": lb.busy_fraction, "idle_ms": idle, "head_ms": lb.head_ms,
            "tail_ms": lb.tail_ms, "gaps_ms": lb.gaps_ms, "kernels_per_token": lb.kernels_per_token,
            "us_per_kernel_wall": lb.us_per_kernel_wall, "graph_fraction": lb.graph_fraction,
            "tokens": lb.tokens, "busy_basis": lb.basis}
    of_step = ("an untraced step's wall time" if lb.basis == "untraced"
               else "the traced steps' own wall time")
    if _is_graph_run(lb):
        if 1 - lb.busy_fraction < IDLE_FRACTION:
            return []
        split = _graph_gaps(view, mode)
        nums.update(split)
        outside = split.get("outside_graph_gaps_ms", 0.0)
        in_graph = split.get("in_graph_gaps_ms", lb.gaps_ms)
        host = lb.head_ms + lb.tail_ms + outside
        nums["host_side_idle_ms"] = host
        nums["in_graph_idle_ms"] = in_graph
        ev = (f"GPU busy {lb.busy_ms:.2f} of {lb.wall_ms:.2f} ms per step "
              f"({lb.busy_fraction:.0%}, of {of_step}); idle {idle:.2f} ms. In traced steps, "
              f"host side {host:.2f} ms: "
              f"{lb.head_ms:.2f} ms before the first kernel (input preparation), "
              f"{outside:.2f} ms between the kernels launched outside the CUDA graph and the graph "
              f"(graph launch, input copies, argmax), {lb.tail_ms:.2f} ms after the last kernel "
              f"(sync, the token's copy to the host). Inside the graph: {in_graph:.2f} ms of gaps "
              f"between kernels (span - busy).")
        native = bool(view.meta.get("native"))
        if host >= in_graph and native:
            adv = ("Most idle time is the program's host work around the CUDA graph (sampling "
                   "on the CPU, the next step's inputs, the token's copy and sync), not the GPU: "
                   "sample on the GPU and prepare the next step while the graph runs.")
        elif host >= in_graph:
            adv = ("Most idle time is host work around the CUDA graph, not the GPU. Already "
                   "running CUDA graphs: keep the generated token on the GPU and copy it "
                   "asynchronously (no .item() per step), move argmax/sampling and the input "
                   "updates into the captured graph, and prepare the next step's inputs while the "
                   "graph runs.")
        else:
            adv = ("Most idle time is gaps between kernels inside the CUDA graph: fewer, larger "
                   "kernels (more fusion; fused QKV and gate/up projections) shorten them.")
        return [Finding("gpu-idle-in-step", f"GPU idle {1 - lb.busy_fraction:.0%} of each "
                        f"{mode} decode step", _severity(idle, lb.wall_ms), idle,
                        1 - lb.busy_fraction, nums, ev, adv)]
    if not lb.launch_bound:
        return []
    adv = ("The GPU waits for the host to launch kernels. Try compiled mode "
           "(torch.compile(mode=\"reduce-overhead\"): CUDA graphs replay the whole step with one "
           "launch) or capture the decode step in a CUDA graph yourself; batching more "
           "requests per step spreads the same launch cost over more tokens.")
    if view.meta.get("native"):
        adv = ("The GPU waits for the program to launch kernels: capture the decode step in a "
               "CUDA graph (llama.cpp: leave GGML_CUDA_DISABLE_GRAPHS unset), fuse kernels, or "
               "batch more sequences per step to spread the same launches over more tokens.")
    elif mode == "compiled":
        adv = ("Compiled, but the kernels are not launched from CUDA graphs: use "
               "mode=\"reduce-overhead\" (CUDA graphs) with a static KV cache, and check for "
               "graph breaks and recompilations (TORCH_LOGS=graph_breaks,recompiles).")
    ev = (f"GPU busy {lb.busy_ms:.2f} ms of a {lb.wall_ms:.2f} ms step "
          f"({lb.busy_fraction:.1%} of {of_step}, median of {lb.tokens} steady tokens); "
          f"{lb.kernels_per_token:.0f} kernels per token, {lb.us_per_kernel_wall:.1f} µs of wall "
          f"time per launch against {lb.busy_ms * 1000 / max(1, lb.kernels_per_token):.1f} µs of "
          f"GPU work")
    return [Finding("launch-bound", f"Launch-bound: GPU idle {1 - lb.busy_fraction:.0%} of each "
                    f"{mode} decode token", _severity(idle, lb.wall_ms), idle,
                    1 - lb.busy_fraction, nums, ev, adv)]


def _graph_gaps(view, mode: str) -> dict:
    """Median idle inside the CUDA-graph span vs around kernels outside it (raw window)."""
    rows = {t.seq: t for t in steady_tokens(view, "decode", mode)}
    inside, outside = [], []
    for seq, recs in view.raw:
        t = rows.get(seq)
        if t is None:
            continue
        ks = sorted((r for r in recs if r[KIND] == KERNEL), key=lambda r: r[K_START])
        g = [r for r in ks if r[K_GRAPH]]
        if not g or not ks:
            continue
        g_span = max(r[K_END] for r in g) - g[0][K_START]
        g_busy = union_length((r[K_START], r[K_END]) for r in g)
        span = max(r[K_END] for r in ks) - ks[0][K_START]
        busy = union_length((r[K_START], r[K_END]) for r in ks)
        inside.append(max(0, g_span - g_busy) / 1e6)
        outside.append(max(0, (span - busy) - (g_span - g_busy)) / 1e6)
    if not inside:
        return {}
    return {"in_graph_gaps_ms": float(np.median(inside)),
            "outside_graph_gaps_ms": float(np.median(outside))}


def _tokens_per_mode(view, mode: str) -> int:
    """The divisor of per-token figures taken from kernel aggregates: the traced decode tokens
    (with sampling, a few in every period; every token's wall time is not the divisor)."""
    return traced_tokens(view, "decode", mode)


def _small_grids(view, mode: str) -> list:
    rows = small_grid_launches(view, "decode", mode, (GEMM,))
    ntok = _tokens_per_mode(view, mode)
    if not rows or not ntok:
        return []
    spec = gpu_spec(view.meta)
    gemm_ns = sum(a.stats.total for (n, p, m), a in view.kernels.items()
                  if p == "decode" and m == mode and _is_gemm(n))
    small_ns = sum(r.est_ns for r in rows)
    launches = sum(r.launches for r in rows)
    main = [r for r in rows if r.est_ns >= 0.01 * small_ns] or rows  # range over what matters
    blocks = [r.launch.blocks for r in main]
    waves = [r.launch.waves for r in main]
    match = match_gemms(view, mode=mode)
    if match.ok:
        under = [g for g in match.launches if g.waves < 1]
        impact = sum(g.duration_ns - g.bytes / spec.bandwidth_Bps * 1e9 for g in under) / 1e6
        bw = [g.bw_frac for g in under]
        how = "time minus bytes at peak bandwidth, matched launches of one token"
    else:
        impact = sum(r.est_ns * (1 - min(1.0, r.launch.sms_used / spec.sm_count)) for r in rows) / 1e6 / ntok
        bw = []
        how = "time x idle-SM share (shapes unknown)"
    impact = max(0.0, impact)
    nums = {"mode": mode, "sm_count": spec.sm_count, "blocks_min": min(blocks),
            "blocks_max": max(blocks), "waves_min": min(waves), "waves_max": max(waves),
            "launches_per_token": launches / ntok, "ms_per_token": small_ns / 1e6 / ntok,
            "share_of_gemm_time": small_ns / gemm_ns if gemm_ns else 0.0,
            "blocks_per_sm": rows[0].launch.blocks_per_sm, "impact_basis": how,
            "kernels": sorted({r.short for r in rows})}
    if bw:
        nums["bw_frac_median"] = float(np.median(bw))
    ev = (f"{launches / ntok:.0f} GEMM/GEMV launches per token run {min(blocks)}–{max(blocks)} "
          f"blocks on {spec.sm_count} SMs ({min(waves):.2f}–{max(waves):.2f} waves at "
          f"{rows[0].launch.blocks_per_sm} block(s)/SM): {small_ns / 1e6 / ntok:.2f} ms per token, "
          f"{nums['share_of_gemm_time']:.0%} of GEMM time")
    if bw:
        ev += f"; median {nums['bw_frac_median']:.0%} of peak bandwidth"
    adv = ("Each matrix-vector product uses a fraction of the SMs, so it cannot reach the memory "
           "roof. Batch more sequences per step (more rows per GEMM), fuse the q/k/v and "
           "gate/up projections into one GEMM each (more output tiles, more blocks), or try a "
           "split-K / stream-K GEMV (torch.compile mode=\"max-autotune\", cuBLASLt heuristics).")
    return [Finding("grid-too-small", f"GEMV grids too small: {min(blocks)}–{max(blocks)} blocks "
                    f"on {spec.sm_count} SMs ({mode})", _severity(impact, _median_ms(view, mode)),
                    impact, nums["share_of_gemm_time"], nums, ev, adv)]


def _is_gemm(name: str) -> bool:
    return kernel_info(name).category == GEMM


def _median_ms(view, mode: str) -> float:
    s = mode_summaries(view, "decode").get(mode)
    return s.ms_median if s else 0.0


def _fusable(view, mode: str) -> list:
    sh = category_shares(view, "decode", mode)
    ntok = _tokens_per_mode(view, mode)
    parts = {k: sh[k] for k in FUSABLE if k in sh}
    share = sum(s.share for s in parts.values())
    if share < FUSABLE_SHARE or not ntok:
        return []
    ns = sum(s.ns for s in parts.values())
    launches = sum(s.launches for s in parts.values())
    impact = ns / 1e6 / ntok
    nums = {"mode": mode, "share": share, "ms_per_token": impact,
            "launches_per_token": launches / ntok}
    nums.update({f"{k}_share": s.share for k, s in parts.items()})
    ev = (f"elementwise {parts.get('elementwise').share if 'elementwise' in parts else 0:.0%} and "
          f"copy/cast {parts.get('copy/cast').share if 'copy/cast' in parts else 0:.0%} of decode "
          f"GPU time: {launches / ntok:.0f} launches, {impact:.2f} ms per token")
    adv = ("Small elementwise and cast kernels each read and write the whole tensor; fusing them "
           "into their neighbours removes most of that traffic and the launches. ")
    if view.meta.get("native"):   # a native program has no compiled mode to try
        adv += ("Fuse them into their neighbours in the program's own kernels (ggml fuses "
                "some pairs already, e.g. rms_norm·mul·rope) and keep the activations in one "
                "dtype.")
    else:
        adv += ("Try compiled mode (torch.compile fuses them into Triton kernels); keep the "
                "model in one dtype to avoid casts." if mode != "compiled" else
                "Look for graph breaks that stop Inductor from fusing "
                "(TORCH_LOGS=graph_breaks) and keep the model in one dtype to avoid casts.")
    return [Finding("fusable-kernels", f"Elementwise and cast kernels take {share:.0%} of GPU "
                    f"time ({mode})", _severity(impact, _median_ms(view, mode)), impact, share,
                    nums, ev + " (impact: an upper bound, all of that time)", adv)]


def _below_roof(view, mode: str) -> list:
    m = match_gemms(view, mode=mode)
    spec = gpu_spec(view.meta)
    if m.ok:
        low = [g for g in m.launches if g.regime == "memory" and g.bw_frac < BELOW_ROOF
               and g.waves >= 1]
        if not low:
            return []
        impact = sum(g.duration_ns - g.bytes / spec.bandwidth_Bps * 1e9 for g in low) / 1e6
        nums = {"mode": mode, "launches_per_token": len(low),
                "bw_frac_median": float(np.median([g.bw_frac for g in low])),
                "ms_per_token": sum(g.duration_ns for g in low) / 1e6,
                "bytes_per_token": sum(g.bytes for g in low), "peak_Bps": spec.bandwidth_Bps,
                "peaks_source": spec.source, "matmuls": sorted({g.linear.name for g in low})}
        ev = (f"{len(low)} memory-bound GEMM launches per token that fill the GPU reach a median "
              f"{nums['bw_frac_median']:.0%} of peak bandwidth ({spec.source} peak "
              f"{spec.bandwidth_Bps / 1e12:.2f} TB/s)")
        return [Finding("below-bandwidth-roof", f"Memory-bound GEMMs far below the bandwidth "
                        f"roof ({mode})", _severity(impact, _median_ms(view, mode)), impact,
                        nums["bw_frac_median"], nums, ev,
                        "Check the GEMM's tile choice (cuBLASLt heuristics, max-autotune), the "
                        "weight layout (contiguous, aligned) and whether other work shares the GPU.")]
    return []


def _allocs(view, mode: str) -> list:
    toks = steady_tokens(view, "decode", mode, DEFAULT_SKIP)
    if not toks:
        return []
    mallocs = [t.mallocs for t in toks]
    deltas = []
    prev = None
    for t in toks:
        a = t.alloc or {}
        n = a.get("num_device_alloc")
        if prev is not None and n is not None and prev[0] == t.seq - 1:
            deltas.append(n - prev[1])
        prev = (t.seq, n) if n is not None else None
    per_tok = float(np.mean(mallocs)) if mallocs else 0.0
    per_tok_alloc = float(np.mean(deltas)) if deltas else 0.0
    n = max(per_tok, per_tok_alloc)
    if n <= 0:
        return []
    api = view.api.get("cudaMalloc")
    cost = api.mean / 1e6 if api is not None and api.count else MALLOC_COST_MS
    impact = n * cost
    nums = {"mode": mode, "cupti_mallocs_per_token": per_tok,
            "allocator_device_allocs_per_token": per_tok_alloc, "tokens": len(toks),
            "malloc_bytes_per_token": float(np.mean([t.malloc_bytes for t in toks])),
            "ms_per_malloc": cost,
            "ms_per_malloc_source": "cudaMalloc API timing" if api is not None and api.count else "assumed"}
    ev = (f"{n:.1f} device allocations (cudaMalloc) per steady-state decode token "
          f"(CUPTI: {per_tok:.1f}, caching allocator num_device_alloc delta: {per_tok_alloc:.1f})")
    adv = ("Allocation should stop after warm-up. Keep the caching allocator on (no "
           "PYTORCH_NO_CUDA_CACHING_ALLOCATOR), do not call torch.cuda.empty_cache() in the loop, "
           "use a static KV cache and preallocated buffers, or "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation.")
    return [Finding("device-allocs", f"Device memory allocated in every decode step ({mode})",
                    _severity(impact, _median_ms(view, mode)), impact, None, nums, ev, adv)]


def _loop_label(meta: dict) -> str:
    """Who runs the loop around the model: the program's generate(), its own loop, the engine."""
    if meta.get("source") != "program":
        return "tuiprof's engine"
    return "generate()" if meta.get("step_source") == "transformers" else "the program's loop"


def _loop_kernels(view, summaries=None) -> list:
    """Kernels the decode loop launches outside the model's forward, when they cost."""
    out = []
    for mode, sp in model_split(view, "decode").items():
        if sp.coverage < COVERAGE_OK or sp.loop_share < LOOP_SHARE:
            continue
        who = _loop_label(view.meta)
        names = ", ".join(f"{_short(n)} ×{k:.0f}" for n, k, _ms in sp.top_loop[:4])
        nums = {"mode": mode, "steps": sp.steps, "loop_kernels_per_step": sp.loop_kernels,
                "loop_ms_per_step": sp.loop_ms, "model_kernels_per_step": sp.model_kernels,
                "model_ms_per_step": sp.model_ms, "loop_share": sp.loop_share}
        ev = (f"{sp.loop_kernels:.0f} kernels a decode step ({sp.loop_ms * 1e3:.0f} µs) are "
              f"launched outside the model's forward against {sp.model_kernels:,.0f} "
              f"({sp.model_ms:.2f} ms) inside it, over {sp.steps} traced steps"
              + (f"; most time: {names}" if names else ""))
        adv = ("These are the decoding loop's own work (logits processors, stopping checks, "
               "input and mask bookkeeping), outside any compiled region or CUDA graph. "
               "Leave out logits processors a greedy or sampled decode does not need, or "
               "compile the step with them; tuiprof's own greedy loop launches 3 a step "
               "(the attention mask, argmax, the position).")
        out.append(Finding("loop-kernels", f"{who} launches {sp.loop_share:.0%} of the step's "
                           f"kernel time outside the model ({mode})",
                           _severity(sp.loop_ms, _median_ms(view, mode)), sp.loop_ms,
                           sp.loop_share, nums, ev, adv))
    return out


def _short(name: str, width: int = 40) -> str:
    return kernel_info(name).short[:width]


def _compiled_slower(view, summaries: dict) -> list:
    e, c = summaries.get("eager"), summaries.get("compiled")
    if e is None or c is None or not e.ms_median or c.ms_median <= e.ms_median * COMPILED_SLOWER:
        return []
    diff = c.ms_median - e.ms_median
    nums = {"eager_ms": e.ms_median, "compiled_ms": c.ms_median, "ratio": c.ms_median / e.ms_median,
            "eager_tokens": e.tokens, "compiled_tokens": c.tokens}
    return [Finding("compiled-slower", f"Compiled mode is {c.ms_median / e.ms_median:.2f}x slower "
                    "than eager for this workload", _severity(diff, c.ms_median), diff, None, nums,
                    f"median {c.ms_median:.2f} ms/token compiled vs {e.ms_median:.2f} eager",
                    "Stay in eager for this workload, or look for recompilations and graph "
                    "breaks (TORCH_LOGS=recompiles,graph_breaks), dynamic shapes that defeat "
                    "CUDA graphs, and compile time still counted in the window.")]


RAISE_BATCH_MBU = 0.5        # below half the bandwidth at a batch short of the knee


def _batch(view, summaries=None) -> list:
    """The batch knee (predicted from the matmul shapes, measured from tokens/s over the
    configurations of the session), and whether the batch in use leaves the GPU idle."""
    cfg = model_config(view.meta)
    if cfg is None or not on_gpu(view.meta):   # on a CPU: the gpu-unused finding says it
        return []
    spec = gpu_spec(view.meta)
    ridge = spec.bf16_flops / spec.bandwidth_Bps
    sums = config_summaries(view, cfg, spec)
    knee = predicted_knee(cfg, spec)
    out = []
    where = f"{spec.name} ({spec.source} peaks: {spec.bandwidth_Bps / 1e12:.2f} TB/s, " \
            f"{spec.bf16_flops / 1e12:.0f} TFLOP/s bf16, ridge {ridge:.0f} FLOP/B)"
    knees = {m: measured_knee(sums, m) for m in sorted({s.mode for s in sums})}
    pred = (f"the matmuls' arithmetic intensity reaches the ridge at batch ≈{knee:.0f} "
            f"(predicted from their shapes)" if knee else
            "the matmuls' arithmetic intensity never reaches the ridge (predicted from their shapes)")
    meas = []
    for mode, k in knees.items():
        if k is None:
            continue
        if k.batch is not None:
            meas.append(f"{mode}: tokens/s grows {k.gain - 1:+.0%} per doubling past batch {k.batch}")
        else:
            meas.append(f"{mode}: still scaling at batch {k.largest} "
                        f"({k.gains[-1][2] - 1:+.0%} per doubling)")
    nums = {"predicted_knee": knee, "ridge_flop_per_byte": ridge, "peaks_source": spec.source,
            "gpu": spec.name, "measured": {m: (None if k is None else {
                "knee_batch": k.batch, "gain_per_doubling": k.gain, "largest": k.largest,
                "gains": [list(g) for g in k.gains]}) for m, k in knees.items()}}
    title = f"Batch knee ≈{knee:.0f} (predicted)" if knee else "No batch knee in reach (predicted)"
    found = [(m, k) for m, k in knees.items() if k is not None and k.batch is not None]
    if found:
        title += "; measured: " + ", ".join(f"{m} past batch {k.batch}" for m, k in found)
    out.append(Finding("batch-knee", title, "info", None, None, nums,
                       f"On {where}, {pred}. Measured: " + ("; ".join(meas) if meas else
                       "one batch size so far (press b / B, or tuiprof sweep --batches)") + ".",
                       "Below the knee a decode step is memory-bound: the weights are read once "
                       "per step whatever the batch, so more sequences per step come nearly "
                       "free. Past it the step is compute-bound and tokens/s stops growing."))
    for mode, k in found:
        past = [s for s in sums if s.mode == mode and isinstance(s.batch, int) and s.batch > k.batch]
        klass = past[-1].klass if past else "?"
        out.append(Finding(
            "batch-scaling-stopped", f"Past batch {k.batch} tokens/s grows {k.gain - 1:.0%} per "
            f"doubling ({mode}): {klass}", "low", None, None,
            {"mode": mode, "batch": k.batch, "gain_per_doubling": k.gain, "class": klass,
             "knee_gain": KNEE_GAIN},
            "tokens/s by batch: " + ", ".join(f"{s.batch}: {s.tok_s:,.0f}" for s in sums
                                             if s.mode == mode and isinstance(s.batch, int)),
            "A larger batch now adds latency per step without adding throughput; serve at or "
            "just past this batch, or make the step itself cheaper."))
    cur = [s for s in sums if s.batch == view.batch and s.steps]
    if cur:
        s = max(cur, key=lambda c: c.steps)
        short = isinstance(s.batch, int) and (knee is None or s.batch < knee / 2)
        if s.mbu is not None and s.mbu < RAISE_BATCH_MBU and short and s.klass != "compute-bound":
            adv = ("Decode more sequences per step (--batch N, or b in the app): tokens/s grows "
                   "nearly with the batch until the knee, while the step time grows slowly.")
            if s.klass == "launch-bound":
                adv += " The GPU also waits for launches: compiled mode (c) removes most of that."
            out.append(Finding(
                "raise-batch", f"At batch {s.batch} you use {s.mbu:.0%} of the bandwidth you "
                f"could: raise the batch ({s.mode})", "medium", None, s.mbu,
                {"batch": s.batch, "mode": s.mode, "mbu": s.mbu, "mfu": s.mfu, "tok_s": s.tok_s,
                 "ms_step": s.ms_step, "class": s.klass, "predicted_knee": knee},
                f"{s.tok_s:,.0f} tokens/s at {s.ms_step:.2f} ms/step; MBU {s.mbu:.1%}, MFU "
                f"{s.mfu:.1%}; {s.klass} ({s.why}); {pred}", adv))
    return out


def _gpu_unused(view, summaries=None) -> list:
    meta = view.meta
    dev = str(meta.get("device") or "").lower()
    toks = [t for t in view.tokens if t.done and t.sampled and t.phase == "decode"]
    cupti = view.collectors.get("cupti", {"ok": True})
    med = float(np.median([t.host_ms for t in toks])) if toks else None
    if dev == "cpu":
        return [Finding("gpu-unused", "Model runs on the CPU", "high", med, 1.0,
                        {"device": meta.get("device")}, "meta device is 'cpu'",
                        "Move the model and inputs to the GPU (model.to('cuda')); check that "
                        "torch.cuda.is_available() is True in this environment.")]
    has_gpu = bool(meta.get("sm_count")) or "nvidia" in dev or "cuda" in dev
    if has_gpu and toks and cupti.get("ok", True) and sum(t.kernels for t in toks) == 0:
        return [Finding("gpu-unused", "No GPU kernels while a GPU is present", "high", med, 1.0,
                        {"device": meta.get("device"), "tokens": len(toks)},
                        f"{len(toks)} decode tokens without a single kernel record",
                        "The model is probably on the CPU: move it and its inputs to the GPU.")]
    return []


HOW_TO_MARK = (
    "Mark the steps in one of three ways: (1) call generate() of a transformers model (or its "
    "continuous batching, generate_batch): found automatically; (2) wrap each step of your loop "
    "in `with tuiprof.step(\"decode\", tokens=batch):` (and the prefill in "
    "`tuiprof.mark_prefill(tokens=batch)`; both do nothing without tuiprof); (3) if the "
    "program pushes an NVTX range per step, run with --step-range NAME.")


def _no_steps(view, summaries=None) -> list:
    """A program whose steps tuiprof could not find: what its figures are, how to fix it."""
    meta = view.meta
    if meta.get("source") != "program" or meta.get("step_source") not in ("windows", "none"):
        return []
    if meta.get("steps_elsewhere"):   # another process runs its steps (vLLM's engine core)
        return []
    wins = [t for t in view.tokens if t.done and t.phase == "window"]
    wall = sum(t.end_ns - t.start_ns for t in wins)
    busy = sum(t.busy_ns for t in wins if t.sampled)
    ranges = meta.get("step_range")
    nums = {"windows": len(wins), "window_ms": meta.get("window_ms"),
            "gpu_busy_fraction": busy / wall if wall else None, "step_range": ranges}
    if ranges:
        ev = (f"no NVTX range named {', '.join(map(str, ranges))} reached CUPTI; the program's "
              f"other ranges are not steps")
    else:
        ev = (f"the program neither called transformers' generate() nor tuiprof.step(); its "
              f"{len(wins)} steps are fixed windows of {meta.get('window_ms', 100):g} ms, so "
              f"per-step figures are per window, not per token")
    if wall and busy:
        ev += f"; the GPU was busy {busy / wall:.0%} of those windows"
    loop = _loop_in_windows(view)
    advice = HOW_TO_MARK
    if loop is not None:  # the kernels themselves repeat: say what a step would be
        nums["kernel_loop"] = loop.describe()
        lp = loop.loop
        ev += (f"; its kernels repeat a loop of {lp.period} kernels ({loop.decode} times in the "
               f"last {len(wins)} windows, confidence {loop.confidence:.2f} {loop.label()}, "
               f"starting at {lp.consensus[0][:60]})")
        advice += (" A native program (tuiprof run -- ./binary) has such a loop cut into steps "
                   "automatically (docs/native.md).")
    return [Finding("no-step-boundaries", "No step boundaries found: figures are per "
                    f"{meta.get('window_ms', 100):g} ms window, not per token", "medium", None,
                    None, nums, ev, advice)]


def _loop_in_windows(view):
    """The decode loop in the kernels of the windows still in the raw ring, if one shows with
    enough confidence (:mod:`tuiprof.analysis.period`), else None."""
    ks = sorted((r for _, recs in view.raw for r in recs if r[KIND] == KERNEL),
                key=lambda r: r[K_START])
    if len(ks) < 16:
        return None
    cut = detect([r[K_NAME] for r in ks], [r[K_START] for r in ks], [r[K_END] for r in ks],
                 [r[K_STREAM] for r in ks],
                 [r[K_CORR] if len(r) > K_CORR else i for i, r in enumerate(ks)])
    return cut if cut.usable else None


def _caveats(view, summaries=None) -> list:
    out = []
    c = view.counters
    dropped = c.get("dropped", 0)
    if dropped:
        tot = c.get("records", 0) + dropped
        frac = dropped / tot if tot else 1.0
        out.append(Finding("dropped-records", f"{dropped:,} activity records dropped: numbers "
                           "incomplete", "high" if frac >= 0.01 else "medium", None, frac,
                           {"dropped": dropped, "records": c.get("records", 0), "fraction": frac},
                           f"{frac:.1%} of CUPTI records were lost (buffers full)",
                           "Kernel counts, busy time and shares undercount; use larger CUPTI "
                           "buffers or sample fewer tokens."))
    toks = [t for t in view.tokens if t.done]
    uns = [t for t in toks if not t.sampled]
    if uns:
        out.append(Finding("sampled", f"{len(uns)} of {len(toks)} tokens not profiled (sampling)",
                           "info", None, len(uns) / len(toks),
                           {"unsampled": len(uns), "tokens": len(toks)},
                           "kernel numbers come from the sampled tokens only; wall times cover all",
                           "Per-token kernel figures are estimates from the sampled tokens; "
                           "profile every token for exact totals."))
    cupti = view.collectors.get("cupti")
    if cupti is not None and not cupti.get("ok", True):
        out.append(Finding("no-kernel-data", "No kernel data: CUPTI collector not running",
                           "high", None, None, {"message": cupti.get("message", "")},
                           cupti.get("message", ""),
                           "GPU findings need CUPTI; see the collector message."))
    return out


# The rules, in the order their findings are made (ranking comes after). A rule is a pure
# function returning a list of :class:`Finding`; adding one is a function and a row here
# (docs/extending.md). A mode rule runs once for each mode that decoded: ``rule(view, mode)``;
# a session rule once: ``rule(view, summaries)`` (``summaries``: mode -> ModeSummary of decode).
# Request rules (a server's requests: waiting, TTFT split, ITL spikes, time outside steps,
# KV cache, underfilled batches) live in analysis/request_rules.py and run as session rules.

GRAPH_LAUNCH_APIS = ("cudaGraphLaunch", "cuGraphLaunch")


def _graph_launches_per_step(view, mode: str) -> float | None:
    """Median CUDA-graph launches (``cudaGraphLaunch``/``cuGraphLaunch`` API records) in the
    decode steps still in the raw ring; None without API records there."""
    phase = {t.seq: (t.phase, t.mode) for t in view.tokens}
    counts, any_api = [], False
    for seq, recs in view.raw:
        if phase.get(seq) != ("decode", mode):
            continue
        api = [r for r in recs if r[KIND] == API]
        any_api = any_api or bool(api)
        counts.append(sum(1 for r in api if str(r[R_NAME]).startswith(GRAPH_LAUNCH_APIS)))
    return float(np.median(counts)) if counts and any_api else None


def _dominant(view, mode: str) -> list:
    """A native program's decode step in one line: the kernel that dominates it (by friendly
    name, its share of the decode GPU time, its grid against the SM count) and whether the
    step is launch-bound, with how its kernels were launched (CUDA graphs: launches per step).
    Information, no impact: what a by-hand study of an engine reads first."""
    if not view.meta.get("native"):
        return []
    ntok = _tokens_per_mode(view, mode)
    by: dict = {}
    whole = [0.0, 0]   # graph-level launches (--cuda-graph-trace graph): ns, count
    for (name, ph, md), agg in view.kernels.items():
        if ph != "decode" or md != mode:
            continue
        if name == GRAPH_KERNEL:
            whole[0] += agg.stats.total
            whole[1] += agg.stats.count
            continue
        info = kernel_info(name)
        b = by.setdefault(info.short, {"ns": 0.0, "n": 0, "info": info, "cfg": {}, "graph": 0})
        b["ns"] += agg.stats.total
        b["n"] += agg.stats.count
        b["graph"] += agg.graph_launches
        for cfg, n in agg.configs.items():
            b["cfg"][(cfg, agg.registers, agg.shared_mem)] = b["cfg"].get(
                (cfg, agg.registers, agg.shared_mem), 0) + n
    total = sum(b["ns"] for b in by.values())
    if whole[1] and ntok and (not by or whole[0] > total):
        return [_graph_level(whole, ntok, mode, total)]
    if not by or not ntok or total <= 0:
        return []
    short, top = max(by.items(), key=lambda kv: kv[1]["ns"])
    spec = gpu_spec(view.meta)
    (cfg, regs, smem), _ = max(top["cfg"].items(), key=lambda kv: kv[1]) if top["cfg"] else \
        (((1, 1, 1, 1, 1, 1), 0, 0), 0)
    li = launch_info(cfg[:3], cfg[3:], regs, smem, spec.sm_count, spec.limits)
    cats: dict = {}
    for b in by.values():
        cats[b["info"].category] = cats.get(b["info"].category, 0.0) + b["ns"]
    cat, cat_ns = max(cats.items(), key=lambda kv: kv[1])
    lb = launch_bound(view, mode)
    kernels = sum(b["n"] for b in by.values())
    graph_share = sum(b["graph"] for b in by.values()) / kernels if kernels else 0.0
    per_step = _graph_launches_per_step(view, mode)
    nums = {"mode": mode, "kernel": short, "kernel_share": top["ns"] / total,
            "kernel_launches_per_token": top["n"] / ntok, "kernel_mean_us": top["ns"] / top["n"] / 1e3,
            "grid_blocks": li.blocks, "block_threads": li.threads_per_block,
            "sm_count": spec.sm_count, "waves": li.waves, "blocks_per_sm": li.blocks_per_sm,
            "category": cat, "category_share": cat_ns / total,
            "kernels_per_token": kernels / ntok, "graph_kernel_share": graph_share,
            "graph_launches_per_step": per_step,
            "launch_bound": bool(lb.launch_bound) if lb else None,
            "busy_fraction": lb.busy_fraction if lb else None}
    grid = (f"grid {li.blocks:,} blocks of {li.threads_per_block} threads on {spec.sm_count} SMs "
            f"({li.waves:.2f} waves at {li.blocks_per_sm} blocks/SM)")
    if graph_share >= 0.5:
        how = (f"{graph_share:.0%} of its kernels inside CUDA graphs"
               + (f", {per_step:g} graph launch(es) a step" if per_step is not None else ""))
    else:
        how = "its kernels launched one by one (no CUDA graph)"
    if lb is None:
        verdict = "launch-bound: unknown (no step timing)"
    elif lb.launch_bound:
        verdict = (f"launch-bound: yes, GPU busy {lb.busy_fraction:.0%} of the step, "
                   f"{lb.us_per_kernel_wall:.1f} µs of wall time per kernel")
    else:
        verdict = f"launch-bound: no, GPU busy {lb.busy_fraction:.0%} of the step"
    title = (f"{mode} decode: {short} dominates ({top['ns'] / total:.0%} of GPU time), "
             f"{li.blocks:,} blocks on {spec.sm_count} SMs; {verdict.split(',')[0]}")
    ev = (f"{short}: {top['n'] / ntok:g} launches a token, {top['ns'] / top['n'] / 1e3:.2f} µs "
          f"each, {top['ns'] / total:.1%} of decode GPU time; {grid}. {cat}: "
          f"{cat_ns / total:.0%} of the GPU time. {kernels / ntok:g} kernels a token, {how}; "
          f"{verdict}.")
    adv = ("Launch-bound: fewer launches per token (CUDA graphs, fused kernels) shorten the step "
           "more than faster kernels." if lb is not None and lb.launch_bound else
           "The GPU is kept busy: the dominant kernel's own speed (its bytes against the memory "
           "bandwidth, its grid against the SMs) sets the step.")
    return [Finding("decode-profile", title, "info", None, top["ns"] / total, nums, ev, adv)]


def _graph_level(whole: list, ntok: int, mode: str, other_ns: float) -> Finding:
    """The decode step of a native program traced at graph level: its graph launches hold most
    of its GPU time and their kernels are not seen, so no kernel can be named."""
    ns, n = whole
    share = ns / (ns + other_ns)
    nums = {"mode": mode, "graph_launches_per_token": n / ntok, "graph_launch_mean_us": ns / n / 1e3,
            "graph_share": share, "kernel": None}
    title = (f"{mode} decode: {n / ntok:g} CUDA graph launch(es) a step, {ns / n / 1e3:.1f} µs "
             f"of GPU time each ({share:.0%} of it); its kernels untraced (graph level)")
    ev = (f"Graphs traced at graph level (--cuda-graph-trace graph): one record per launch, "
          f"{ns / n / 1e3:.1f} µs each, {n / ntok:g} a token; no kernel inside them is seen.")
    adv = ("To see which kernel dominates the step, run with --cuda-graph-trace node (every "
           "kernel of every launch, at CUPTI's cost per node: docs/native.md).")
    return Finding("decode-profile", title, "info", None, share, nums, ev, adv)


MODE_RULES = (_launch_or_idle, _small_grids, _fusable, _below_roof, _allocs, _dominant)
SESSION_RULES = (_loop_kernels, _compiled_slower, _batch, _gpu_unused, _no_steps,
                 *REQUEST_RULES, _caveats)
