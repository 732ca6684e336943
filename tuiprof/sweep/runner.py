"""``run_sweep``: time and profile every (model, mode, attention, sequence length, pass) cell.

Each cell runs ``warmup`` + ``iters`` iterations of its pass, timed with a device
synchronisation around each, then one more iteration under ``torch.profiler`` (CUDA kernel
activity on a GPU, CPU op events otherwise). Passes:

* ``inference``: full-sequence forward under ``no_grad``;
* ``train-forward``: the same forward with autograd recording;
* ``train-backward``: forward, cross-entropy against shifted ids, backward;
* ``decode``: one static-shape decode step at position ``seq_len`` after a prefill of
  ``seq_len`` tokens (batch 1: the adapters are batch-1 decoders).

Out-of-memory cells are recorded as ``oom``, their memory released, and the sweep goes on;
other failures are recorded as ``error``. Faults can be injected per cell through
``fault_hook`` or ``$TUIPROF_SWEEP_FAULT`` (see :func:`env_fault_hook`).
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.nn.functional as F

from tuiprof.engine.memory import is_oom
from tuiprof.errors import one_line
from tuiprof.sweep import models as registry
from tuiprof.sweep.op_summary import ProfileSummary, summarize_profiler
from tuiprof.sweep.results import MODES, PASSES, Cell, CellResult, SweepResult
FAULT_ENV = "TUIPROF_SWEEP_FAULT"


@dataclass
class Progress:
    """Progress of a sweep, sent before (``phase="start"``) and after (``"done"``) each cell."""

    index: int  # 1-based number of the cell
    total: int
    cell: Cell
    phase: str
    elapsed_s: float
    eta_s: float | None
    result: CellResult | None = None

    def line(self) -> str:
        """One status line: ``[ 3/12] gpt2-small L=256 inference eager  ok 12.3 ms | 0:12 elapsed, ~0:40 left``."""
        c = self.cell
        what = f"{c.model} L={c.seq_len} {c.pass_name} {c.mode}" + (f" {c.attention}" if c.attention else "")
        if self.result is None:
            state = "running"
        elif self.result.status == "ok":
            state = f"ok {self.result.mean_ms:.2f} ms"
        else:
            state = self.result.status
        eta = "?" if self.eta_s is None else _clock(self.eta_s)
        width = len(str(self.total))
        return f"[{self.index:>{width}}/{self.total}] {what}  {state} | {_clock(self.elapsed_s)} elapsed, ~{eta} left"


def env_fault_hook(spec: str | None = None) -> Callable[[Cell], None] | None:
    """A fault hook from ``$TUIPROF_SWEEP_FAULT`` (or ``spec``).

    Format: comma-separated ``oom:MODEL:SEQ_LEN[:PASS[:MODE]]`` or ``error:...``; ``*``
    matches anything. Example: ``oom:gpt2-small:512`` fails every pass of that cell.
    """
    spec = os.environ.get(FAULT_ENV) if spec is None else spec
    if not spec:
        return None
    rules = [r.split(":") for r in spec.split(",") if r.strip()]

    def hook(cell: Cell) -> None:
        values = (cell.model, str(cell.seq_len), cell.pass_name, cell.mode)
        for kind, *pattern in rules:
            if all(p in ("*", v) for p, v in zip(pattern, values)):
                if kind == "oom":
                    raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (injected by {FAULT_ENV})")
                raise RuntimeError(f"injected failure ({FAULT_ENV})")

    return hook


def plan(models: Sequence[str], seq_lens: Sequence[int], *, batch: int, passes: Sequence[str], modes: Sequence[str],
         attention: Sequence[str | None]) -> list[Cell]:
    """Cells in run order: model, mode, attention, sequence length, pass."""
    for p in passes:
        if p not in PASSES:
            raise ValueError(f"unknown pass {p!r}; use {', '.join(PASSES)}")
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; use {', '.join(MODES)}")
    return [Cell(model, int(L), 1 if p == "decode" else batch, p, mode, attn)
            for model in models for mode in modes for attn in attention for L in seq_lens for p in passes]


def run_sweep(
    models: Sequence[str],
    seq_lens: Sequence[int],
    batch: int = 1,
    passes: Sequence[str] = ("inference",),
    modes: Sequence[str] = ("eager",),
    memory_limit_gib: float | None = None,
    warmup: int = 2,
    iters: int = 5,
    device: str | torch.device | None = None,
    progress: Callable[[Progress], None] | None = None,
    *,
    attention: Sequence[str] | None = None,
    dtype: str | None = None,
    seed: int = 0,
    weights: dict[str, str] | None = None,
    compile_mode: str | None = None,
    compile_backend: str = "inductor",
    profile: bool = True,
    fault_hook: Callable[[Cell], None] | None = None,
    cancel: Any = None,
) -> SweepResult:
    """Run every cell and return its timings and kernel summaries.

    ``attention`` (e.g. ``("plain", "sdpa")``) overrides ``config["attention"]`` of families
    that have the switch (cs336, nanochat, deepseek, llama_layer); a model without it runs
    once with its own attention (recorded as ``None``). ``dtype`` None uses each entry's
    dtype. ``fault_hook(cell)`` runs at the start of each cell (after ``$TUIPROF_SWEEP_FAULT``'s).
    ``cancel`` (e.g. a ``threading.Event``): once ``cancel.is_set()``, the remaining cells
    are recorded as skipped.
    """
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    notes: list[str] = []
    if memory_limit_gib is not None:
        notes.append(_limit_memory(dev, memory_limit_gib))
    attn_axis: list[str | None] = list(attention) if attention else [None]
    cells = plan(models, seq_lens, batch=batch, passes=passes, modes=modes, attention=attn_axis)
    hooks = [h for h in (env_fault_hook(), fault_hook) if h is not None]
    result = SweepResult(device=_device_name(dev), started=time.time(), notes=notes,
                         settings={"batch": batch, "passes": list(passes), "modes": list(modes), "warmup": warmup,
                                   "iters": iters, "dtype": dtype, "seed": seed, "compile_mode": compile_mode,
                                   "compile_backend": compile_backend, "memory_limit_gib": memory_limit_gib,
                                   "attention": attention and list(attention)})
    t0 = time.perf_counter()
    done = 0

    def report(i: int, cell: Cell, phase: str, res: CellResult | None) -> None:
        if progress is None:
            return
        elapsed = time.perf_counter() - t0
        eta = elapsed / done * (len(cells) - done) if done else None
        progress(Progress(i, len(cells), cell, phase, elapsed, eta, res))

    index = 0
    for model in models:
        for attn in attn_axis:
            group = [c for c in cells if c.model == model and c.attention == attn]
            adapter, build_error, build_oom = None, None, False
            switchless = False
            try:
                if cancel is not None and cancel.is_set():
                    raise RuntimeError("cancelled")
                defn = registry.model_def(model)
                switchless = attn is not None and not registry.has_attention_switch(defn)
                if not (switchless and attn != attn_axis[0]):
                    adapter = registry.build_adapter(registry.with_attention(defn, None if switchless else attn),
                                                     device=dev, dtype=dtype, seed=seed,
                                                     weights=(weights or {}).get(model))
            except Exception as exc:  # noqa: BLE001 - recorded per cell
                build_oom, build_error = is_oom(exc), f"building the model: {_one_line(exc)}"
            _release()
            own_impl = registry.attention_impl(adapter) if adapter is not None else None
            for cell in group:
                index += 1
                if cancel is not None and cancel.is_set():
                    res = CellResult.from_cell(cell, "skipped", error="cancelled")
                    result.cells.append(res)
                    done += 1
                    report(index, cell, "done", res)
                    continue
                if attn is None:
                    cell.attention = own_impl
                if switchless:
                    cell.attention = None
                    if attn != attn_axis[0]:
                        res = CellResult.from_cell(cell, "skipped", error="the family has no attention switch")
                        result.cells.append(res)
                        done += 1
                        report(index, cell, "done", res)
                        continue
                report(index, cell, "start", None)
                if adapter is None:
                    res = CellResult.from_cell(cell, "oom" if build_oom else "error", error=build_error)
                else:
                    res = _run_cell(cell, adapter, dev, warmup=warmup, iters=iters, hooks=hooks, profile=profile,
                                    compile_mode=compile_mode, compile_backend=compile_backend, seed=seed)
                result.cells.append(res)
                done += 1
                report(index, cell, "done", res)
            adapter = None
            _release()
    result.elapsed_s = time.perf_counter() - t0
    return result


def _run_cell(cell: Cell, adapter: Any, dev: torch.device, *, warmup: int, iters: int,
              hooks: Iterable[Callable[[Cell], None]], profile: bool, compile_mode: str | None,
              compile_backend: str, seed: int) -> CellResult:
    max_len = int(getattr(adapter, "max_len", 0) or 0)
    limit = max_len - 1 if cell.pass_name == "decode" else max_len
    if max_len and cell.seq_len > limit:
        return CellResult.from_cell(cell, "skipped", error=f"seq_len {cell.seq_len} exceeds the model's limit {limit}")
    status, error, times, summary, peak = "ok", None, [], None, None
    step: Callable[[], Any] | None = None
    try:
        for hook in hooks:
            hook(cell)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        step = _make_step(cell, adapter, dev, compile_mode=compile_mode, compile_backend=compile_backend, seed=seed)
        for _ in range(warmup):
            step()
        _sync(dev)
        for _ in range(iters):
            _sync(dev)
            t = time.perf_counter()
            step()
            _sync(dev)
            times.append((time.perf_counter() - t) * 1e3)
        if dev.type == "cuda":
            peak = torch.cuda.max_memory_allocated(dev) / 2**20
        if profile:
            summary = _profile(step, dev)
    except Exception as exc:  # noqa: BLE001 - recorded per cell, the sweep goes on
        status = "oom" if is_oom(exc) else "error"
        error = _one_line(exc)
    finally:
        step = None
        module = getattr(adapter, "module", None)
        if isinstance(module, torch.nn.Module):
            module.zero_grad(set_to_none=True)
        release = getattr(adapter, "release_cache", None)
        if callable(release) and cell.pass_name == "decode":
            release()
        _release(collect=status != "ok")
    res = CellResult.from_cell(cell, status, error=error)
    if times:
        res.set_times(times)
    res.peak_mem_mib = peak
    res.profile = summary
    return res


def _make_step(cell: Cell, adapter: Any, dev: torch.device, *, compile_mode: str | None, compile_backend: str,
               seed: int) -> Callable[[], Any]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    vocab = int(adapter.vocab_size)
    compiled = cell.mode == "compiled"
    if compiled:
        torch._dynamo.reset()
        if dev.type == "cpu":
            _cpu_kernel_profile()

    def compile_fn(fn: Any) -> Any:
        return torch.compile(fn, mode=compile_mode, backend=compile_backend)

    if cell.pass_name == "decode":
        ids = torch.randint(0, vocab, (1, cell.seq_len), generator=gen).to(dev)
        token = ids[:, -1:].clone()
        pos = torch.tensor([cell.seq_len], device=dev)
        adapter.reset_cache()
        adapter.prefill(ids)
        decode = compile_fn(adapter.decode) if compiled else adapter.decode
        masks = getattr(adapter, "decode_masks", None)  # made once: the position stays
        args = (token, pos) if masks is None else (
            token, pos, adapter.cache, masks(adapter.cache, 1).at(pos, cell.seq_len))

        def step() -> Any:
            return decode(*args)

        return step

    ids = torch.randint(0, vocab, (cell.batch, cell.seq_len), generator=gen).to(dev)
    forward = registry.forward_fn(adapter, compile_fn if compiled else None)
    if cell.pass_name == "inference":

        def step() -> Any:
            with torch.no_grad():
                return forward(ids)

        return step
    if cell.pass_name == "train-forward":

        def step() -> Any:
            with torch.enable_grad():
                return forward(ids)

        return step
    targets = torch.roll(ids, -1, dims=1)
    module = adapter.module

    def step() -> Any:
        module.zero_grad(set_to_none=True)
        with torch.enable_grad():
            logits = forward(ids)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
            loss.backward()
        return loss.detach()

    return step


def _profile(step: Callable[[], Any], dev: torch.device) -> ProfileSummary:
    from torch.profiler import ProfilerActivity, profile

    cuda = dev.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        step()
        _sync(dev)
    return summarize_profiler(prof, cuda=cuda)


def _cpu_kernel_profile() -> None:
    """Let inductor's C++ kernels show up as named CPU events in the profile."""
    try:
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    except Exception:  # pragma: no cover
        pass


def _limit_memory(dev: torch.device, gib: float) -> str:
    if dev.type != "cuda":
        return f"memory limit {gib} GiB ignored on {dev.type}"
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = min(1.0, gib * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return f"memory limited to {gib} GiB ({fraction:.3f} of {total / 2**30:.1f} GiB)"


def _release(collect: bool = True) -> None:
    """Return freed memory to the device; ``collect`` also runs the garbage collector
    (after a failure, whose traceback may have held tensors, and between models)."""
    if collect:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return dev.type


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(exc)}"


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
