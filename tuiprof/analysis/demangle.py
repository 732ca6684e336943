"""Demangling of CUDA kernel names (Itanium C++ ABI) with a cache.

Called once per distinct kernel name, never per record: :func:`demangle` is memoised.
"""
from __future__ import annotations

from functools import lru_cache

try:  # cxxfilt wraps abi::__cxa_demangle from libstdc++
    import cxxfilt as _cxxfilt
except Exception:  # pragma: no cover - missing or broken libstdc++
    _cxxfilt = None

__all__ = ["demangle", "base_name"]


@lru_cache(maxsize=8192)
def demangle(raw: str) -> str:
    """The demangled name of ``raw``; ``raw`` itself when it is not mangled or fails."""
    if not raw.startswith("_Z") or _cxxfilt is None:
        return raw
    try:
        out = _cxxfilt.demangle(raw)
    except Exception:
        return raw
    return out or raw


def base_name(demangled: str) -> str:
    """The qualified function name without return type, template arguments or parameters.

    ``void at::native::reduce_kernel<512, 1, ...>(...)`` -> ``at::native::reduce_kernel``.
    """
    out: list[str] = []
    depth = 0
    for ch in demangled.replace("(anonymous namespace)", "{anon}"):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    name = "".join(out).strip()
    if " " in name:  # return type ("void ...")
        name = name.rsplit(" ", 1)[-1]
    return name.replace("{anon}::", "")
