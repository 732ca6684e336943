"""Build tuiprof's injection library on first use, into a per-user cache.

What it is built against, in this order:

- **CUPTI headers and library**: ``TUIPROF_CUPTI_INCLUDE`` / ``TUIPROF_CUPTI_LIB`` when set;
  else the ``nvidia-cuda-cupti`` package (a dependency of ``cupti-python``, which tuiprof
  depends on), whose wheel ships ``nvidia/cu13/include/cupti*.h`` and ``lib/libcupti.so.13``
  (``nvidia/cuda_cupti/`` in CUDA 12 wheels); else a CUDA toolkit (``CUDA_HOME``,
  ``CUDA_PATH``, ``/usr/local/cuda*``, its ``extras/CUPTI`` too).
- **CUDA driver types** (``cuda.h``, which the wheel lacks): ``stub/cuda.h`` here, a dozen
  handle and enum types whose sizes are the driver ABI's; if a newer CUPTI header names a type
  the stub lacks, a toolkit's ``cuda.h`` is used instead when one is found.
- **Compiler**: ``CC``, else ``gcc``, else ``cc``.

The library is linked against nothing but libc (``libcupti`` is opened at run time, from the
path the session passes), so it always loads in the target and can say why CUPTI did not.
The cache key covers the source, the stub, the CUPTI headers (their directory and version) and
the ``cuda.h`` used, so an upgrade rebuilds; a cached build needs no compiler. A build is
written under a temporary name and renamed, so concurrent sessions never load half a file.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import TuiprofError, safe_text

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "inject.c"
STUB = HERE / "stub"
LIB_NAME = "libtuiprof_inject.so"
HEADER = "cupti_activity.h"


@dataclass(frozen=True)
class Cupti:
    """Where CUPTI's headers and library are, and what provided them."""

    include: Path
    lib: Path
    source: str          # "nvidia-cuda-cupti", "CUDA toolkit <dir>", "TUIPROF_CUPTI_*"
    version: str         # CUPTI_API_VERSION of the headers (e.g. "130500")


@dataclass(frozen=True)
class NativeBuild:
    """A built injection library and what it was built with."""

    path: Path
    cupti: Cupti
    cuda_h: str          # "stub" or the toolkit include directory whose cuda.h was used
    compiler: str


# ------------------------------------------------------------------- finding CUPTI
def _package_roots() -> list[Path]:
    """``nvidia/*`` directories of the installed NVIDIA wheels (no import of any of them)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    roots = []
    for base in spec.submodule_search_locations:
        base = Path(base)
        for sub in ("cu13", "cu12", "cuda_cupti"):
            if (base / sub).is_dir():
                roots.append(base / sub)
    return roots


def _toolkit_roots() -> list[Path]:
    roots: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            roots.append(Path(os.environ[var]))
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    roots.append(Path("/usr/local/cuda"))
    roots.extend(sorted(Path("/usr/local").glob("cuda-*"), reverse=True))
    out: list[Path] = []
    for r in roots:
        for cand in (r, r / "extras" / "CUPTI"):
            if cand not in out and cand.is_dir():
                out.append(cand)
    return out


def _libcupti(root: Path) -> Path | None:
    for sub in ("lib", "lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
        d = root / sub
        if not d.is_dir():
            continue
        found = sorted(d.glob("libcupti.so*"), key=lambda p: (len(p.name), p.name))
        if found:
            return found[0]
    return None


def _version(include: Path) -> str:
    try:
        text = (include / "cupti_version.h").read_text(errors="replace")
    except OSError:
        return "?"
    m = re.search(r"#define\s+CUPTI_API_VERSION\s+(\d+)", text)
    return m.group(1) if m else "?"


def find_cupti() -> Cupti:
    """CUPTI's headers and library, or a one-line :class:`TuiprofError` saying what to install."""
    inc, lib = os.environ.get("TUIPROF_CUPTI_INCLUDE"), os.environ.get("TUIPROF_CUPTI_LIB")
    cands: list[tuple[Path, str]] = [(r, "nvidia-cuda-cupti") for r in _package_roots()]
    cands += [(r, f"CUDA toolkit {r}") for r in _toolkit_roots()]
    include = Path(inc) if inc else next((r / "include" for r, _ in cands
                                          if (r / "include" / HEADER).is_file()), None)
    if include is None or not (include / HEADER).is_file():
        raise TuiprofError("no CUPTI headers (cupti_activity.h) found: tuiprof builds its "
                           "injection library against them; pip install nvidia-cuda-cupti (or "
                           "set TUIPROF_CUPTI_INCLUDE to a CUPTI include directory)")
    if lib:
        lib_path: Path | None = Path(lib)
        source = "TUIPROF_CUPTI_LIB"
    else:  # the library beside the headers first: the same CUPTI version
        root = include.parent
        lib_path = _libcupti(root) or next((p for p in (_libcupti(r) for r, _ in cands) if p),
                                           None)
        source = next((s for r, s in cands if r == root), "TUIPROF_CUPTI_INCLUDE" if inc else "?")
    if lib_path is None or not lib_path.is_file():
        raise TuiprofError("no libcupti found for the CUPTI headers in "
                           f"{safe_text(include, 120)}: pip install nvidia-cuda-cupti (or set "
                           "TUIPROF_CUPTI_LIB to libcupti.so)")
    return Cupti(include, lib_path, source, _version(include))


