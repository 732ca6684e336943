"""tuiprof as a user installs it: a wheel built from this tree, installed (not editable) into a
fresh virtual environment, runs ``tuiprof models`` and a headless tiny CPU run from a directory
that is not the checkout. A registry or a stylesheet that only exists beside the sources (not
in the package) fails here, not on a user's machine.

The environment reuses this interpreter's packages (torch, transformers, textual) and installs
nothing from the network (``--no-index --no-deps``). ``--system-site-packages`` alone is not
enough: a venv made by a venv's interpreter sees the *base* interpreter's packages, not that
venv's, and the suite usually runs in a venv (README). So the new environment also gets a .pth
file naming every site-packages directory this interpreter sees."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# What a wheel must carry besides the modules (pyproject.toml's package-data): the stylesheet,
# the snapshot schema, and the native injection library's source and stub header (built on first
# use of `tuiprof run -- ./binary`, so an installed wheel needs them too).
PACKAGE_DATA = ("tuiprof/ui/tuiprof.tcss", "tuiprof/export/snapshot.schema.json",
                "tuiprof/injection/inject.c", "tuiprof/injection/stub/cuda.h")


def test_pyproject_lists_every_package_of_the_tree():
    """The packages are listed by hand (models/ is mapped into the package as
    tuiprof/models_data, which packages.find cannot do): a package added or renamed under
    tuiprof/ must be listed, or the wheel would lack it."""
    tomllib = pytest.importorskip("tomllib")
    setuptools = pytest.importorskip("setuptools")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = set(setuptools.find_packages(where=str(REPO), include=["tuiprof", "tuiprof.*"]))
    listed = set(config["packages"])
    assert listed - {"tuiprof.models_data"} == tree, (
        f"pyproject.toml [tool.setuptools] packages: add {sorted(tree - listed)}, "
        f"remove {sorted(listed - tree - {'tuiprof.models_data'})}")
    assert config["package-dir"] == {"tuiprof.models_data": "models"}


def _run(cmd: list, cwd: Path, env: dict, timeout: float = 240) -> str:
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the tree (a build in place would leave build/ and
    *.egg-info in the checkout)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("tuiprof", "models"):
        shutil.copytree(REPO / name, src / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "--no-index", "-w", out, src], cwd=src, env=env)
    (whl,) = out.glob("tuiprof-*.whl")
    return whl


@pytest.mark.slow
def test_the_wheel_carries_the_registry_and_the_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in PACKAGE_DATA:
        assert path in names, f"{path} missing from {wheel.name}"
    # every file of the package's tree, including those in a folder that is not a package (the
    # followed interpreters' sitecustomize in sessions/boot was missing: a program's processes
    # were not followed from an installed wheel)
    tree = {p.relative_to(REPO).as_posix() for p in (REPO / "tuiprof").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert not tree - names, f"missing from {wheel.name}: {sorted(tree - names)}"
    # the checkout's top-level models/, mapped into the package at build time
    assert not (REPO / "tuiprof" / "models_data").exists()
    models = sorted(p.name for p in (REPO / "models").glob("*.json"))
    assert "qwen3-tiny.json" in models and "qwen3-0.6b.json" in models
    shipped = sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("tuiprof/models_data/"))
    assert shipped == models


def site_dirs() -> list[str]:
    """The site-packages directories this interpreter imports from (its venv's, the base's, any
    a .pth file added), in order; never the checkout (an editable install puts it on the
    path: the wheel is what is tested)."""
    out = []
    for entry in sys.path:
        p = Path(entry or ".").resolve()
        if p.name in ("site-packages", "dist-packages") and p.is_dir() \
                and not p.is_relative_to(REPO) and str(p) not in out:
            out.append(str(p))
    return out


def see_these_packages(py: Path, env: dict) -> None:
    """Make the venv of ``py`` import what this interpreter imports, after its own packages: a
    .pth file (its lines are appended to sys.path; .pth files inside them are not run, so an
    editable install of the checkout stays out)."""
    purelib = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   Path(py).parent, env).strip()
    (Path(purelib) / "_tuiprof_test_parent_site.pth").write_text("\n".join(site_dirs()) + "\n")


@pytest.mark.slow
def test_an_installed_wheel_lists_the_models_and_runs_headless_from_elsewhere(wheel, tmp_path):
    venv = tmp_path / "venv"
    # no pip of its own: this interpreter's pip is visible through the system site-packages
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=120)
    py, exe = venv / "bin" / "python", venv / "bin" / "tuiprof"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TUIPROF_MODELS_DIR", "VIRTUAL_ENV")}
    see_these_packages(py, env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # --force-reinstall: an editable install of the checkout may already be on the system
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall",
          wheel], cwd=elsewhere, env=env)

    where = _run([py, "-c", "import tuiprof; print(tuiprof.__file__)"], elsewhere, env).strip()
    assert Path(where).resolve().is_relative_to(venv.resolve()), where   # the wheel, not the tree

    listed = _run([exe, "models"], elsewhere, env)
    assert "qwen3-0.6b" in listed and "qwen3-tiny" in listed, listed

    snap = elsewhere / "tiny.json"
    _run([exe, "--model", "qwen3-tiny", "--device", "cpu", "--headless", "--max-new-tokens", "4",
          "--no-loop", "--no-nvml", "--no-cupti", "--json", snap], elsewhere, env)
    doc = json.loads(snap.read_text())
    assert doc["meta"]["model"] == "qwen3-tiny"
    assert [t["phase"] for t in doc["tokens"]] == ["prefill"] + ["decode"] * 3
