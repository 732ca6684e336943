"""A persistent torch.compile cache per model, configuration, dtype, torch and device.

Inductor keeps what it compiled (FX graphs, AOT-autograd results, Triton kernels and their
autotuning) in ``TORCHINDUCTOR_CACHE_DIR``, by default ``/tmp/torchinductor_<user>``: shared by
everything, unbounded, and lost with ``/tmp``. tuiprof points it at a directory of its own for
each model::

    $XDG_CACHE_HOME/tuiprof/inductor/<key>/        (default ~/.cache/tuiprof/inductor/<key>)
        key.json      what the key was made of (model, config, dtype, torch, transformers,
                      device name, compile mode)
        triton/       Triton's kernels (TRITON_CACHE_DIR)
        ...           inductor's own entries

``<key>`` is a hash of ``key.json``'s fields, so the second session of the same model on the same
machine and software compiles from a warm cache, and another torch or GPU gets a directory of
its own. Inductor's entries carry their own keys (graph, torch version, configuration, device
properties): an entry that does not match is never used, so a stale directory costs disk, never
correctness. The directories are bounded: at most :data:`KEEP` of them and :data:`MAX_BYTES`
together, the least recently used removed first (never the one in use). The directory is the
user's own (mode 0700).

``TUIPROF_INDUCTOR_CACHE=off`` leaves inductor's default alone; ``TUIPROF_INDUCTOR_CACHE=DIR``
puts the key directories under DIR. A ``TORCHINDUCTOR_CACHE_DIR`` set by the user wins.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

ENV = "TUIPROF_INDUCTOR_CACHE"
KEEP = 8                      # key directories kept
MAX_BYTES = 8 * 1024**3       # all of them together
KEY_FILE = "key.json"
_KEY_DIR = re.compile(r"^[0-9a-f]{16}$")


def root() -> Path | None:
    """Where the key directories live; None when switched off or the user chose a cache dir."""
    raw = os.environ.get(ENV, "").strip()
    if raw.lower() in ("off", "0", "none"):
        return None
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") and not raw:
        return None
    if raw:
        return Path(raw).expanduser()
    return tuiprof_cache() / "inductor"


def tuiprof_cache() -> Path:
    """``$XDG_CACHE_HOME/tuiprof`` (default ``~/.cache/tuiprof``): the caches tuiprof keeps."""
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "tuiprof"


def key_fields(model_def: Any, dtype: str, device_name: str, compile_mode: str,
               torch_version: str | None = None,
               transformers_version: str | None = None) -> dict:
    """The fields a cache directory is keyed by (JSON-able, stable order)."""
    import importlib.metadata

    if torch_version is None:
        import torch

        torch_version = str(torch.__version__)
    if transformers_version is None:
        try:
            transformers_version = importlib.metadata.version("transformers")
        except importlib.metadata.PackageNotFoundError:
            transformers_version = ""
    name = getattr(model_def, "name", None) or (model_def or {}).get("name", "")
    config = getattr(model_def, "config", None)
    if config is None and isinstance(model_def, Mapping):
        config = model_def.get("config", {})
    return {"model": str(name), "config": _jsonable(dict(config or {})), "dtype": str(dtype),
            "torch": torch_version, "transformers": transformers_version or "",
            "device": str(device_name), "compile_mode": str(compile_mode)}


def key_of(fields: Mapping) -> str:
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def prepare(fields: Mapping, base: Path | None = None, keep: int = KEEP,
            max_bytes: int = MAX_BYTES) -> Path | None:
    """The directory for ``fields``, made ready (created, its ``key.json`` checked, marked as
    used now) and the others pruned to the bounds; None when caching is off or impossible
    (read-only home, full disk: inductor's default is used then)."""
    base = root() if base is None else base
    if base is None:
        return None
    key = key_of(fields)
    path = base / key
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        if path.exists() and _stored_key(path) != dict(fields):
            # a directory whose key file is missing, unreadable or says something else (left
            # by an interrupted first use, or edited): start it again rather than trust it
            shutil.rmtree(path, ignore_errors=True)
        path.mkdir(exist_ok=True, mode=0o700)
        os.chmod(path, 0o700)
        key_file = path / KEY_FILE
        if not key_file.exists():
            tmp = path / f".{KEY_FILE}.{os.getpid()}"
            tmp.write_text(json.dumps(dict(fields), sort_keys=True, indent=1, default=str))
            os.replace(tmp, key_file)
        now = time.time()
        os.utime(key_file, (now, now))  # "last used": what pruning orders by
    except OSError:
        return None
    prune(base, keep=keep, max_bytes=max_bytes, spare=path)
    return path


def activate(path: Path | None) -> None:
    """Point inductor and Triton at ``path`` (before the first compile of this process)."""
    if path is None:
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ["TRITON_CACHE_DIR"] = str(path / "triton")


def prune(base: Path, keep: int = KEEP, max_bytes: int = MAX_BYTES,
          spare: Path | None = None) -> list[Path]:
    """Remove the least recently used key directories beyond ``keep`` or ``max_bytes``
    (``spare`` stays whatever it weighs); returns what was removed."""
    try:
        dirs = [p for p in base.iterdir() if p.is_dir() and _KEY_DIR.match(p.name)]
    except OSError:
        return []
    dirs.sort(key=lambda p: (p != spare, -_last_used(p)))  # the one in use counts first
    removed, total, kept = [], 0, 0
    for p in dirs:
        size = dir_bytes(p)
        if p == spare or (kept < keep and total + size <= max_bytes):
            kept += 1
            total += size
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def _stored_key(path: Path) -> dict | None:
    try:
        return json.loads((path / KEY_FILE).read_text())
    except (OSError, ValueError):
        return None


def _last_used(path: Path) -> float:
    try:
        return (path / KEY_FILE).stat().st_mtime
    except OSError:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, sort_keys=True, default=str))
