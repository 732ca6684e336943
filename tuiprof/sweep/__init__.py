"""Workload sweeps: time and profile registry models over sequence lengths, passes and modes.

``run_sweep(...) -> SweepResult``; ``add_arguments(parser)`` / ``run(args)`` for the
``tuiprof sweep`` subcommand; ``main(argv)`` standalone. No UI imports here.
"""

from __future__ import annotations

from tuiprof.sweep.cli import add_arguments, main, run
from tuiprof.sweep.kernels import ProfileSummary, classify, is_gemm
from tuiprof.sweep.results import Cell, CellResult, SweepResult, Table
from tuiprof.sweep.runner import MODES, PASSES, Progress, env_fault_hook, is_oom, run_sweep

__all__ = [
    "MODES", "PASSES", "Cell", "CellResult", "ProfileSummary", "Progress", "SweepResult", "Table",
    "add_arguments", "classify", "env_fault_hook", "is_gemm", "is_oom", "main", "run", "run_sweep",
]
