"""``tuiprof sweep --tp 1,2``: decode at each tensor-parallel degree, and how it scales.

For each model and TP degree one headless session of ranks (what ``tuiprof --tp N`` runs):
eager decode, then compiled (switched by every rank at the same step) when asked. Per mode it
keeps the ranks' views (the raw records of the last traced steps), the cross-rank summary and
findings; :func:`scaling_rows` puts the degrees side by side (speed-up and efficiency over
TP=1). Each TP>1 snapshot carries its TP=1 reference (``world.tp_reference``), so reopening it
shows the scaling finding. ``bench/verify/verify_tp.py`` drives the same :class:`TPSession`.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..analysis.cross_rank import RanksSummary, find_ranks, ranks_summary, tp_scaling
from ..analysis.tokens import mode_summaries
from ..errors import TuiprofError
from ..export._atomic import atomic_write_text
from ..spec import EngineSpec, ProfilerOptions
from ..sessions.rank_launcher import RankSetControl
from ..store.rank_set import RanksView
from ..text import csv_text


@dataclass
class ModeResult:
    mode: str
    ranks: RanksView           # the views when the mode's tokens were in (last traced steps raw)
    summary: RanksSummary
    findings: list
    extra: dict = field(default_factory=dict)

    @property
    def step_ms(self) -> float:
        """Median over ranks of each rank's median ms per decode step."""
        return statistics.median(r.step_ms for r in self.summary.ranks) if self.summary.ranks else 0.0


@dataclass
class TPRun:
    model: str
    tp: int
    load_s: float = 0.0
    compile_s: float | None = None
    modes: dict = field(default_factory=dict)
    final: RanksView | None = None


class TPSession:
    """One live session of ``tp`` ranks of ``model``, driven without a UI."""

    def __init__(self, model: str, tp: int, *, device: str | None = None,
                 dtype: str | None = None, eager_tokens: int = 256, compiled_tokens: int = 512,
                 cycle_tokens: int = 1024, ring_tokens: int = 1024, raw_tokens: int = 16,
                 timeout: float = 600.0, cupti: bool = True, hook: str | None = None,
                 say: Callable[[str], None] = print) -> None:
        self.model, self.tp, self.say, self.timeout = model, tp, say, timeout
        self.tokens = {"eager": eager_tokens, "compiled": compiled_tokens}
        self.raw_tokens = raw_tokens
        opts = ProfilerOptions(cupti=cupti, nvml=True, engine=EngineSpec.resolve(
            model, device=device, dtype=dtype, loop=True, max_new_tokens=cycle_tokens,
            prompt_len=16, mode="eager"))
        self.ctl = RankSetControl(opts, {"ring_tokens": ring_tokens}, tp, hook=hook)

    def wait(self, pred: Callable[[], bool], what: str) -> None:
        end = time.monotonic() + self.timeout
        while not pred():
            if self.ctl.failure:
                raise TuiprofError(self.ctl.failure)
            bad = [f"rank {r}: {c.status.message}" for r, c in enumerate(self.ctl.ranks)
                   if c.status.state == "error"]
            if bad:
                raise TuiprofError("; ".join(bad))
            if time.monotonic() > end:
                raise TuiprofError(f"{self.model} TP={self.tp}: timed out after "
                                   f"{self.timeout:.0f} s waiting for {what}")
            time.sleep(0.2)

    def decode_tokens(self, mode: str) -> int:
        """Decode tokens of ``mode`` so far, on the rank that has fewest."""
        counts = []
        for c in self.ctl.ranks:
            s = mode_summaries(c.view(raw=False, wait=True), "decode").get(mode)
            counts.append(s.tokens if s else 0)
        return min(counts)

    def run(self, modes: list[str],
            on_mode: Callable[["TPSession", ModeResult], None] | None = None) -> TPRun:
        """Eager, then each further mode; ``on_mode`` runs once a mode's tokens are in."""
        ctl, tag = self.ctl, f"{self.model} TP={self.tp}"
        out = TPRun(self.model, self.tp)
        t = time.monotonic()
        ctl.start()
        try:
            self.wait(lambda: all(c.status.state == "decode" for c in ctl.ranks),
                      "every rank decoding")
            out.load_s = time.monotonic() - t
            self.say(f"{tag}: decoding after {out.load_s:.1f} s")
            for mode in modes:
                if mode != ctl.status.mode:
                    t = time.monotonic()
                    self.say(f"{tag}: {ctl.toggle_mode()}")
                    self.wait(lambda: all(c.status.mode == mode and c.status.state == "decode"
                                          for c in ctl.ranks), f"{mode} decode")
                    out.compile_s = time.monotonic() - t
                    self.say(f"{tag}: {mode} on every rank after {out.compile_s:.1f} s")
                want = self.tokens.get(mode, 256)
                self.wait(lambda: self.decode_tokens(mode) >= want, f"{want} {mode} tokens")
                rv = ctl.views(raw=True, raw_tokens=self.raw_tokens)
                s = ranks_summary(rv, mode)
                res = ModeResult(mode, rv, s, find_ranks(rv, s))
                if on_mode is not None:
                    on_mode(self, res)
                out.modes[mode] = res
                self.say(f"{tag}: {mode} done")
            ctl.stop()
            out.final = ctl.views(raw=True)
        finally:
            ctl.close()
        return out


