"""``tuiprof sweep --serve``: one ``tuiprof serve --headless`` run per request rate (or
concurrency), each in a process of its own, and per cell the throughput, TTFT and ITL p50/p99,
goodput under an SLO, and the highest load that still meets the SLO as a finding.

A cell's numbers come from its snapshot's requests (warm-up requests left out), computed by
:func:`tuiprof.analysis.request_rules.serve_cell`; docs/serving.md defines them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..analysis.request_rules import ServeCell, serve_cell, sweep_finding

CELL_TIMEOUT_S = 1800


@dataclass
class ServeSweep:
    model: str
    kind: str                      # "rate" | "concurrency"
    cells: list = field(default_factory=list)
    slo_ttft_ms: float | None = None
    slo_itl_ms: float | None = None
    attainment: float = 0.9

    @property
    def finding(self):
        return sweep_finding(self.cells, self.slo_ttft_ms, self.slo_itl_ms, self.attainment)

    def table(self) -> str:
        """The cells as a Markdown table."""
        unit = "req/s" if self.kind == "rate" else "in flight"
        head = (f"| {self.kind} ({unit}) | requests | req/s | output tok/s | TTFT p50 ms | "
                f"TTFT p99 ms | ITL p50 ms | ITL p99 ms | e2e p50 ms | goodput req/s | "
                f"within SLO |")
        lines = [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]

        def f(v, d=1):
            return "–" if v is None else f"{v:,.{d}f}"

        for c in self.cells:
            if c.status != "ok":
                lines.append(f"| {c.value:g} | {c.status}: {c.error} |" + " |" * 9)
                continue
            lines.append(f"| {c.value:g} | {c.requests} | {f(c.requests_per_s, 2)} | "
                         f"{f(c.tokens_per_s)} | {f(c.ttft_p50_ms)} | {f(c.ttft_p99_ms)} | "
                         f"{f(c.itl_p50_ms, 2)} | {f(c.itl_p99_ms, 2)} | {f(c.e2e_p50_ms)} | "
                         f"{f(c.goodput_rps, 2)} | "
                         f"{'–' if c.attainment is None else f'{c.attainment:.0%}'} |")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        fnd = self.finding
        return {"model": self.model, "kind": self.kind, "slo_ttft_ms": self.slo_ttft_ms,
                "slo_itl_ms": self.slo_itl_ms, "attainment": self.attainment,
                "cells": [c.to_dict() for c in self.cells],
                "finding": fnd.to_dict() if fnd is not None else None}

    def write(self, out: str | Path) -> dict:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        paths = {"json": d / "serve-sweep.json", "md": d / "serve-sweep.md"}
        paths["json"].write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        fnd = self.finding
        text = self.table() + ("\n\n" + fnd.title + "\n" if fnd is not None else "\n")
        paths["md"].write_text(text)
        return paths


def cell_from_snapshot(path: str | Path, kind: str, value: float, slo_ttft_ms=None,
                       slo_itl_ms=None) -> ServeCell:
    """A cell from one run's snapshot (its warm-up requests left out). A server of several
    processes (vLLM): the process with the most requests joined to its steps (the engine's,
    joined with the API server's), else the one with the most requests."""
    from ..export.snapshot import read_any_snapshot  # noqa: PLC0415
    from ..store.rank_set import RanksView  # noqa: PLC0415

    got = read_any_snapshot(path)
    views = list(got.views) if isinstance(got, RanksView) else [got]
    view = max(views, key=lambda v: (sum(1 for r in v.requests.rows if len(r.steps)),
                                     len(v.requests.rows)))
    rows = [r for r in view.requests.rows
            if not str(r.client_id or r.id).startswith("warmup")]
    return serve_cell(rows, kind, value, slo_ttft_ms, slo_itl_ms)


def run_serve_sweep(model: str, kind: str, values: list, load_args: list[str], out: str | Path,
                    *, slo_ttft_ms: float | None = None, slo_itl_ms: float | None = None,
                    attainment: float = 0.9, progress: Callable[[str], None] | None = None,
                    timeout_s: float = CELL_TIMEOUT_S) -> ServeSweep:
    """One ``tuiprof serve --headless`` process per value of ``kind``; ``load_args``: the
    other options of ``tuiprof serve`` (requests, lengths, device, ...)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sweep = ServeSweep(model, kind, [], slo_ttft_ms, slo_itl_ms, attainment)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for v in values:
        snap = out / f"serve-{kind}-{v:g}.json"
        # A sweep measures latency: the live app's sampling (bursts of traced steps) keeps
        # tracing's own cost out of most steps, where a headless run would trace every step
        # (an eager traced step runs ~1.6x as long on an H100: docs/performance.md).
        sampling = [] if "--sample-every" in load_args else ["--sample-every", "live"]
        cmd = [sys.executable, "-m", "tuiprof", "serve", "--model", model, "--headless",
               "--json", str(snap), f"--{kind}", f"{v:g}", *sampling, *load_args]
        if progress:
            progress(f"{kind} {v:g}: {' '.join(cmd[3:])}")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                  env=env)
            (out / f"serve-{kind}-{v:g}.log").write_text(proc.stdout + proc.stderr)
            if not snap.exists():
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                cell = ServeCell(kind, v, 0, 0.0, 0.0, 0.0, None, None, None, None, None, None,
                                 None, "error", tail[0][:200])
            else:
                cell = cell_from_snapshot(snap, kind, v, slo_ttft_ms, slo_itl_ms)
        except subprocess.TimeoutExpired:
            cell = ServeCell(kind, v, 0, 0.0, 0.0, 0.0, None, None, None, None, None, None,
                             None, "error", f"timed out after {timeout_s:g} s")
        sweep.cells.append(cell)
        if progress and cell.status == "ok":
            progress(f"{kind} {v:g}: {cell.requests_per_s:.2f} req/s, TTFT p50 "
                     f"{cell.ttft_p50_ms:.1f} ms, ITL p50 {cell.itl_p50_ms or 0:.2f} ms")
    return sweep
