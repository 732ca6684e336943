"""A step's kernels by where they were launched: the model's forward, or the loop around it.

A step source that knows the host window of its model forward (the built-in engine: the
adapter's forward; a program's ``generate()``: from ``prepare_inputs_for_generation``
returning to ``_update_model_kwargs_for_generation``) gives it to the store, which counts
each traced kernel for the step that launched it (its CUPTI API record): inside the window it
is the model's, outside it the loop's own (``generate()``'s logits processing, stopping check
and bookkeeping; the engine's attention mask, argmax and position update). The split compares
a user's loop with the built-in engine's on the same model: the model's kernels should agree,
and the loop's are what the user's loop adds.
"""
from __future__ import annotations

from dataclasses import dataclass

from .tokens import tokens_of

__all__ = ["ModelSplit", "model_split", "COVERAGE_OK"]

COVERAGE_OK = 0.95   # share of the split steps' kernels matched to a launch: below, say so


@dataclass(frozen=True, slots=True)
class ModelSplit:
    """Per traced step of one phase and mode (means), over the steps with a model window."""

    phase: str
    mode: str
    steps: int                 # traced steps split (the window's and those that left it)
    model_kernels: float       # kernels launched inside the model forward, per step
    model_ms: float            # their kernel time per step
    loop_kernels: float        # kernels launched outside it (the loop's own), per step
    loop_ms: float
    coverage: float            # (model + loop) / all kernels of those steps (window only)
    top_loop: tuple            # (name, launches per step, ms per step), most time first

    @property
    def loop_share(self) -> float:
        """The loop's share of the step's kernel time."""
        total = self.model_ms + self.loop_ms
        return self.loop_ms / total if total > 0 else 0.0


def model_split(view, phase: str = "decode", top: int = 6) -> dict[str, ModelSplit]:
    """One :class:`ModelSplit` per mode whose traced ``phase`` steps carry a model window."""
    out: dict[str, ModelSplit] = {}
    modes = {m for (p, m) in view.token_stats if p == phase}
    modes |= {t.mode for t in view.tokens if t.phase == phase}
    for mode in sorted(modes):
        rows = [t for t in tokens_of(view, phase, mode) if t.model_start_ns and t.kernels]
        ts = view.token_stats.get((phase, mode), {})
        folded = ts.get("model_kernels")
        n_old = folded.count if folded is not None else 0
        n = n_old + len(rows)
        if not n:
            continue

        def total(key: str, field: str) -> float:
            s = ts.get(key)
            return (s.total if s is not None and s.count else 0.0) + sum(
                getattr(r, field) for r in rows)

        split_k = sum(r.model_kernels + r.loop_kernels for r in rows)
        all_k = sum(r.kernels for r in rows)
        names = []
        for (name, ph, md), agg in view.kernels.items():
            if ph == phase and md == mode and agg.loop_launches:
                names.append((name, agg.loop_launches / n, agg.loop_ns / 1e6 / n))
        names.sort(key=lambda x: -x[2])
        out[mode] = ModelSplit(
            phase, mode, n, total("model_kernels", "model_kernels") / n,
            total("model_kernel_ns", "model_kernel_ns") / 1e6 / n,
            total("loop_kernels", "loop_kernels") / n,
            total("loop_kernel_ns", "loop_kernel_ns") / 1e6 / n,
            split_k / all_k if all_k else 1.0, tuple(names[:top]))
    return out
