"""The post-import hook runs when the module is executed, also after a probe of it with
``importlib.util.find_spec`` (transformers probes ``torch`` so before importing it)."""
from __future__ import annotations

import importlib
import importlib.util
import sys

from tuiprof.program.import_hooks import PostImport


def test_a_find_spec_probe_does_not_use_up_the_hook(tmp_path, monkeypatch):
    (tmp_path / "tuiprof_probe_mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = PostImport({"tuiprof_probe_mod": lambda m: seen.append(m.X)})
    sys.meta_path.insert(0, finder)
    try:
        assert importlib.util.find_spec("tuiprof_probe_mod") is not None   # a probe only
        assert seen == []
        importlib.import_module("tuiprof_probe_mod")
        assert seen == [1]
        importlib.reload(sys.modules["tuiprof_probe_mod"])   # once, not at every load
        assert seen == [1]
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("tuiprof_probe_mod", None)
