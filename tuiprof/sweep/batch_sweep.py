"""``tuiprof sweep --batches``: decode throughput of each model at each batch size and mode.

A cell is (model, mode, batch). It runs the live app's own engine
(:class:`tuiprof.engine.generate.Engine`, compiling on its thread first) for a prefill of
``prompt_len`` tokens per sequence, ``warmup`` decode steps and ``iters`` measured ones, then
profiles one more step with ``torch.profiler`` for the kernel time by category. Per cell:
tokens/s (every sequence, from the median step time: a benchmark cell's few host stalls must
not move it), ms per step, MBU, MFU and the bottleneck class
(:mod:`tuiprof.analysis.batch`); per model and mode the measured knee beside the one predicted
from the matmul shapes. A cell that runs out of memory is recorded as ``oom`` and the sweep
goes on. Compiled cells share one compile per model for every batch >= 2 (the batch dimension
is dynamic) and one for batch 1.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from tuiprof.analysis.batch import (ConfigSummary, measured_knee, predicted_knee,
                                    roofline_tokens_per_s, summarize_config)
from tuiprof.analysis.gpus import GpuSpec, gpu_spec
from tuiprof.analysis.intervals import union_length
from tuiprof.analysis.model import ModelConfig, model_config
from tuiprof.engine.events import CollectingListener
from tuiprof.engine.generate import COMPILED, Engine
from tuiprof.engine.memory import is_oom
from tuiprof.sweep.results import MODES, rows_csv


@dataclass
class BatchCell:
    model: str
    mode: str
    batch: int


@dataclass
class BatchResult:
    """One cell: its status, step times and what the analysis makes of them."""

    cell: BatchCell
    status: str                               # ok | oom | error | skipped
    error: str | None = None
    times_ms: list = field(default_factory=list)
    gpu_ms: float | None = None               # median CUDA-event time of a step
    summary: ConfigSummary | None = None      # tok/s, ms/step, MBU, MFU, class
    categories: dict = field(default_factory=dict)   # kernel (op) category -> share of time
    compile_s: float | None = None
    peak_mem_mib: float | None = None

    def row(self) -> dict:
        s, c = self.summary, self.cell
        return {"model": c.model, "mode": c.mode, "batch": c.batch, "status": self.status,
                "tok_s": _r(s.tok_s, 1) if s else "", "ms_step": _r(s.ms_step) if s else "",
                "gpu_ms_step": _r(self.gpu_ms), "mbu": _r(s.mbu, 4) if s else "",
                "mfu": _r(s.mfu, 4) if s else "", "class": s.klass if s else "",
                "why": s.why if s else "", "busy": _r(s.busy, 4) if s else "",
                "context": s.context if s else "", "compile_s": _r(self.compile_s, 1),
                "peak_mem_mib": _r(self.peak_mem_mib, 1),
                "categories": " ".join(f"{k}:{v:.3f}" for k, v in self.categories.items()),
                "error": self.error or ""}


@dataclass
class BatchSweep:
    """Every cell of a batch sweep, with the knees and the roofline it is read against."""

    device: str
    spec: GpuSpec
    settings: dict
    notes: list = field(default_factory=list)
    cells: list = field(default_factory=list)
    configs: dict = field(default_factory=dict)      # model -> ModelConfig | None
    elapsed_s: float = 0.0

    def knees(self) -> list[dict]:
        """Per model and mode: the knee predicted from the matmul shapes and the measured one."""
        out = []
        for model, cfg in self.configs.items():
            pred = predicted_knee(cfg, self.spec) if cfg is not None else None
            for mode in dict.fromkeys(c.cell.mode for c in self.cells if c.cell.model == model):
                rows = [c.summary for c in self.cells if c.cell.model == model and
                        c.cell.mode == mode and c.summary is not None]
                k = measured_knee(rows, mode)
                out.append({"model": model, "mode": mode, "predicted": pred,
                            "measured": None if k is None else k.batch,
                            "gain": None if k is None else k.gain,
                            "largest": None if k is None else k.largest})
        return out

    def table(self) -> str:
        """Markdown: one row per cell, then the knees."""
        lines = ["| model | mode | batch | tokens/s | ms/step | MBU | MFU | bound | busy | "
                 "kernel time by category |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in self.cells:
            s, c = r.summary, r.cell
            if s is None:
                lines.append(f"| {c.model} | {c.mode} | {c.batch} | {r.status.upper()} | | | | "
                             f"| | {(r.error or '')[:60]} |")
                continue
            cats = ", ".join(f"{k} {v:.0%}" for k, v in list(r.categories.items())[:3])
            lines.append(f"| {c.model} | {c.mode} | {c.batch} | {s.tok_s:,.0f} | {s.ms_step:.2f} "
                         f"| {_pct(s.mbu)} | {_pct(s.mfu)} | {s.klass} | {_pct(s.busy)} | {cats} |")
        lines += ["", "| model | mode | knee predicted (GEMM intensity = ridge) | knee measured "
                      "(< 25 % tokens/s per doubling past it) |", "|---|---|---|---|"]
        for k in self.knees():
            pred = f"≈{k['predicted']:.0f}" if k["predicted"] else "not reached"
            if k["measured"] is not None:
                meas = f"{k['measured']} ({k['gain'] - 1:+.0%} per doubling past it)"
            elif k["largest"] is not None:
                meas = f"still scaling at {k['largest']}"
            else:
                meas = "–"
            lines.append(f"| {k['model']} | {k['mode']} | {pred} | {meas} |")
        return "\n".join(lines) + "\n"

    def chart(self, width: int = 100, height: int = 24) -> str:
        """tokens/s against batch (log-log), each model and mode, beside its roofline bound."""
        try:
            import plotext as plt
        except ImportError:  # pragma: no cover - plotext comes with textual-plotext
            return "(no chart: plotext is not installed)\n"
        plt.clear_figure()
        plt.plotsize(width, height)
        plt.theme("clear")
        batches = sorted({r.cell.batch for r in self.cells})
        ctx = int(self.settings.get("prompt_len", 16)) + int(self.settings.get("warmup", 8)) + 1
        drawn = False
        for model, cfg in self.configs.items():
            for mode in dict.fromkeys(c.cell.mode for c in self.cells if c.cell.model == model):
                pts = [(math.log2(r.cell.batch), r.summary.tok_s) for r in self.cells
                       if r.cell.model == model and r.cell.mode == mode and r.summary is not None
                       and r.summary.tok_s > 0]
                if pts:
                    plt.plot(*zip(*pts), label=f"{model} {mode}", marker="braille")
                    drawn = True
            if cfg is not None and batches:
                bound = [(math.log2(b), roofline_tokens_per_s(cfg, self.spec, b, ctx)) for b in batches]
                plt.plot(*zip(*bound), label=f"{model} roofline bound", marker="dot")
        if not drawn:
            return "(no chart: no cell ran)\n"
        plt.xticks([math.log2(b) for b in batches], [str(b) for b in batches])
        plt.yscale("log")
        plt.xlabel("batch")
        plt.ylabel("tokens/s")
        plt.title(f"decode tokens/s vs batch on {self.device} ({self.spec.source} peaks)")
        return _plain(plt.build()) + "\n"

    def csv(self) -> str:
        return rows_csv([r.row() for r in self.cells])

    def to_dict(self) -> dict:
        return {"device": self.device, "peaks": {"source": self.spec.source,
                                                 "bandwidth_Bps": self.spec.bandwidth_Bps,
                                                 "bf16_flops": self.spec.bf16_flops},
                "settings": self.settings, "notes": self.notes, "elapsed_s": round(self.elapsed_s, 2),
                "knees": self.knees(),
                "cells": [{**r.row(), "times_ms": [round(t, 4) for t in r.times_ms],
                           "summary": asdict(r.summary) if r.summary else None,
                           "categories": r.categories} for r in self.cells]}

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """``batch.csv``, ``batch.json``, ``batch.md`` (table and chart)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"csv": out / "batch.csv", "json": out / "batch.json", "md": out / "batch.md"}
        paths["csv"].write_text(self.csv())
        paths["json"].write_text(json.dumps(self.to_dict(), indent=1, default=str) + "\n")
        head = f"# tuiprof batch sweep on {self.device}\n\n" + "".join(f"- {n}\n" for n in self.notes)
        paths["md"].write_text(head + "\n" + self.table() + "\n```\n" + self.chart() + "```\n")
        return paths


