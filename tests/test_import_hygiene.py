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
