"""Dynamo's result kept across processes: the compiled decode step saved after its first compile
and loaded by the next session of the same model, so that `c` on a warm machine skips dynamo's
trace (most of a warm compile: inductor's part already comes from its persistent cache).

torch's ahead-of-time compile (``torch.compile(fn, fullgraph=True).aot_compile(...)``, saved with
``save_compiled_function`` and read back by ``torch.compiler.load_compiled_function``) holds the
traced bytecode, its guards and inductor's compiled graph. One file per graph of the step (batch
1 has a static graph of its own; every batch >= 2 shares one, its batch dimension dynamic)::

    <the model's inductor cache directory>/precompiled/<graph>-<key>.bin

The directory is the one :mod:`tuiprof.engine.compile_cache` keys by model, configuration,
dtype, torch, transformers, device name and compile mode (bounded with it); ``<key>`` adds what
a file also depends on: the graph, the cache's length and the prompt's, the adapter's class, the
torch and Python versions (pickled bytecode is the interpreter's own) and :data:`FORMAT`. At
most :data:`KEEP` files a directory, the least recently used removed first.

torch 2.11 has the API but gives ``torch.compile``'s result its ``aot_compile`` only while
``torch._dynamo.config.enable_aot_compile`` is on (off by default there, on from 2.12): the
compile here turns it on for its own call.

A file that does not load (truncated, written by another torch, its guards refused for these
inputs) is removed, the session says so in one line and compiles afresh (which saves a new
one). A step that cannot be compiled whole (a graph break) or saved keeps the ordinary compile,
and a marker file says so, so that later sessions do not try again. The weights are read from
the model at every call, never kept in the file. ``TUIPROF_PRECOMPILE=off`` turns it off.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from ..errors import one_line

ENV = "TUIPROF_PRECOMPILE"
DIR = "precompiled"
KEEP = 16
NOT_WHOLE = ".not-whole"   # suffix of a marker: this graph cannot be compiled ahead of time
# in every key: raised when what an earlier tuiprof wrote must not be trusted (its markers said
# "cannot be compiled ahead of time" on torch 2.11 only because the switch below was off)
FORMAT = 2


def supported() -> bool:
    """This torch saves and loads a compiled function, and the switch is on."""
    if os.environ.get(ENV, "").strip().lower() in ("off", "0", "no", "false"):
        return False
    try:
        import torch
    except Exception:
        return False
    return hasattr(getattr(torch, "compiler", None), "load_compiled_function")


def preimport() -> None:
    """Import what loading a saved step (or compiling from the warm cache) needs: inductor's
    compile path and its code cache (with triton on CUDA), about a second on the GPU machine.
    Called on a thread of its own when a warm compile is likely; errors are the compile's to
    report, not this."""
    try:
        import torch._dynamo.aot_compile  # noqa: F401
        import torch._inductor.codecache  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
    except Exception:
        pass


def graph_of(batch: int) -> str:
    """The step's graph a batch runs: batch 1's own, or the one every batch >= 2 shares."""
    return "b1" if batch == 1 else "dyn"


class PrecompiledSteps:
    """The saved compiled steps of one model's cache directory, for one engine's shapes."""

    def __init__(self, cache_dir: Path, fields: dict, keep: int = KEEP) -> None:
        self.dir = Path(cache_dir) / DIR
        self.fields = dict(fields)
        self.keep = keep

    def path(self, graph: str) -> Path:
        import torch

        blob = json.dumps({**self.fields, "graph": graph, "format": FORMAT,
                           "torch": str(torch.__version__),
                           "python": sys.version.split()[0]}, sort_keys=True, default=str)
        return self.dir / f"{graph}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}.bin"

    # ----------------------------------------------------------------- loading
    def load(self, graph: str, bind: Any, args: tuple,
             options: dict | None = None) -> tuple[Callable | None, str]:
        """The saved step of ``graph`` as a callable of the step's arguments (``bind`` first:
        the adapter whose method was compiled), checked against ``args``; (None, "") when none
        is saved, (None, one line) when the file was unusable (then removed). ``options``: the
        compile's (:func:`mode_options`), in force while it loads: inductor decides there
        whether the loaded graph records CUDA graphs (``reduce-overhead``), from its config."""
        path = self.path(graph)
        if not path.exists():
            return None, ""
        try:
            import torch

            config = {k: v for k, v in (options or {}).items() if k != "guard_filter_fn"}
            with open(path, "rb") as fh, torch._inductor.config.patch(config):
                fn = torch.compiler.load_compiled_function(fh)
            check = getattr(fn, "guard_check", None)
            if check is not None and not check(bind, *args):
                raise ValueError("its guards refuse this model's inputs")
            off = getattr(fn, "disable_guard_check", None)
            if off is not None:   # checked once here; the engine calls it with these shapes
                off()
        except Exception as exc:  # stale, corrupt, another torch: a fresh compile instead
            _remove(path)
            return None, (f"saved compiled step unusable ({type(exc).__name__}: "
                          f"{one_line(exc, 100)}); compiling afresh")
        try:
            os.utime(path)        # "last used": what pruning orders by
        except OSError:
            pass
        return _Bound(fn, bind), ""

    def discard(self, graph: str, exc: BaseException) -> str:
        """The step of ``graph`` failed at its first call: its file goes, a marker stops later
        sessions trying again (the ordinary compile then); one line saying so."""
        _remove(self.path(graph))
        self._mark(self.path(graph).with_suffix(NOT_WHOLE), exc)
        return (f"compiled step ahead of time failed ({type(exc).__name__}: "
                f"{one_line(exc, 90)}); compiling as before")

    # --------------------------------------------------------------- compiling
    def whole_refused(self, graph: str) -> bool:
        """An earlier session found this graph cannot be compiled whole (a graph break)."""
        return self.path(graph).with_suffix(NOT_WHOLE).exists()

    def compile(self, graph: str, method: Callable, bind: Any, args: tuple,
                options: dict) -> tuple[Callable | None, str]:
        """Compile ``method`` (bound to ``bind``) whole for ``args`` ahead of time and save it;
        returns (the callable, "") or (None, why not): the caller compiles as before then."""
        import torch

        path = self.path(graph)
        try:
            with _aot_enabled(torch):
                compiled = torch.compile(method, fullgraph=True, options=options)
            aot = compiled.aot_compile((args, {}))
        except Exception as exc:  # a graph break, or a step dynamo cannot package
            self._mark(path.with_suffix(NOT_WHOLE), exc)
            return None, f"not compiled ahead of time ({type(exc).__name__}: {one_line(exc, 90)})"
        note = self.save(path, aot)
        return _Bound(aot, bind), note

    def save(self, path: Path, aot: Any) -> str:
        """Write ``aot`` to ``path`` whole or not at all; "" or one line saying why not."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            aot.save_compiled_function(str(tmp))
            os.replace(tmp, path)
        except Exception as exc:
            _remove(path.with_name(f".{path.name}.{os.getpid()}"))
            return f"compiled step not saved ({type(exc).__name__}: {one_line(exc, 90)})"
        self.prune()
        return ""

    def prune(self) -> list[Path]:
        """Keep the :attr:`keep` files used last; returns what was removed."""
        try:
            files = sorted((p for p in self.dir.iterdir() if p.suffix == ".bin"),
                           key=lambda p: -_mtime(p))
        except OSError:
            return []
        for p in files[self.keep:]:
            _remove(p)
        return files[self.keep:]

    def _mark(self, marker: Path, exc: BaseException) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            marker.write_text(f"{type(exc).__name__}: {one_line(exc, 200)}\n")
        except OSError:
            pass