def _toolkit_cuda_h() -> Path | None:
    for r in _toolkit_roots():
        if (r / "include" / "cuda.h").is_file():
            return r / "include"
    return None


def find_compiler() -> str:
    for name in (os.environ.get("CC"), "gcc", "cc"):
        if name:
            path = shutil.which(name)
            if path:
                return path
    raise TuiprofError("no C compiler found (gcc or cc, or CC): tuiprof compiles its CUDA "
                       "injection library on first use; install one (apt-get install gcc)")


# --------------------------------------------------------------------- building
def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = Path(base) / "tuiprof" / "native"
    try:
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    d = Path(tempfile.gettempdir()) / f"tuiprof-{os.getuid()}" / "native"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def _key(cupti: Cupti, cuda_h: str) -> str:
    """The cache entry: the source, the stub, the headers and the cuda.h used (not the
    compiler: a library built once serves where no compiler is left)."""
    h = hashlib.sha256()
    for f in (SOURCE, STUB / "cuda.h", STUB / "builtin_types.h"):
        h.update(f.read_bytes())
    for part in (str(cupti.include), cupti.version, cuda_h):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def _compile(compiler: str, includes: list[Path], out: Path) -> subprocess.CompletedProcess:
    cmd = [compiler, "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-o", str(out),
           str(SOURCE), *(f"-I{d}" for d in includes), "-ldl", "-lpthread"]
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=120)


def build(force: bool = False, cuda_h: str = "auto") -> NativeBuild:
    """The injection library, compiled now if the cache has none for these CUPTI headers.

    ``cuda_h``: ``auto`` (the stub, then a toolkit's cuda.h if the stub does not compile),
    ``stub`` or ``toolkit``. Raises a one-line :class:`TuiprofError` on any failure."""
    cupti = find_cupti()
    toolkit = _toolkit_cuda_h()
    tries: list[tuple[str, list[Path]]] = []
    if cuda_h in ("auto", "stub"):
        tries.append(("stub", [STUB, cupti.include]))
    if cuda_h in ("auto", "toolkit") and toolkit is not None:
        tries.append((str(toolkit), [cupti.include, toolkit]))  # CUPTI's own headers first
    if not tries:
        raise TuiprofError("no CUDA toolkit cuda.h found (asked for cuda_h=toolkit)")
    for which, _ in tries:
        target = cache_dir() / _key(cupti, which) / LIB_NAME
        if target.is_file() and not force:
            return NativeBuild(target, cupti, which, _built_with(target))
    compiler = find_compiler()
    errors = []
    for which, includes in tries:
        target = cache_dir() / _key(cupti, which) / LIB_NAME
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            res = _compile(compiler, includes, Path(tmp))
        except (OSError, subprocess.SubprocessError) as exc:
            os.unlink(tmp)
            raise TuiprofError(f"could not run the C compiler {compiler}: {exc}") from None
        if res.returncode == 0:
            os.replace(tmp, target)
            (target.parent / "build.json").write_text(json.dumps({
                "cupti_include": str(cupti.include), "cupti_lib": str(cupti.lib),
                "cupti_source": cupti.source, "cupti_version": cupti.version,
                "cuda_h": which, "compiler": compiler}, indent=1))
            return NativeBuild(target, cupti, which, compiler)
        os.unlink(tmp)
        log = target.parent / "build-error.log"
        log.write_text(res.stderr)
        first = next((ln for ln in res.stderr.splitlines() if "error" in ln), "")
        errors.append((first or res.stderr.strip()[:200], log))
    first, log = errors[-1]
    raise TuiprofError(f"building tuiprof's injection library failed ({safe_text(first, 160)}); "
                       f"the compiler's output is in {log}")


def _built_with(target: Path) -> str:
    try:
        return str(json.loads((target.parent / "build.json").read_text()).get("compiler", "?"))
    except (OSError, ValueError, AttributeError):
        return "?"


# ------------------------------------------------------------------ API callback ids
@lru_cache(maxsize=4)
def callback_ids(include: Path) -> dict[tuple[int, str], int]:
    """``(domain, name) -> cbid`` from the headers' ``cupti_runtime_cbid.h`` (domain 2) and
    ``cupti_driver_cbid.h`` (domain 1): names as cupti-python spells them
    (``cudaLaunchKernel_v7000``, ``cuLaunchKernel``)."""
    out: dict[tuple[int, str], int] = {}
    for domain, fname, prefix in ((2, "cupti_runtime_cbid.h", "CUPTI_RUNTIME_TRACE_CBID_"),
                                  (1, "cupti_driver_cbid.h", "CUPTI_DRIVER_TRACE_CBID_")):
        try:
            text = (include / fname).read_text(errors="replace")
        except OSError:
            continue
        for name, num in re.findall(rf"\b{prefix}(\w+)\s*=\s*(\d+)", text):
            if name not in ("INVALID", "SIZE", "FORCE_INT"):
                out[(domain, name)] = int(num)
    return out
