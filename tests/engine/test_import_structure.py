"""transformers' import structure kept across processes (:mod:`tuiprof.engine.import_structure`):
parsed once, read back by the next process, parsed again when a file changes or the entry is
damaged, the directory bounded; with real transformers, a process that read it back has the
same lazy table (every name to the same module) as a plain import, and the hook leaves no trace
in ``sys.meta_path``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuiprof.engine import import_structure as ist

ROOT = Path(__file__).resolve().parents[2]


def _tree(tmp_path: Path) -> Path:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("__all__ = ['A']\n")
    (pkg / "sub" / "b.py").write_text("__all__ = ['B']\n")
    return pkg


def test_parsed_once_then_read_back_by_the_next_process(tmp_path):
    pkg, store = _tree(tmp_path), tmp_path / "store"
    calls: list[str] = []

    def original(path):
        calls.append(os.fspath(path))
        return {"files": sorted(os.listdir(path))}

    first = ist.cached(original, store)
    value = first(pkg)
    assert calls == [str(pkg)] and value == {"files": ["a.py", "sub"]}
    assert first(str(pkg / "a.py")) == value and len(calls) == 1   # a file: its folder
    second = ist.cached(original, store)            # a new process: nothing in memory
    assert second(pkg) == value and len(calls) == 1
    assert len(list(store.glob("*.json"))) == 1


def test_a_changed_file_is_parsed_again(tmp_path):
    pkg, store = _tree(tmp_path), tmp_path / "store"
    calls: list[str] = []

    def original(path):
        calls.append(os.fspath(path))
        return {"n": len(calls)}

    assert ist.cached(original, store)(pkg) == {"n": 1}
    target = pkg / "sub" / "b.py"
    target.write_text("__all__ = ['B', 'C']\n")
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert ist.cached(original, store)(pkg) == {"n": 2}
    (pkg / "new.py").write_text("")
    assert ist.cached(original, store)(pkg) == {"n": 3}


def test_recursion_goes_to_the_original_and_only_the_top_is_kept(tmp_path):
    pkg, store = _tree(tmp_path), tmp_path / "store"
    calls: list[str] = []
    holder: dict = {}

    def original(path):
        calls.append(os.fspath(path))
        out = {}
        for d in sorted(os.listdir(path)):
            if os.path.isdir(os.path.join(path, d)):
                out[d] = holder["fn"](os.path.join(path, d))   # the module attribute
        return out

    holder["fn"] = ist.cached(original, store)
    assert holder["fn"](pkg) == {"sub": {}}
    assert calls == [str(pkg), str(pkg / "sub")]
    assert len(list(store.glob("*.json"))) == 1


def test_a_damaged_entry_is_parsed_again_and_rewritten(tmp_path):
    pkg, store = _tree(tmp_path), tmp_path / "store"
    n = []

    def original(path):
        n.append(1)
        return {"ok": True}

    ist.cached(original, store)(pkg)
    (entry,) = store.glob("*.json")
    entry.write_bytes(entry.read_bytes()[:5])
    assert ist.cached(original, store)(pkg) == {"ok": True} and len(n) == 2
    assert ist.cached(original, store)(pkg) == {"ok": True} and len(n) == 2


def test_bounded_least_recently_used_first(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    files = []
    for i in range(5):
        p = store / f"{i}.json"
        p.write_bytes(b"x")
        os.utime(p, (1000 + i, 1000 + i))
        files.append(p)
    removed = ist.prune(store, keep=2)
    assert set(removed) == set(files[:3]) and files[3].exists() and files[4].exists()


LAZY = """
import json, sys, time
from tuiprof.engine.imports import import_model_classes
t0 = time.perf_counter()
cfg, model = import_model_classes("qwen3")
import transformers
from transformers.utils import import_utils
table = sorted((k, v) for k, v in transformers._class_to_module.items())
print(json.dumps({"table": table, "n": len(transformers._modules),
                  "model": f"{model.__module__}.{model.__qualname__}",
                  "same": transformers.Qwen3ForCausalLM is model,
                  "hooked": [n for n in map(lambda f: type(f).__name__, sys.meta_path)
                             if n == "_Hook"],
                  "wrapped": getattr(import_utils.create_import_structure_from_path, "tuiprof_kept",
                                     False)}))
"""


def _lazy(cache: Path, way: str) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), TUIPROF_IMPORTS=way,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", LAZY], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_transformers_read_back_has_the_plain_imports_table(tmp_path):
    cache = tmp_path / "xdg"
    plain = _lazy(cache, "hide,direct")
    assert not plain["wrapped"] and not (cache / "tuiprof" / ist.DIR).exists()
    cold = _lazy(cache, "all")
    entries = list((cache / "tuiprof" / ist.DIR).glob("*.json"))
    assert cold["wrapped"] and entries
    stamp = {p: p.stat().st_mtime_ns for p in entries}
    time.sleep(0.01)
    warm = _lazy(cache, "all")
    after = sorted((cache / "tuiprof" / ist.DIR).glob("*.json"))
    assert warm["wrapped"] and sorted(stamp) == after
    for run in (cold, warm):
        assert run["table"] == plain["table"] and run["n"] == plain["n"]
        assert run["model"] == plain["model"] == (
            "transformers.models.qwen3.modeling_qwen3.Qwen3ForCausalLM")
        assert run["same"] and run["hooked"] == []
    assert len(plain["table"]) > 1000        # every model's classes, not a partial table


def test_each_call_gets_an_object_of_its_own(tmp_path):
    """transformers asks for the same folder twice (as a folder and as its ``__init__.py``) and
    got two objects from its lru_cache: what one caller changes, the other does not see."""
    pkg, store = _tree(tmp_path), tmp_path / "store"

    def original(path):
        return {"names": {"A"}}

    fn = ist.cached(original, store)
    first = fn(pkg)
    first["names"].add("changed")
    assert fn(str(pkg / "a.py")) == {"names": {"A"}}
    again = ist.cached(original, store)
    a, b = again(pkg), again(pkg)
    assert a == b == {"names": {"A"}} and a is not b and a["names"] is not b["names"]


def test_an_entry_is_plain_data_checked_as_it_is_read(tmp_path):
    """The cache holds tagged JSON of the structure's own types: what else stands in an entry
    is refused and parsed again, and a structure comes back equal, its frozensets and sets
    as they were."""
    structure = {"m": {frozenset({"torch"}): {"modeling_m": {"M", "N"}}, frozenset(): {}}}
    assert ist.loads(ist.dumps(structure)) == structure
    for bad in (b'{"x": []}', b"[1]", b'{"d": [[{"s": ["a"]}, "b"]]}', b'{"d": [["a"]]}',
                b'{"f": [{"d": 1}]}'):
        with pytest.raises((ValueError, TypeError)):
            ist.loads(bad)
    pkg, store = _tree(tmp_path), tmp_path / "store"
    n = []

    def original(path):
        n.append(1)
        return structure

    ist.cached(original, store)(pkg)
    (entry,) = store.glob("*.json")
    entry.write_bytes(b'{"d": [[{"s": ["a"]}, "b"]]}')   # a set as a key: not a structure
    assert ist.cached(original, store)(pkg) == structure and len(n) == 2
