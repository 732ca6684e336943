"""Kernel names for exports: GNU-demangled full name, base name, and a category.

nsys prints names from NVIDIA's demangler (``cu++filt``); tuiprof uses GNU ``__cxa_demangle``
through :mod:`cxxfilt`, so the same kernel reads ``float const*`` instead of ``const float *``,
``(anonymous namespace)`` instead of ``<unnamed>``, ``{lambda()#1}`` instead of
``[lambda() (instance 1)]``, ``8`` instead of ``(int)8`` and ``std::array<char*, 2ul> >``
instead of ``std::array<char *, (unsigned long)2>>`` (see docs/exports.md).
Names that are not mangled (``nvjet_…``, Triton and cuDNN kernels) pass through unchanged.

When ``tuiprof.analysis`` is importable its ``KernelInfo`` (short name, category) is used for
the UI-facing pieces (diff); the nsys-style exports always use :func:`demangle` so that their
names do not depend on the analysis version.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from ..analysis.demangle import base_name as _qualified_base_name
from ..analysis.demangle import demangle  # one demangler for the UI, analysis and exports




@lru_cache(maxsize=65536)
def base_name(demangled: str) -> str:
    """Function name without return type, namespaces, template arguments or parameters.

    ``void at::native::vectorized_elementwise_kernel<8, …>(int, …)`` gives
    ``vectorized_elementwise_kernel`` (what nsys stores as ``shortName``).
    """
    qualified = _qualified_base_name(demangled)
    return qualified.rsplit("::", 1)[-1].strip() or demangled


_CATEGORIES = (
    ("communication", re.compile(r"^nccl|ncclDevKernel|ncclKernel", re.I)),
    ("attention", re.compile(r"flash|fmha|sdpa|attention|attn", re.I)),
    ("gemm", re.compile(r"nvjet|gemm|cutlass|cublas|splitkreduce|matmul|gemv|wgmma|_mm_|bmm", re.I)),
    ("norm", re.compile(r"norm|rsqrt", re.I)),
    ("reduction", re.compile(r"reduce|argmax|softmax|topk|sort", re.I)),
    ("copy", re.compile(r"copy|cat_?array|catarray|index|gather|scatter|fill", re.I)),
    ("elementwise", re.compile(r"elementwise|triton_poi|vectorized|unrolled", re.I)),
)


def _fallback_category(raw: str, demangled: str) -> str:
    text = base_name(demangled) if demangled.startswith(("void ", "_Z")) else demangled
    for cat, pat in _CATEGORIES:
        if pat.search(text) or pat.search(demangled[:200]):
            return cat
    return "other"


def _analysis_info(raw: str) -> Any:
    """``KernelInfo`` from ``tuiprof.analysis`` when it is there, else ``None``."""
    try:
        from .. import analysis as _an  # noqa: PLC0415 - optional, lands separately
    except Exception:
        return None
    for attr in ("kernel_info", "name_kernel", "classify_kernel", "kernel_name_info"):
        fn = getattr(_an, attr, None)
        if callable(fn):
            try:
                return fn(raw)
            except Exception:
                return None
    return None


@lru_cache(maxsize=65536)
def kernel_label(raw: str) -> tuple[str, str]:
    """(short display name, category) for the UI-facing exports (diff)."""
    info = _analysis_info(raw)
    if info is not None:
        short = getattr(info, "short", None)
        cat = getattr(info, "category", None)
        if isinstance(short, str) and short and isinstance(cat, str) and cat:
            return short, cat
    dem = demangle(raw)
    return base_name(dem), _fallback_category(raw, dem)
