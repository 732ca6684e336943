"""The GPU suite's workloads (tests/gpu/_workloads.py) subclass the profiler to steer a session;
they run only on the GPU machine, so an override that falls behind the profiler's signature
(a parameter added there) would fail only there, after a device call. Here every override
must accept every parameter of the method it overrides."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

from tuiprof.profiler import Profiler

WORKLOADS = Path(__file__).resolve().parent / "gpu" / "_workloads.py"
PARENTS = {"Profiler": Profiler}


def _overrides() -> list[tuple[str, str, ast.FunctionDef]]:
    tree = ast.parse(WORKLOADS.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if isinstance(base, ast.Name) and base.id in PARENTS:
                    found += [(node.name, base.id, f) for f in node.body
                              if isinstance(f, ast.FunctionDef)]
    return found


def test_the_gpu_workloads_overrides_accept_what_the_profiler_passes():
    found = _overrides()
    assert found, "no profiler subclass found in tests/gpu/_workloads.py"
    wrong = []
    for cls, parent, fn in found:
        base = getattr(PARENTS[parent], fn.name, None)
        if base is None:
            continue  # a method of its own
        params = [p for p in inspect.signature(base).parameters.values() if p.name != "self"]
        a = fn.args
        if a.vararg is not None and a.kwarg is not None:
            continue  # takes whatever comes
        names = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        missing = [p.name for p in params
                   if p.name not in names
                   and not (a.vararg is not None and p.kind in (p.POSITIONAL_ONLY,
                                                                 p.POSITIONAL_OR_KEYWORD))
                   and not (a.kwarg is not None and p.kind == p.KEYWORD_ONLY)]
        if missing:
            wrong.append(f"{cls}.{fn.name} lacks {missing} of {parent}.{fn.name}")
    assert not wrong, wrong