def run_batch_sweep(models: Sequence[str], batches: Sequence[int], modes: Sequence[str] = ("eager",),
                    *, device: str | None = None, dtype: str | None = None, seed: int = 0,
                    prompt_len: int = 16, warmup: int = 8, iters: int = 24,
                    compile_mode: str | None = None, memory_limit_gib: float | None = None,
                    profile: bool = True, skip: Callable[[BatchCell], str | None] | None = None,
                    progress: Callable[[str], None] | None = None,
                    spec: GpuSpec | None = None,
                    after_model: Callable[[str, Any], None] | None = None) -> BatchSweep:
    """Run every (model, mode, batch) cell; ``skip(cell)`` may return why a cell is left out;
    ``after_model(name, loaded)`` runs once a model's cells are done, before it is released
    (more measurements on the model already loaded and compiled)."""
    from tuiprof.engine.load import load_model, pick_device, prompt_ids
    from tuiprof.sweep.runner import _limit_memory, _release

    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; use {', '.join(MODES)}")
    dev = pick_device(device)
    cuda = dev.startswith("cuda")
    meta = {"device_name": torch.cuda.get_device_name(dev) if cuda else "cpu"}
    if cuda:
        meta["sm_count"] = torch.cuda.get_device_properties(dev).multi_processor_count
    spec = spec or gpu_spec(meta)
    sweep = BatchSweep(meta["device_name"], spec, {
        "batches": list(batches), "modes": list(modes), "prompt_len": prompt_len,
        "warmup": warmup, "iters": iters, "dtype": dtype, "seed": seed,
        "compile_mode": compile_mode, "memory_limit_gib": memory_limit_gib})
    if memory_limit_gib is not None:
        sweep.notes.append(_limit_memory(torch.device(dev), memory_limit_gib))
    say = progress or (lambda _text: None)
    t0 = time.perf_counter()
    max_len = prompt_len + warmup + iters + 8
    for model in models:
        try:
            loaded = load_model(model, device=dev, dtype=dtype, seed=seed, max_len=max_len)
        except Exception as exc:  # noqa: BLE001 - recorded per cell
            status = "oom" if is_oom(exc) else "error"
            for mode in modes:
                for b in batches:
                    sweep.cells.append(BatchResult(BatchCell(model, mode, b), status,
                                                   f"building the model: {_one_line(exc)}"))
            continue
        d = loaded.source.model_def
        cfg = model_config({"model_def": {"name": d.name, "family": d.family,
                                          "config": dict(d.config)},
                            "model": d.name, "dtype": loaded.dtype})
        sweep.configs[model] = cfg
        for mode in modes:
            # compiled: batches >= 2 first (one dynamic-batch compile), batch 1 last
            order = sorted(batches, key=lambda b: (mode == COMPILED and b == 1, b))
            for b in order:
                cell = BatchCell(model, mode, b)
                why = skip(cell) if skip is not None else None
                if why:
                    sweep.cells.append(BatchResult(cell, "skipped", why))
                    continue
                say(f"{model} {mode} batch {b} …")
                res = _run_cell(cell, loaded, cfg, spec, prompt_ids(loaded, None, prompt_len, seed, b)[0],
                                warmup=warmup, iters=iters, seed=seed, compile_mode=compile_mode,
                                profile=profile, dev=dev)
                sweep.cells.append(res)
                say(_progress_line(res))
                _release(collect=res.status != "ok")
        if after_model is not None:
            after_model(model, loaded)
        loaded = None
        _release()
    sweep.cells.sort(key=lambda r: (list(models).index(r.cell.model), list(modes).index(r.cell.mode),
                                    r.cell.batch))
    sweep.elapsed_s = time.perf_counter() - t0
    return sweep


