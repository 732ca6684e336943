"""Importing transformers' model code for the built-in engine, without what it does not use.

``from transformers import Qwen3ForCausalLM`` pulls in optional packages that transformers
imports only because they are installed: scikit-learn (``generation.candidate_generator``
imports ``sklearn.metrics`` for assisted decoding's confidence threshold, and sklearn pulls in
most of scipy), scipy (the object-detection losses' Hungarian matching), torchvision and
torchaudio (image and audio processing) and accelerate (``device_map`` loading). The engine's
session process never runs assisted decoding, a detection loss, an image or audio processor or
a ``device_map`` load (it builds its models and reads their weights itself), so those
packages are hidden while transformers is imported: ``importlib.util.find_spec``
(transformers' probe) then finds nothing and the guarded imports are skipped. The model's modules and forward are transformers'
own, unchanged (the tests compare weights and logits against a build through the plain
import). The packages are hidden for the duration of the import only; a later ``import scipy``
in the same process works as usual.

A user's program under ``tuiprof run`` runs in its own process and never goes through here.

``TUIPROF_IMPORTS`` selects the ways, for A/B measurements (``bench/verify/startup_ab.py``): a
comma-separated subset of :data:`WAYS`, ``all`` (the default: :data:`DEFAULT_WAYS`) or
``none`` (the plain import, as before).
"""
from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterable, Iterator

#: Packages transformers imports only when installed, that the built-in engine never uses:
#: also torchvision and torchaudio (image and audio processing: ``image_utils``,
#: ``audio_utils``) and accelerate (``device_map`` loading; the engine builds its models and
#: reads their weights itself): about a second of a first start on the GPU machine.
PROBED_ONLY = ("sklearn", "scipy", "torchvision", "torchaudio", "accelerate")

#: ``hide``: hide :data:`PROBED_ONLY` during the import; ``direct``: import the family's
#: modelling module (``transformers.models.qwen3.modeling_qwen3``) rather than through the
#: package's lazy ``__getattr__``; ``cuda-thread``: run ``torch.cuda.init()`` on the context
#: thread too, beside the import; ``warm-blas``: run the prefill's matrix shapes once on that
#: thread (cuBLAS/cuBLASLt handles, heuristics, kernel modules) while transformers imports;
#: ``structure``: transformers' table of its lazy modules read from tuiprof's cache rather than
#: parsed from every model's source (:mod:`tuiprof.engine.import_structure`).
WAYS = ("hide", "direct", "cuda-thread", "warm-blas", "structure")
DEFAULT_WAYS = ("hide", "direct", "cuda-thread", "warm-blas", "structure")
ENV = "TUIPROF_IMPORTS"

_lock = threading.Lock()


def ways() -> frozenset[str]:
    """The ways in force (``TUIPROF_IMPORTS``; unknown names are ignored)."""
    raw = os.environ.get(ENV, "all").strip().lower()
    if raw in ("", "all", "default"):
        return frozenset(DEFAULT_WAYS)
    if raw in ("none", "0", "off", "plain"):
        return frozenset()
    return frozenset(w.strip() for w in raw.split(",") if w.strip() in WAYS)


def on(way: str) -> bool:
    return way in ways()


@contextmanager
def hidden(names: Iterable[str]) -> Iterator[list[str]]:
    """Make ``names`` look absent (``find_spec`` answers None, ``import`` fails) inside the
    block; a package already imported stays as it is. Yields the names actually hidden."""
    with _lock:
        hid = [n for n in names if n not in sys.modules]
        for n in hid:
            sys.modules[n] = None  # type: ignore[assignment]  # the import system's "absent"
    try:
        yield hid
    finally:
        with _lock:
            for n in hid:
                if n in sys.modules and sys.modules[n] is None:
                    del sys.modules[n]


@contextmanager
def kept_structure(w: frozenset[str] | None = None) -> Iterator[bool]:
    """transformers imported inside the block reads its import structure from tuiprof's cache
    (way ``structure``); yields whether the cache is in use."""
    from . import import_structure

    on = "structure" in (ways() if w is None else w) and import_structure.install()
    try:
        yield on
    finally:
        import_structure.remove()


def import_model_classes(family: str) -> tuple[type, type]:
    """``(ConfigClass, ForCausalLMClass)`` of a transformers family (``qwen3``), imported the
    ways in force (:func:`ways`)."""
    w = ways()
    names = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}[family]
    # Once transformers is imported its probes may have answered (some are cached): hiding a
    # package then would only break the import that the probe allows.
    hide = "hide" in w and "transformers" not in sys.modules
    with hidden(PROBED_ONLY if hide else ()), kept_structure(w):
        if "direct" in w:
            import importlib

            config_mod = importlib.import_module(
                f"transformers.models.{family}.configuration_{family}")
            model_mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
            return getattr(config_mod, names[0]), getattr(model_mod, names[1])
        import transformers

        return getattr(transformers, names[0]), getattr(transformers, names[1])
