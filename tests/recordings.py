"""The H100 recordings the tests replay (tests/data/README.md), and what they hold, computed
straight from the files: plain JSON reads that share no code with tuiprof's store or analysis,
so a test can check tuiprof's figures against them."""
from __future__ import annotations

import bisect
import gzip
import json
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"
EAGER = DATA / "qwen3-0.6b_eager_decode64.json.gz"
COMPILED = DATA / "qwen3-0.6b_compiled_decode64.json.gz"
NCU_CSV = DATA / "h100_qwen3-0.6b_eager_decode_nvjet.ncu.csv"
PATHS = {"eager": EAGER, "compiled": COMPILED}
# Where a record's timestamp is (the token it belongs to is the one whose window holds it).
TS_INDEX = {"K": 2, "C": 3, "S": 2, "A": 4, "R": 2, "G": 1}


def need(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"{path} missing: record it with tests/data/record.sh (tests/data/README.md)")
    return path


@lru_cache(maxsize=None)
def raw(path: Path) -> dict:
    """A recording as plain JSON."""
    with gzip.open(need(path)) as fh:
        return json.load(fh)


def windows(d: dict) -> list[tuple[int, int, int]]:
    """(start, end, step) of every prefill (step -1) and decode window, from the marks."""
    out, open_ = [], {}
    for ev, step, ts in d["marks"]:
        if ev.endswith("_start"):
            open_[step] = ts
        else:
            out.append((open_.pop(step), ts, step))
    return sorted(out)


def decode_windows(d: dict) -> list[tuple[int, int, int]]:
    """(step, start, end) of each decode step, from the marks."""
    return sorted((step, s, e) for s, e, step in windows(d) if step >= 0)


def decode_records(d: dict, kinds: str = "K") -> list[list]:
    """Records of ``kinds`` whose timestamp lies in a decode step window (its end inclusive)."""
    wins = decode_windows(d)
    starts = [w[1] for w in wins]
    out = []
    for r in d["records"]:
        if r[0] not in kinds:
            continue
        ts = r[TS_INDEX[r[0]]]
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts <= wins[i][2]:
            out.append(r)
    return out


def duration(r: list) -> int:
    return r[3] - r[2] if r[0] in "KS" else r[4] - r[3]


def records_in(d: dict, start: int, end: int, kinds: str = "K") -> list[list]:
    return [r for r in d["records"] if r[0] in kinds and start <= r[TS_INDEX[r[0]]] <= end]


@dataclass(frozen=True)
class Facts:
    """What a recording holds, counted from its JSON."""

    decode_steps: int
    tokens: int                      # prefill + decode steps
    kernels_per_step: tuple          # kernel records of each decode step, in order
    prefill_kernels: int
    step_ms_median: float            # step_start → step_end
    kernel_ms_median: float          # the sum of a step's kernel durations
    kernels: int                     # every kernel record

    @property
    def kernels_per_step_median(self) -> float:
        return statistics.median(self.kernels_per_step)

    @property
    def steady(self) -> bool:
        """Every decode step launched the same kernels."""
        return len(set(self.kernels_per_step)) == 1


@lru_cache(maxsize=None)
def facts(path: Path) -> Facts:
    d = raw(path)
    wins = windows(d)
    per_step, kernel_ms, step_ms, prefill = [], [], [], 0
    for s, e, step in wins:
        ks = records_in(d, s, e)
        if step < 0:
            prefill = len(ks)
            continue
        per_step.append(len(ks))
        kernel_ms.append(sum(duration(r) for r in ks) / 1e6)
        step_ms.append((e - s) / 1e6)
    return Facts(decode_steps=len(per_step), tokens=len(wins), kernels_per_step=tuple(per_step),
                 prefill_kernels=prefill, step_ms_median=statistics.median(step_ms),
                 kernel_ms_median=statistics.median(kernel_ms),
                 kernels=sum(1 for r in d["records"] if r[0] == "K"))


def launches(d: dict, name: str) -> int:
    """Decode-step launches of the kernel whose raw name is ``name``."""
    return sum(1 for r in decode_records(d) if r[1] == name)