def _run_cell(cell: BatchCell, loaded: Any, cfg: ModelConfig | None, spec: GpuSpec,
              prompts: torch.Tensor, *, warmup: int, iters: int, seed: int,
              compile_mode: str | None, profile: bool, dev: str) -> BatchResult:
    cuda = dev.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    listener = CollectingListener()
    engine = Engine(loaded.adapter, prompts, device=dev, max_new_tokens=1 + warmup + iters,
                    mode=cell.mode, compile_mode=compile_mode, seed=seed, listener=listener,
                    max_batch=cell.batch, background_compile=False)
    engine.run()
    problem = engine.error or next((n for n in engine.notes if n.startswith(
        ("out of memory", "compile failed"))), None)
    if problem is None and cell.mode == COMPILED and engine.mode != COMPILED:
        problem = "the compiled step did not run"
    if problem:
        return BatchResult(cell, "oom" if "out of memory" in problem else "error", problem)
    steps = [e for e in listener.events if e.phase == "decode"][warmup:]
    times = [e.host_ms for e in steps]
    gpu = [e.gpu_ms for e in steps if e.gpu_ms is not None]
    res = BatchResult(cell, "ok", times_ms=times, gpu_ms=statistics.median(gpu) if gpu else None,
                      compile_s=engine.compile_s if cell.mode == COMPILED else None)
    busy = kernels = None
    if profile:
        try:
            res.categories, busy_ms, kernels = _profile_step(engine, cuda)
            busy = busy_ms / statistics.median(times) if cuda and busy_ms else None
        except Exception as exc:  # noqa: BLE001 - a profile is a bonus, the timing stands
            res.error = f"profile: {_one_line(exc)}"
    ctx = statistics.median([prompts.shape[1] + e.step + 1 for e in steps])
    # tokens/s from the median step too: a benchmark cell's few host stalls must not move it
    med = statistics.median(times)
    res.summary = summarize_config(cell.batch, cell.mode, seqs=cell.batch, steps=len(times),
                                   ms_median=med, ms_mean=med, context=int(ctx), cfg=cfg,
                                   spec=spec, kernels_step=kernels, busy=busy, gpu=cuda)
    if cuda:
        res.peak_mem_mib = torch.cuda.max_memory_allocated(dev) / 2**20
    return res


