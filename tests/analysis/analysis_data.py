"""Helpers for the analysis tests: fixture paths and independent reads of the raw JSON."""
from __future__ import annotations

import bisect
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(os.environ.get("TUIPROF_FIXTURES", REPO.parent / "shared" / "fixtures"))
EAGER = FIXTURES / "h100_qwen3-0.6b_eager_decode64.json.gz"
COMPILED = FIXTURES / "h100_qwen3-0.6b_compiled_decode64.json.gz"
NCU = FIXTURES / "h100_qwen3-0.6b_eager_decode_nvjet.ncu.csv"


def decode_windows(d: dict) -> list[tuple[int, int, int]]:
    """(step, start, end) of each decode step, from the marks."""
    starts = {s: ts for e, s, ts in d["marks"] if e == "step_start"}
    ends = {s: ts for e, s, ts in d["marks"] if e == "step_end"}
    return sorted((s, starts[s], ends[s]) for s in starts if s in ends)


def decode_records(d: dict, kinds: str = "K") -> list[list]:
    """Records of ``kinds`` whose start lies in a decode step window (step end inclusive)."""
    wins = decode_windows(d)
    starts = [w[1] for w in wins]
    start_idx = {"K": 2, "C": 3, "S": 2}
    out = []
    for r in d["records"]:
        if r[0] not in kinds:
            continue
        ts = r[start_idx[r[0]]]
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts <= wins[i][2]:
            out.append(r)
    return out


def duration(r: list) -> int:
    return r[3] - r[2] if r[0] in "KS" else r[4] - r[3]
