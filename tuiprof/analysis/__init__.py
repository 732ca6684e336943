"""Analysis: pure functions over a :class:`tuiprof.store.StoreView` and plain data.

No UI, no torch: what the UI and the exports call to name kernels, split time, model launches
and the roofline, and rank findings. Rules and formulas: ``docs/analysis.md``.
"""
from .batch import (ConfigSummary, Knee, config_summaries, measured_knee, predicted_knee)
from .breakdown import (KernelRow, LaunchBound, Share, attention_split, category_shares,
                        gpu_time_ns, launch_bound, library_shares, phase_split, shares,
                        top_kernels)
from .demangle import demangle
from .findings import Finding, find
from .gpus import GPUS, GpuSpec, SmLimits, gpu_spec
from .kernels import CATEGORIES, LIBRARIES, KernelInfo, kernel_info
from .occupancy import LaunchInfo, Occupancy, SmallGrid, launch_info, occupancy, small_grid_launches
from .model import ModelConfig, model_config
from .ncu import parse_ncu_csv, read_ncu_csv
from .roofline import GemmLaunch, GemmMatch, ModelRoofline, match_gemms, model_roofline
from .tokens import ModeSummary, TokenTiming, mode_summaries, token_timing

__all__ = [
    "demangle", "KernelInfo", "kernel_info", "CATEGORIES", "LIBRARIES",
    "Share", "shares", "category_shares", "library_shares", "gpu_time_ns", "phase_split",
    "LaunchBound", "launch_bound", "KernelRow", "top_kernels", "attention_split",
    "ModeSummary", "mode_summaries", "TokenTiming", "token_timing",
    "SmLimits", "GpuSpec", "GPUS", "gpu_spec",
    "Occupancy", "LaunchInfo", "SmallGrid", "occupancy", "launch_info", "small_grid_launches",
    "ModelConfig", "model_config", "ModelRoofline", "model_roofline", "GemmLaunch", "GemmMatch",
    "match_gemms", "Finding", "find", "read_ncu_csv", "parse_ncu_csv",
    "ConfigSummary", "Knee", "config_summaries", "measured_knee", "predicted_knee",
]
