"""Engine, program (step sources), collect, store and analysis never import Textual:
collectors never touch widgets."""
from __future__ import annotations

import pkgutil
import subprocess
import sys

import tuiprof

LAYERS = ("tuiprof.engine", "tuiprof.program", "tuiprof.collect", "tuiprof.store",
          "tuiprof.analysis")


def _modules() -> list[str]:
    names = ["tuiprof.profiler", "tuiprof.control"]
    for layer in LAYERS:
        names.append(layer)
        pkg = __import__(layer, fromlist=["__path__"])
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, layer + ".")]
    return names


def test_lower_layers_never_import_textual():
    mods = _modules()
    assert any(m.startswith("tuiprof.collect.") for m in mods)
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(__import__('pathlib').Path(tuiprof.__file__).parents[1]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"textual imported by a lower layer: {out.stdout}"


def test_importing_tuiprof_is_light():
    # tuiprof.step lives in the package itself: a program that marks its steps pays nothing
    out = subprocess.run([sys.executable, "-c", "import sys, tuiprof, tuiprof.cli; "
                          "tuiprof.step; tuiprof.mark_prefill; "
                          "print(any(m in sys.modules for m in ('torch', 'textual', "
                          "'transformers', 'numpy')))"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_no_module_reads_a_name_it_never_binds():
    """A merge dropped ``import re`` from the snapshot writer: exports of a session of several
    ranks failed with a NameError only when a rank had failed. A coarse static check (a name
    read somewhere must be bound somewhere in its module, or be a builtin) finds such drops
    before a user does."""
    import ast
    import builtins
    from pathlib import Path

    known = set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__", "__path__"}
    unbound = []
    for path in sorted(Path(tuiprof.__file__).parent.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        bound = set(known)
        for n in ast.walk(tree):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(n.name)
            elif isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                bound.add(n.id)
            elif isinstance(n, ast.arg):
                bound.add(n.arg)
            elif isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and n.name:
                bound.add(n.name)
            elif isinstance(n, (ast.Global, ast.Nonlocal)):
                bound.update(n.names)
        unbound += [f"{path.name}:{n.lineno} {n.id}" for n in ast.walk(tree)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in bound]
    assert unbound == []