def reference(runs: list[TPRun], model: str, mode: str) -> dict | None:
    """The TP=1 figures of ``model`` in ``mode`` (a snapshot's ``tp_reference``)."""
    for r in runs:
        if r.model == model and r.tp == 1 and mode in r.modes:
            return {"tp": 1, "mode": mode, "ms_per_token": r.modes[mode].step_ms,
                    "source": "TP=1 session of the same sweep"}
    return None


def scaling_rows(runs: list[TPRun]) -> list[dict]:
    """Per model, mode and TP: ms/step, tokens/s, speed-up and efficiency over TP=1, the NCCL
    share range over ranks, the step-end skew, the late rank, the transfer per step and the
    longest wait per step of any rank (docs/multi-gpu.md defines them)."""
    rows = []
    for r in runs:
        for mode, res in r.modes.items():
            ref = reference(runs, r.model, mode)
            sc = tp_scaling(ref["ms_per_token"], res.step_ms, r.tp) if ref and r.tp > 1 else None
            shares = [k.comm_share for k in res.summary.ranks if k.comm_share is not None]
            rows.append({
                "model": r.model, "mode": mode, "tp": r.tp, "ms_per_step": res.step_ms,
                "tokens_per_s": 1000.0 / res.step_ms if res.step_ms else 0.0,
                "speedup": sc["speedup"] if sc else None,
                "efficiency": sc["efficiency"] if sc else None,
                "comm_share_min": min(shares) if shares else None,
                "comm_share_max": max(shares) if shares else None,
                "skew_median_us": res.summary.skew.end_median_us
                if res.summary.skew is not None and r.tp > 1 else None,
                "late_rank": res.summary.late_rank if r.tp > 1 else None,
                "transfer_ms": res.summary.transfer_ms if r.tp > 1 else None,
                "wait_ms_max": max((k.wait_ms for k in res.summary.ranks
                                    if k.wait_ms is not None), default=None)
                if r.tp > 1 else None,
                "compile_s": r.compile_s if mode == "compiled" else None, "load_s": r.load_s})
    return rows


def write_outputs(runs: list[TPRun], out: Path, min_tp: int = 1) -> list[Path]:
    """``tp_scaling.csv`` and one multi-rank snapshot per session of at least ``min_tp`` ranks
    (each with its TP=1 reference)."""
    from ..export.snapshot import write_snapshot  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    rows = scaling_rows(runs)
    csv_path = out / "tp_scaling.csv"
    keys = list(rows[0]) if rows else ["model"]
    atomic_write_text(csv_path, csv_text(([r.get(k) for k in keys] for r in rows), keys))
    paths.append(csv_path)
    for r in runs:
        if r.final is None or r.tp < min_tp:
            continue
        meta = dict(r.final.meta)
        last = list(r.modes)[-1] if r.modes else None
        ref = reference(runs, r.model, last) if r.tp > 1 and last else None
        if ref:
            meta["tp_reference"] = ref
        paths.append(write_snapshot(RanksView(r.final.views, meta),
                                    out / f"tp{r.tp}-{Path(r.model).name}.json"))
    return paths


def markdown(rows: list[dict]) -> str:
    head = "| model | mode | TP | ms/step | tokens/s | speed-up | efficiency | NCCL share | skew µs |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, fmt: "–" if v is None else format(v, fmt)  # noqa: E731
    for r in rows:
        share = ("–" if r["comm_share_min"] is None else
                 f"{r['comm_share_min']:.0%}–{r['comm_share_max']:.0%}")
        lines.append(f"| {r['model']} | {r['mode']} | {r['tp']} | {r['ms_per_step']:.3f} | "
                     f"{r['tokens_per_s']:.1f} | {f(r['speedup'], '.2f')} | "
                     f"{f(r['efficiency'], '.0%')} | {share} | {f(r['skew_median_us'], '.0f')} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``tuiprof sweep --tp 1,2 --models M``: one session per (model, TP); 1 if one failed."""
    runs, failed = [], []
    # a session starts eager; compiled is switched to (by every rank at the same step)
    modes = ["eager"] + [m for m in args.modes if m != "eager"]
    for model in args.models:
        for tp in args.tp:
            try:
                runs.append(TPSession(model, tp, device=args.device, dtype=args.dtype,
                                      eager_tokens=args.tp_tokens,
                                      compiled_tokens=args.tp_tokens).run(modes))
            except TuiprofError as exc:
                failed.append(f"{model} TP={tp}: {exc}")
                print(f"tuiprof: {model} TP={tp} failed: {exc}")
    paths = write_outputs(runs, Path(args.out))
    print(markdown(scaling_rows(runs)))
    print(f"{len(runs)} sessions, {len(failed)} failed; wrote {', '.join(str(p) for p in paths)}")
    return 1 if failed else 0


__all__ = ["TPSession", "TPRun", "ModeResult", "scaling_rows", "reference", "write_outputs",
           "run"]
