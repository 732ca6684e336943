"""The post-import hook runs when the module is executed, also after a probe of it with
``importlib.util.find_spec`` (transformers probes ``torch`` so before importing it)."""
from __future__ import annotations

import importlib
import importlib.util
import sys

from tuiprof.program.import_hooks import Patches, PostImport


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


class _Server:
    def handle(self, request_id, n=1):
        return [request_id] * n


class _Spans:
    def __init__(self):
        self.open = self.spans = 0

    def enter(self):
        self.open += 1
        return 1.0

    def leave(self, token):
        self.open -= 1
        self.spans += 1


def test_wrap_notes_around_the_original_and_never_breaks_it():
    seen, failed, clock = [], [], iter(range(100, 200))
    spans = _Spans()
    patches = Patches()

    def before(server, request_id, n=1):
        assert spans.open == 1   # inside an own-time span
        return f"before {request_id}"

    def after(got, out, server, request_id, n=1):
        seen.append((got, out))
        raise RuntimeError("bookkeeping bug")

    patches.wrap(_Server, "handle", lambda where, exc: failed.append((where, str(exc))),
                 "Server.handle", before=before, after=after, hooks=spans)
    assert _Server().handle("a", n=2) == ["a", "a"]          # the program's result, unbroken
    assert seen == [("before a", ["a", "a"])]
    assert failed == [("Server.handle", "bookkeeping bug")] and spans.spans == 2
    patches.restore()
    assert _Server().handle("b") == ["b"] and len(seen) == 1  # the original back

    patches.wrap(_Server, "handle", lambda where, exc: None, "Server.handle",
                 stamp=lambda: next(clock), after=lambda t, out, *a, **k: seen.append(t))
    _Server().handle("c")
    assert seen[-1] == 100                                    # read before the original ran
    patches.restore()
    patches.wrap(_Server, "missing", lambda where, exc: None, "Server.missing", after=after)
    assert not hasattr(_Server, "missing")                    # nothing to wrap: nothing done
