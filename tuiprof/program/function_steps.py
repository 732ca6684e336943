"""Steps at the calls of a function the user names: ``--step-function MODULE:QUALNAME``.

A program with its own decode loop often has one function per step (``engine.decode_step``,
``Runner.forward``). Naming it marks its steps without changing the program: each outermost
call is one step (``prefill`` when the function's name says so, as for NVTX ranges; decode
otherwise), on the thread that calls it, so pause works and CUPTI can be attached for bursts
only. The function is patched on its module or class when the program imports it (or at once
if it is imported already) and restored at the end. ``MODULE`` must be importable by name: a
function defined in the script itself (``__main__``) cannot be found before it runs.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from .import_hooks import Patches
from .steps import DECODE, PREFILL, StepRecorder, compiled_or_eager

SOURCE = "function"


def parse(text: str) -> tuple[str, str]:
    """``"pkg.mod:Class.method"`` -> ``("pkg.mod", "Class.method")``; ValueError if malformed."""
    module, sep, qual = str(text).partition(":")
    parts = qual.split(".")
    if (not sep or not module or not qual or module.startswith(".")
            or not all(p.isidentifier() for p in parts)
            or not all(p.isidentifier() for p in module.split("."))):
        raise ValueError(f"{text!r} is not MODULE:FUNCTION (e.g. myengine.runner:Runner.step)")
    return module, qual


def check(values: list) -> str:
    """The option's check: "" when every value parses."""
    for v in values or ():
        try:
            parse(v)
        except ValueError as exc:
            return str(exc)
    return ""


class FunctionSteps:
    """Wraps each named function so that its outermost calls are steps."""

    name = SOURCE

    def __init__(self, recorder: StepRecorder, targets: list[str],
                 missing: Callable[[str], None] | None = None) -> None:
        self.recorder = recorder
        self.targets = [parse(t) for t in targets]
        self.missing = missing or (lambda text: None)   # told of targets never found
        self._patches = Patches()
        self._found: set[tuple[str, str]] = set()
        self._depth = threading.local()

    def install(self) -> None:
        by_module: dict[str, list[str]] = {}
        for module, qual in self.targets:
            by_module.setdefault(module, []).append(qual)
        self._patches.on_import({m: (lambda mod, qs=quals: [self._patch(mod, q) for q in qs])
                                 for m, quals in by_module.items()})

    def uninstall(self) -> None:
        self._patches.restore()
        self.recorder.end(SOURCE)
        for module, qual in self.targets:
            if (module, qual) not in self._found:
                self.missing(f"--step-function {module}:{qual}: not found in the program "
                             f"(module {module} never imported, or it has no {qual})")

    def _patch(self, mod: Any, qual: str) -> None:
        *path, attr = qual.split(".")
        owner = mod
        for p in path:
            owner = getattr(owner, p, None)
            if owner is None:
                return
        fn = getattr(owner, attr, None)
        if not callable(fn):
            return
        phase = PREFILL if "prefill" in attr.lower() else DECODE
        raw = getattr(owner, "__dict__", {}).get(attr, fn)   # fn: inherited, wrapped here
        if isinstance(raw, staticmethod):
            new: Any = staticmethod(self._wrap(raw.__func__, phase))
        elif isinstance(raw, classmethod):
            new = classmethod(self._wrap(raw.__func__, phase))
        else:
            new = self._wrap(fn, phase)
        self._patches.replace(owner, attr, new)
        self._found.add((mod.__name__, qual))

    def _wrap(self, fn: Callable, phase: str) -> Callable:
        rec, local = self.recorder, self._depth

        @functools.wraps(fn)
        def step(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(local, "n", 0)
            local.n = depth + 1
            opened = rec.begin(SOURCE, phase, mode=compiled_or_eager()) if depth == 0 else None
            try:
                return fn(*args, **kwargs)
            finally:
                local.n = depth
                if opened is not None:
                    rec.end(SOURCE, step=opened)
        return step


def make(session: Any) -> FunctionSteps | None:
    targets = session.options.get("step_function") or []
    if not targets:
        return None
    store = session.prof.store
    return FunctionSteps(session.recorder, targets,
                         missing=lambda text: store.set_collector(SOURCE, False, text))
