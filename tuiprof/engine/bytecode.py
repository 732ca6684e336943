"""Bytecode of its own for the engine's processes, where the install has none and Python may
not write any.

torch installed without bytecode (uv installs none unless asked; images built with
``pip install --no-compile``), in an environment where Python may not write it
(``PYTHONDONTWRITEBYTECODE=1``, which many container images set, or a read-only
site-packages): then every interpreter compiles torch's, sympy's and dynamo's sources again
before the engine can build a model, and the compile helper and inductor's compile workers do
the same. On the H100 machine (torch and sympy without ``.pyc``, ``PYTHONDONTWRITEBYTECODE=1``)
``builtins.compile`` was the largest single part of importing the model code
(``docs/performance.md``, "Bytecode").

So the built-in engine's processes keep bytecode in a cache of tuiprof's own:
``sys.pycache_prefix`` (Python's mirror tree for ``.pyc`` files) points at
``$XDG_CACHE_HOME/tuiprof/pycache`` (default ``~/.cache/tuiprof/pycache``, mode 0700). Nothing
is written beside the sources, which is what ``PYTHONDONTWRITEBYTECODE`` is there to prevent.
Each ``.pyc`` carries its source's modification time and size, so an upgraded package is
compiled again, never run stale. The tree is bounded: once it holds more than
:data:`MAX_BYTES` (measured in the background, after start-up) the next start empties it.

Only the engine's own processes (the session process of ``tuiprof --model``, its ranks, the
compile helper, inductor's workers, which inherit ``PYTHONPYCACHEPREFIX``) do this. A user's
program under ``tuiprof run`` is never changed. Nothing happens where the install has its
bytecode, where the user set ``PYTHONPYCACHEPREFIX`` (their choice wins), or with
``TUIPROF_PYCACHE=off``; ``TUIPROF_PYCACHE=DIR`` moves the tree.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from .compile_cache import dir_bytes, tuiprof_cache

ENV = "TUIPROF_PYCACHE"
MAX_BYTES = 2 * 1024**3     # the whole tree (torch, sympy, transformers, inductor: ~100 MB)
SIZE_FILE = ".size"         # bytes, as measured last
MEASURE_AFTER_S = 60.0      # the tree is measured this long after a start, off the start-up


def root() -> Path | None:
    """Where the tree lives; None when switched off."""
    raw = os.environ.get(ENV, "").strip()
    if raw.lower() in ("off", "0", "none", "no"):
        return None
    if raw:
        return Path(raw).expanduser()
    return tuiprof_cache() / "pycache"


def missing(probe: str = "torch") -> str | None:
    """Why this interpreter would compile ``probe``'s sources at every start (a short
    reason), or None where it has bytecode or may write it beside the sources. ``probe`` is
    located, not imported."""
    if sys.pycache_prefix is not None:
        return None
    try:
        spec = importlib.util.find_spec(probe)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None) if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return None
    try:
        cached = importlib.util.cache_from_source(origin)
    except (NotImplementedError, ValueError):
        return None
    if os.path.exists(cached):
        return None
    if sys.flags.dont_write_bytecode or sys.dont_write_bytecode:
        return f"{probe} has no bytecode and PYTHONDONTWRITEBYTECODE is set"
    if not os.access(os.path.dirname(origin), os.W_OK):
        return f"{probe} has no bytecode and its directory is read-only"
    return None  # Python writes it beside the sources on this start


def _ready(where: Path) -> bool:
    """The tree made (private), kept within its bound and writable; False where it cannot be."""
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        _bound(where)
        return os.access(where, os.W_OK)
    except OSError:
        return False


def keep_own(argv: list[str], probes: tuple[str, ...] = ("tuiprof", "torch")) -> str | None:
    """``python -m tuiprof`` for the built-in engine, before the command's imports: tuiprof's
    own modules (and what its command line imports) keep their bytecode in the tree too, where
    neither tuiprof nor torch has any and none may be written (an image built without bytecode,
    ``PYTHONDONTWRITEBYTECODE=1``): the engine would use the tree for torch anyway (:func:`keep`),
    and without this every start compiles tuiprof's own modules again. Where torch has its
    bytecode nothing changes (the tree would be filled with what it already has). This process
    only (:func:`keep` passes it on to the engine's other processes); a command that runs a
    user's program (``-- PROGRAM``) is left alone. Returns the tree's path or None."""
    where = root()
    if "--" in argv or where is None or any(missing(p) is None for p in probes):
        return None
    if not _ready(where):
        return None
    sys.pycache_prefix = str(where)
    sys.dont_write_bytecode = False
    return str(where)


def keep(probe: str = "torch") -> str | None:
    """Keep bytecode under :func:`root` from now on, where :func:`missing` says the install
    would compile again at every start. Returns the tree's path when it did, else None.

    The environment gets ``PYTHONPYCACHEPREFIX`` (and loses ``PYTHONDONTWRITEBYTECODE``) too,
    for the processes this one starts (the compile helper, inductor's workers): only for a
    process of tuiprof's own engine, never a user's program."""
    where = root()
    if where is None:
        return None
    # the tree already in use for tuiprof's own modules (keep_own): passed on as well
    own = sys.pycache_prefix is not None and sys.pycache_prefix == str(where)
    if not own and missing(probe) is None:
        return None
    if not _ready(where):
        return None  # no cache: the imports run as they did, slower
    sys.pycache_prefix = str(where)
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = str(where)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    threading.Thread(target=_measure_later, args=(where,), name="tuiprof-pycache-size",
                     daemon=True).start()
    return str(where)


def _bound(where: Path) -> None:
    """Empty the tree when its last measured size is over :data:`MAX_BYTES`."""
    try:
        size = int((where / SIZE_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        return
    if size <= MAX_BYTES:
        return
    for entry in where.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _measure_later(where: Path, after_s: float = MEASURE_AFTER_S) -> None:
    time.sleep(after_s)
    try:
        tmp = where / f"{SIZE_FILE}.{os.getpid()}"
        tmp.write_text(str(dir_bytes(where)))
        os.replace(tmp, where / SIZE_FILE)
    except OSError:
        pass
