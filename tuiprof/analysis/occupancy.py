"""Launch configuration: blocks per SM from the occupancy limits, waves, small grids.

``blocks_per_sm = min(threads limit, registers limit, shared-memory limit, block limit)``;
``waves = blocks / (sm_count * blocks_per_sm)``. A launch with ``waves < 1`` leaves SMs idle.
The formulas are spelled out in ``docs/analysis.md``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .gpus import HOPPER, SmLimits, gpu_spec
from .kernels import GEMM, is_gemm_aux, kernel_info

__all__ = ["Occupancy", "LaunchInfo", "occupancy", "launch_info", "small_grid_launches",
           "SmallGrid"]


@dataclass(frozen=True, slots=True)
class Occupancy:
    blocks_per_sm: int
    limiter: str             # "threads" | "registers" | "shared memory" | "blocks" | "too big"
    warps_per_sm: int
    occupancy: float         # resident warps / max warps per SM


@dataclass(frozen=True, slots=True)
class LaunchInfo:
    blocks: int
    threads_per_block: int
    blocks_per_sm: int
    limiter: str
    sm_count: int
    waves: float             # blocks / (sm_count * blocks_per_sm)
    sms_used: int            # min(blocks, sm_count)
    occupancy: float

    @property
    def under_one_wave(self) -> bool:
        return self.waves < 1.0


def occupancy(threads_per_block: int, regs_per_thread: int, smem_per_block: int,
              limits: SmLimits = HOPPER) -> Occupancy:
    """Resident blocks per SM for one launch configuration (CUDA occupancy-calculator rules)."""
    L = limits
    warps = max(1, math.ceil(max(1, threads_per_block) / L.warp_size))
    max_warps = L.max_threads_per_sm // L.warp_size
    if threads_per_block > 1024 or smem_per_block > L.max_smem_per_block:
        return Occupancy(0, "too big", 0, 0.0)
    cands = {"blocks": L.max_blocks_per_sm, "threads": max_warps // warps}
    if regs_per_thread > 0:
        per_warp = math.ceil(regs_per_thread * L.warp_size / L.reg_alloc_unit) * L.reg_alloc_unit
        cands["registers"] = (L.regs_per_sm // per_warp) // warps
    if smem_per_block > 0:
        smem = math.ceil((smem_per_block + L.reserved_smem_per_block) / L.smem_alloc_unit) \
            * L.smem_alloc_unit
        cands["shared memory"] = L.smem_per_sm // smem
    limiter = min(cands, key=lambda k: (cands[k], k != "blocks"))
    bps = cands[limiter]
    return Occupancy(bps, limiter, bps * warps, bps * warps / max_warps if max_warps else 0.0)


def launch_info(grid: tuple, block: tuple, regs: int, smem: int, sm_count: int,
                limits: SmLimits = HOPPER) -> LaunchInfo:
    """Blocks, blocks per SM and waves of one launch."""
    blocks = max(1, int(grid[0]) * int(grid[1]) * int(grid[2]))
    tpb = max(1, int(block[0]) * int(block[1]) * int(block[2]))
    occ = occupancy(tpb, regs, smem, limits)
    bps = max(1, occ.blocks_per_sm)
    sm = max(1, sm_count)
    return LaunchInfo(blocks, tpb, occ.blocks_per_sm, occ.limiter, sm, blocks / (sm * bps),
                      min(blocks, sm), occ.occupancy)


@dataclass(frozen=True, slots=True)
class SmallGrid:
    """One (kernel, launch configuration) that fills less than one wave."""

    name: str
    short: str
    category: str
    grid: tuple
    block: tuple
    launch: LaunchInfo
    launches: int
    est_ns: float            # launches x the kernel's mean duration (per-config time unknown)


def small_grid_launches(view, phase: str = "decode", mode: str | None = None,
                        categories: tuple = (GEMM,), meta: dict | None = None) -> list[SmallGrid]:
    """Launch configurations of ``categories`` kernels with fewer blocks than one wave,
    from the session aggregates (``KernelAggregate.configs``), largest time first. Split-K
    reduce kernels (the tail of a GEMM, not a matmul of their own) are left out."""
    spec = gpu_spec(meta if meta is not None else view.meta)
    out: list[SmallGrid] = []
    for (name, ph, md), agg in view.kernels.items():
        if ph != phase or (mode is not None and md != mode):
            continue
        info = kernel_info(name)
        if info.category not in categories or is_gemm_aux(info):
            continue
        for cfg, n in agg.configs.items():
            li = launch_info(cfg[:3], cfg[3:], agg.registers, agg.shared_mem, spec.sm_count,
                             spec.limits)
            if li.under_one_wave:
                out.append(SmallGrid(name, info.short, info.category, cfg[:3], cfg[3:], li, n,
                                     n * agg.stats.mean))
    out.sort(key=lambda s: -s.est_ns)
    return out