def _profile_step(engine: Engine, cuda: bool) -> tuple[dict, float, float | None]:
    """One more decode step under ``torch.profiler``: kernel (CPU op) time by category, the
    union of kernel time (ms) and the kernels per step (CUDA)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from tuiprof.analysis.kernels import kernel_info
    from tuiprof.sweep.op_summary import classify

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        engine.decode_once()
        if cuda:
            torch.cuda.synchronize()
    by_cat: dict[str, float] = defaultdict(float)
    spans = []
    for e in prof.events():
        if getattr(e, "is_user_annotation", False):
            continue
        if cuda and e.device_type == DeviceType.CUDA:
            by_cat[kernel_info(e.name).category] += e.time_range.end - e.time_range.start
            spans.append((e.time_range.start, e.time_range.end))
        elif not cuda and e.device_type == DeviceType.CPU and not e.is_async \
                and not e.name.startswith(("ProfilerStep", "## ", "attn::")):
            by_cat[classify(e.name)] += e.self_cpu_time_total
    total = sum(by_cat.values()) or 1.0
    cats = {k: v / total for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])}
    return cats, union_length(spans) / 1e3, (len(spans) if cuda else None)


def _plain(text: str) -> str:
    """The chart without its terminal colour codes (it goes to files and logs too)."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _progress_line(r: BatchResult) -> str:
    c, s = r.cell, r.summary
    if s is None:
        return f"{c.model} {c.mode} batch {c.batch}: {r.status.upper()} {(r.error or '')[:80]}"
    return (f"{c.model} {c.mode} batch {c.batch}: {s.tok_s:,.0f} tok/s, {s.ms_step:.2f} ms/step, "
            f"MBU {_pct(s.mbu)}, MFU {_pct(s.mfu)}, {s.klass}")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


def _r(x: float | None, nd: int = 3) -> float | str:
    return "" if x is None else round(x, nd)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"
