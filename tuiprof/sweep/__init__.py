"""Workload sweeps: time and profile registry models over sequence lengths, passes and modes,
or decode over batch sizes.

``run_sweep(...) -> SweepResult``; ``run_batch_sweep(...) -> BatchSweep`` (``--batches``); ``add_arguments(parser)`` / ``run(args)`` for the
``tuiprof sweep`` subcommand; ``main(argv)`` standalone. No UI imports here; names load
lazily, so ``from tuiprof.sweep import add_arguments`` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "add_arguments": "cli", "run": "cli", "main": "cli",
    "ProfileSummary": "kernels", "classify": "kernels", "is_gemm": "kernels",
    "Cell": "results", "CellResult": "results", "SweepResult": "results", "Table": "results",
    "MODES": "results", "PASSES": "results",
    "Progress": "runner", "env_fault_hook": "runner", "is_oom": "runner", "run_sweep": "runner",
    "run_batch_sweep": "batch", "BatchSweep": "batch", "BatchResult": "batch", "BatchCell": "batch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