class _Bound:
    """A compiled step called as the engine calls its step: ``fn(bind, *args)``."""

    __slots__ = ("fn", "bind")

    def __init__(self, fn: Callable, bind: Any) -> None:
        self.fn, self.bind = fn, bind

    def __call__(self, *args: Any) -> Any:
        return self.fn(self.bind, *args)


def mode_options(mode: str | None) -> dict:
    """inductor's options for a ``torch.compile`` mode (``torch.compile`` takes a mode or
    options, not both) and the guards a saved step keeps: those that can be written to a file
    and checked in another process (tensors' shapes, dtypes and devices)."""
    import torch

    opts = dict(torch._inductor.list_mode_options(mode or "default"))
    opts["guard_filter_fn"] = portable_guards
    return opts


def portable_guards(entries: Any) -> list[bool]:
    """The guards a saved step keeps (``torch.compiler.keep_portable_guards_unsafe``'s rule,
    here for the torch versions that lack it): global state (grad mode, autocast), dynamic
    shapes and the inputs' tensors (shape, dtype, device, strides); not the identity of
    objects (the model, its modules), which no other process shares."""
    kinds = [(getattr(g, "guard_type", ""), getattr(g, "is_global", True)) for g in entries]
    return [kind in ("GLOBAL_STATE", "SHAPE_ENV") or (kind == "TENSOR_MATCH" and not glob)
            for kind, glob in kinds]


def _aot_enabled(torch: Any):
    """``torch.compile`` gives its result ``aot_compile`` only while dynamo's
    ``enable_aot_compile`` is on: off by default in torch 2.11 (the wrapper then has no such
    method), on in later versions, absent in earlier ones."""
    from contextlib import nullcontext

    config = torch._dynamo.config
    if not hasattr(config, "enable_aot_compile"):
        return nullcontext()
    return config.patch(enable_aot_compile=True)


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _remove(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass
