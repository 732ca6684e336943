"""Known GPUs: datasheet peaks and per-SM limits, matched by device-name substring.

A measured peak (``meta["measured_peaks"]``, from the collector's own copy/matmul probe) is
preferred over the datasheet when present; ``overrides`` replace any field.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["SmLimits", "GpuSpec", "GPUS", "HOPPER", "AMPERE", "ADA", "gpu_spec", "DEFAULT_GPU"]


@dataclass(frozen=True, slots=True)
class SmLimits:
    """Per-SM resource limits used by the occupancy model (:mod:`.launch`)."""

    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    smem_per_sm: int = 228 * 1024
    max_smem_per_block: int = 227 * 1024
    reg_alloc_unit: int = 256          # registers, allocated per warp
    smem_alloc_unit: int = 128         # bytes
    reserved_smem_per_block: int = 1024  # bytes the driver reserves per block (sm80+)
    warp_size: int = 32


HOPPER = SmLimits()
AMPERE = SmLimits(smem_per_sm=164 * 1024, max_smem_per_block=163 * 1024)  # A100 (sm80)
ADA = SmLimits(max_threads_per_sm=1536, max_blocks_per_sm=24, smem_per_sm=100 * 1024,
               max_smem_per_block=99 * 1024)  # sm86/sm89: L4, RTX 4090, A10, RTX 3090


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Peaks of one GPU model. ``source`` says where the peaks come from."""

    name: str
    sm_count: int
    bandwidth_Bps: float          # HBM/GDDR peak, bytes/s
    bf16_flops: float             # dense bf16 tensor-core peak, FLOP/s
    fp32_flops: float = 0.0       # non-tensor fp32 peak, FLOP/s
    limits: SmLimits = HOPPER
    match: tuple = ()
    source: str = "datasheet"


# Most specific first: the first entry whose every substring is in the device name wins.
GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("H100 PCIe", 114, 2.0e12, 756e12, 51e12, HOPPER, ("H100", "PCIE")),
    GpuSpec("H100 NVL", 132, 3.9e12, 835e12, 60e12, HOPPER, ("H100", "NVL")),
    GpuSpec("GH200", 132, 4.0e12, 989e12, 67e12, HOPPER, ("GH200",)),
    GpuSpec("H200", 132, 4.8e12, 989e12, 67e12, HOPPER, ("H200",)),
    GpuSpec("H100 SXM 80GB HBM3", 132, 3.35e12, 989e12, 67e12, HOPPER, ("H100",)),
    GpuSpec("A100 40GB", 108, 1.555e12, 312e12, 19.5e12, AMPERE, ("A100", "40GB")),
    GpuSpec("A100 80GB PCIe", 108, 1.935e12, 312e12, 19.5e12, AMPERE, ("A100", "80GB", "PCIE")),
    GpuSpec("A100 80GB SXM", 108, 2.039e12, 312e12, 19.5e12, AMPERE, ("A100",)),
    GpuSpec("L40S", 142, 864e9, 362e12, 91.6e12, ADA, ("L40S",)),
    GpuSpec("L4", 58, 300e9, 121e12, 30.3e12, ADA, ("L4",)),
    GpuSpec("A10", 72, 600e9, 125e12, 31.2e12, ADA, ("A10",)),
    GpuSpec("RTX 4090", 128, 1.008e12, 165.2e12, 82.6e12, ADA, ("4090",)),
    GpuSpec("RTX 3090", 82, 936e9, 71e12, 35.6e12, ADA, ("3090",)),
)
DEFAULT_GPU = GPUS[4]  # H100 SXM: the GPU of the test suite's recordings


def _lookup(device: str) -> GpuSpec | None:
    dev = device.upper()
    for spec in GPUS:
        if all(m.upper() in dev for m in spec.match):
            # "L4" must not match "L40S": require a word boundary after a short key.
            if spec.name == "L4" and "L40" in dev:
                continue
            return spec
    return None


def gpu_spec(meta: dict | None = None, overrides: dict | None = None) -> GpuSpec:
    """The spec for ``meta["device"]`` (H100 SXM when unknown), with the SM count from
    ``meta["sm_count"]``, measured peaks from ``meta["measured_peaks"]`` and ``overrides``."""
    meta = meta or {}
    device = str(meta.get("device_name") or meta.get("device") or "")
    spec = _lookup(device)
    known = spec is not None
    spec = spec or DEFAULT_GPU
    if not known:
        spec = replace(spec, name=device or spec.name, source="assumed (unknown GPU: H100 SXM peaks)")
    sm = meta.get("sm_count")
    if isinstance(sm, int) and sm > 0 and sm != spec.sm_count:
        spec = replace(spec, sm_count=sm)
    mp = meta.get("measured_peaks") or {}
    bw, fl = mp.get("bandwidth_Bps"), mp.get("bf16_flops")
    if (isinstance(bw, (int, float)) and bw > 0) or (isinstance(fl, (int, float)) and fl > 0):
        spec = replace(spec, bandwidth_Bps=float(bw) if bw and bw > 0 else spec.bandwidth_Bps,
                       bf16_flops=float(fl) if fl and fl > 0 else spec.bf16_flops,
                       source="measured")
    if overrides:
        spec = replace(spec, **overrides)
    return spec
