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
import sys
import threading
from typing import Any, Callable

from .import_hooks import PostImport
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
        self._restore: list[tuple[Any, str, Any]] = []
        self._found: set[tuple[str, str]] = set()
        self._finder: PostImport | None = None
        self._depth = threading.local()

    def install(self) -> None:
        later: dict[str, Callable[[Any], None]] = {}
        for module, qual in self.targets:
            mod = sys.modules.get(module)
            if mod is not None:
                self._patch(mod, qual)
            else:
                prev = later.get(module)
                later[module] = (lambda m, q=qual, p=prev: (p and p(m), self._patch(m, q)))
        if later:
            self._finder = PostImport(later)
            sys.meta_path.insert(0, self._finder)

    def uninstall(self) -> None:
        if self._finder is not None:
            try:
                sys.meta_path.remove(self._finder)
            except ValueError:
                pass
            self._finder = None
        for owner, attr, orig in reversed(self._restore):
            setattr(owner, attr, orig)
        self._restore.clear()
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
        raw = getattr(owner, "__dict__", {}).get(attr, fn)
        self._restore.append((owner, attr, raw))
        if isinstance(raw, staticmethod):
            new: Any = staticmethod(self._wrap(raw.__func__, phase))
        elif isinstance(raw, classmethod):
            new = classmethod(self._wrap(raw.__func__, phase))
        else:
            new = self._wrap(raw if callable(raw) else fn, phase)
        setattr(owner, attr, new)
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
