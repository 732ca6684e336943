"""The command line's options turned into plain data that the layers below take: a program's
step-source options, its sampling, what each of its followed processes collects."""
from __future__ import annotations

import argparse


def source_options(args: argparse.Namespace) -> dict:
    """The step sources' options as given (``ProgramSession(options=...)``)."""
    from ..program.registry import OPTIONS  # noqa: PLC0415 - the step sources' modules

    return {o.dest: getattr(args, o.dest) for o in OPTIONS}


# A session left on (``--detach``) samples a quarter as often as the live app and reads NVML at
# 2 Hz unless told otherwise: the profiler left on has a budget of 1 % of a server's time, and
# at the live app's rates its bursts (7 attached steps in 256, 5 of them traced at +35 % on an
# H200 server's 115 ms steps) and NVML's 10 Hz (0.6 % of a core, its GIL taken ~90 times a
# second) came to ~2 % of a transformers server's busy time (docs/performance.md).
LEAVE_NVML_HZ = 2.0
LIVE_NVML_HZ = 10.0


def sample_every(args: argparse.Namespace, headless: bool) -> int | str:
    """Which steps a program's processes trace: ``--sample-every``, where "auto" samples bursts
    as the live app does, headless too (every step traced made an eager generate() program
    2.2 times slower on the H200), and a quarter as often in a session left on (``--detach``:
    "leave"); except with --step-range: NVTX steps are known only after the fact, so a burst
    cannot be switched on at a step's start."""
    se = args.sample_every
    if se == "auto" and getattr(args, "step_range", None):
        return 1
    if se == "auto" and getattr(args, "detach", False):
        return "leave"
    return se


def nvml_hz(args: argparse.Namespace) -> float:
    """NVML's rate: ``--nvml-hz``, else 10 Hz, 2 Hz in a session left on (``--detach``)."""
    hz = getattr(args, "nvml_hz", None)
    if hz is not None:
        return float(hz)
    return LEAVE_NVML_HZ if getattr(args, "detach", False) else LIVE_NVML_HZ


def child_options(args: argparse.Namespace) -> dict:
    """What each followed process of a program collects: the session process's options."""
    # the main process's policy, resolved: every process samples as the main one does
    return {"cupti": not args.no_cupti, "nvml": not args.no_nvml, "nvml_hz": nvml_hz(args),
            "sample_every": sample_every(args, bool(getattr(args, "headless", False))),
            "alloc_every": args.alloc_every,
            "detach_between_bursts": not args.cupti_attached, "ring_tokens": args.ring_tokens,
            "sources": {k: v for k, v in source_options(args).items()
                        if isinstance(v, (str, int, float, list, type(None)))}}


__all__ = ["source_options", "sample_every", "nvml_hz", "child_options", "LEAVE_NVML_HZ"]
