"""The one lazy package face (tuiprof._lazy) that engine, export, sweep and sessions are built
with: a name loads its submodule on first use, an unknown name is an AttributeError, and
importing the package loads none of its submodules."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuiprof._lazy import lazy_face

ROOT = Path(__file__).resolve().parents[1]


def test_a_name_loads_its_module_and_an_unknown_one_says_so():
    names, getattr_ = lazy_face("tuiprof", {"safe_text": "errors", "printable": "text"})
    assert names == ["printable", "safe_text"]
    from tuiprof.errors import safe_text
    assert getattr_("safe_text") is safe_text
    with pytest.raises(AttributeError, match="module 'tuiprof' has no attribute 'nope'"):
        getattr_("nope")


@pytest.mark.parametrize("package", ["tuiprof.engine", "tuiprof.export", "tuiprof.sweep",
                                     "tuiprof.sessions"])
def test_importing_a_lazy_package_loads_none_of_its_submodules(package):
    code = (f"import json, sys, {package} as p; "
            f"print(json.dumps([sorted(m for m in sys.modules if m.startswith('{package}.')), "
            f"p.__all__]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=str(ROOT), check=True)
    loaded, public = json.loads(out.stdout)
    assert loaded == []
    assert public and public == sorted(public)
