"""Workload sweeps: time and profile registry models over sequence lengths, passes and modes,
or decode over batch sizes, or a server over request rates (``--serve``).

``run_sweep(...) -> SweepResult``; ``run_batch_sweep(...) -> BatchSweep`` (``--batches``). The
``tuiprof sweep`` command is :mod:`tuiprof.cli.sweep` (``python -m tuiprof sweep`` too). No UI
imports here; names load lazily, so importing the package does not import torch.
"""

from __future__ import annotations

from .._lazy import lazy_face

_EXPORTS = {
    "ProfileSummary": "op_summary", "classify": "op_summary", "is_gemm": "op_summary",
    "Cell": "results", "CellResult": "results", "SweepResult": "results", "Table": "results",
    "MODES": "results", "PASSES": "results",
    "Progress": "runner", "env_fault_hook": "runner", "is_oom": "runner", "run_sweep": "runner",
    "run_batch_sweep": "batch_sweep", "BatchSweep": "batch_sweep", "BatchResult": "batch_sweep",
    "BatchCell": "batch_sweep", "run_serve_sweep": "serve_sweep", "ServeSweep": "serve_sweep",
}

__all__, __getattr__ = lazy_face(__name__, _EXPORTS)
