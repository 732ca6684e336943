"""transformers' import structure kept across processes, so that importing it does not read
every model's source at every start.

``import transformers`` (5.x) builds its lazy module's table by reading and parsing every file
under ``transformers/models`` (``create_import_structure_from_path``: some 2,000 files, looking
for ``__all__`` and ``@requires``), and ``transformers.models`` does it a second time with
another key of its ``lru_cache``. That is about a second of every start of the engine's
processes (the session's and the compile helper's), spent before any model code runs. The
table depends only on those files; so here it is kept in tuiprof's cache
(``$XDG_CACHE_HOME/tuiprof/transformers-imports``, mode 0700), keyed by the directory and the
name, size and modification time of every file under it (a walk of stat calls: tens of
milliseconds), and read back instead of parsing the files again. Any change to a file gives
another key, as a ``.pyc`` is invalidated by its source; an unreadable entry is ignored and
written again; the directory keeps the :data:`KEEP` entries used last. An entry is JSON of
the structure's own types (dicts, frozensets and sets of strings; lists, tuples and JSON's
scalars too), each tagged and checked as
it is read back: nothing in the cache can make the reader run code, as an unpickler could.

It works by wrapping that one function of ``transformers.utils.import_utils`` right after the
module has run (an import hook that removes itself), before ``transformers/__init__`` calls
it; nothing else of transformers changes, and nothing happens where transformers is imported
already, or in a user's program (only the engine's model-code import installs it).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from importlib.abc import MetaPathFinder
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any, Callable

from .compile_cache import tuiprof_cache

TARGET = "transformers.utils.import_utils"
FUNCTION = "create_import_structure_from_path"
DIR = "transformers-imports"
KEEP = 8
FORMAT = 2     # 2: tagged JSON (1: pickle, never read again)


def cache_dir() -> Path:
    return tuiprof_cache() / DIR


def key_of(module_path: str) -> str:
    """What the structure of ``module_path`` depends on: every file's name, size and mtime."""
    h = hashlib.sha256(f"{FORMAT}\0{sys.version_info[:2]}\0{module_path}\0".encode())
    for root, dirs, files in os.walk(module_path):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            h.update(f"{os.path.relpath(os.path.join(root, name), module_path)}\0{st.st_size}"
                     f"\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:32]


def cached(original: Callable[[Any], Any], where: Path | None = None) -> Callable[[Any], Any]:
    """``original`` (``create_import_structure_from_path``) with its result for a directory
    kept on disk; its recursive calls for subdirectories go to ``original`` itself."""
    # a directory's structure as bytes: every call gets an object of its own, as two calls
    # with different arguments (a folder, a file in it) got from transformers' lru_cache
    memo: dict = {}
    busy = threading.local()

    def structure(module_path: Any) -> Any:
        if getattr(busy, "on", False):           # inside the original's own recursion
            return original(module_path)
        path = os.path.abspath(os.fspath(module_path))
        if os.path.isfile(path):
            path = os.path.dirname(path)
        if path in memo:
            return loads(memo[path])
        folder = where if where is not None else cache_dir()
        try:
            entry = folder / f"{key_of(path)}.json"
        except OSError:
            entry = None
        blob = _read(entry) if entry is not None else None
        if blob is not None:
            try:
                os.utime(entry)                  # "used last": what pruning orders by
            except OSError:
                pass
            memo[path] = blob
            return loads(blob)
        busy.on = True
        try:
            value = original(module_path)
        finally:
            busy.on = False
        try:
            blob = dumps(value)
        except TypeError:   # a type of another transformers: that structure is not kept
            return value
        memo[path] = blob
        if entry is not None:
            _write(entry, blob)
        return value

    structure.__wrapped__ = original             # type: ignore[attr-defined]
    structure.tuiprof_kept = True                # type: ignore[attr-defined]
    return structure


_KINDS = {"f": frozenset, "s": set, "l": list, "t": tuple}


_PLAIN = (str, bool, int, float, type(None))


def _encode(x: Any) -> Any:
    if isinstance(x, _PLAIN):
        return x
    if isinstance(x, dict):
        return {"d": [[_encode(k), _encode(v)] for k, v in x.items()]}
    if isinstance(x, (frozenset, set)):
        return {"f" if isinstance(x, frozenset) else "s": sorted(_encode(e) for e in x)}
    if isinstance(x, (list, tuple)):
        return {"l" if isinstance(x, list) else "t": [_encode(e) for e in x]}
    raise TypeError(f"not kept: {type(x).__name__}")


def _decode(x: Any) -> Any:
    if isinstance(x, _PLAIN):
        return x
    if not isinstance(x, dict) or len(x) != 1:
        raise ValueError("not an entry of this cache")
    (tag, v), = x.items()
    if not isinstance(v, list) or (tag != "d" and tag not in _KINDS):
        raise ValueError("not an entry of this cache")
    if tag == "d":
        out = {}
        for pair in v:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError("not an entry of this cache")
            k = _decode(pair[0])
            if not isinstance(k, (*_PLAIN, frozenset, tuple)):
                raise ValueError("not an entry of this cache")
            out[k] = _decode(pair[1])
        return out
    return _KINDS[tag](_decode(e) for e in v)


def dumps(structure: dict) -> bytes:
    """``structure`` as tagged JSON; TypeError for a type that is not kept."""
    return json.dumps(_encode(structure), separators=(",", ":")).encode()


def loads(blob: bytes) -> dict:
    """A structure back from :func:`dumps`; ValueError for anything else."""
    value = _decode(json.loads(blob))
    if not isinstance(value, dict):
        raise ValueError("not an entry of this cache")
    return value


def _read(entry: Path) -> bytes | None:
    """The entry's bytes when they read back as a structure (a dict); else None."""
    try:
        blob = entry.read_bytes()
        loads(blob)
    except Exception:   # absent, cut short, another format: parsed again and written anew
        return None
    return blob


def _write(entry: Path, blob: bytes) -> None:
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp.write_bytes(blob)
        os.replace(tmp, entry)
    except Exception:
        try:
            tmp.unlink()
        except OSError:
            pass
        return
    prune(entry.parent)


def prune(folder: Path, keep: int = KEEP) -> list[Path]:
    """Keep the ``keep`` entries used last; returns what was removed."""
    try:
        files = sorted(folder.glob("*.json"), key=lambda p: -p.stat().st_mtime)
    except OSError:
        return []
    for p in files[keep:]:
        try:
            p.unlink()
        except OSError:
            pass
    return files[keep:]


class _Hook(MetaPathFinder):
    """Finds ``transformers.utils.import_utils`` as the path finder does and wraps its
    function once the module has run; then leaves ``sys.meta_path``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname != TARGET:
            return None
        remove()
        spec = PathFinder.find_spec(fullname, path)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            original = getattr(module, FUNCTION, None)
            if callable(original):
                setattr(module, FUNCTION, cached(original))

        loader.exec_module = exec_module          # this loader object serves this module only
        return spec


_hook = _Hook()


def install() -> bool:
    """Wrap transformers' import structure with the cache for the coming import; False when
    transformers' utilities are imported already (nothing to gain then)."""
    if TARGET in sys.modules or "transformers" in sys.modules:
        return False
    if _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)
    return True


def remove() -> None:
    try:
        sys.meta_path.remove(_hook)
    except ValueError:
        pass
