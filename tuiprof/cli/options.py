"""The command line's options turned into plain data that the layers below take: a program's
step-source options, its sampling, what each of its followed processes collects."""
from __future__ import annotations

import argparse


def source_options(args: argparse.Namespace) -> dict:
    """The step sources' options as given (``ProgramSession(options=...)``)."""
    from ..program.registry import OPTIONS  # noqa: PLC0415 - the step sources' modules

    return {o.dest: getattr(args, o.dest) for o in OPTIONS}


def sample_every(args: argparse.Namespace, headless: bool) -> int | str:
    """Which steps a program's processes trace: ``--sample-every``, where "auto" samples bursts
    as the live app does, headless too (every step traced made an eager generate() program
    2.2 times slower on the H200), except with --step-range: NVTX steps are known only after
    the fact, so a burst cannot be switched on at a step's start."""
    se = args.sample_every
    if se == "auto" and getattr(args, "step_range", None):
        return 1
    return se


def child_options(args: argparse.Namespace) -> dict:
    """What each followed process of a program collects: the session process's options."""
    # the main process's policy, resolved: every process samples as the main one does
    return {"cupti": not args.no_cupti, "nvml": not args.no_nvml, "nvml_hz": args.nvml_hz,
            "sample_every": sample_every(args, bool(getattr(args, "headless", False))),
            "alloc_every": args.alloc_every,
            "detach_between_bursts": not args.cupti_attached, "ring_tokens": args.ring_tokens,
            "sources": {k: v for k, v in source_options(args).items()
                        if isinstance(v, (str, int, float, list, type(None)))}}


__all__ = ["source_options", "sample_every", "child_options"]
