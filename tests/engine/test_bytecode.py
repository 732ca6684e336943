"""The engine's own bytecode cache (tuiprof/engine/bytecode.py), in fresh interpreters.

A package installed without bytecode, in an environment that forbids writing it
(PYTHONDONTWRITEBYTECODE=1), is compiled from source at every start; with ``keep`` the second
start loads it from tuiprof's tree and compiles nothing, and nothing is written beside the
sources."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuiprof.engine import bytecode
from tuiprof.engine.compile_cache import dir_bytes

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import importlib.machinery, json, os, sys
compiled = []
orig = importlib.machinery.SourceFileLoader.source_to_code
def counting(self, data, path, *a, **k):
    compiled.append(os.path.basename(os.path.dirname(path)) + "/" + os.path.basename(path))
    return orig(self, data, path, *a, **k)
importlib.machinery.SourceFileLoader.source_to_code = counting
from tuiprof.engine import bytecode
kept = bytecode.keep("probepkg") if sys.argv[1] == "keep" else None
import probepkg.sub
print(json.dumps({"kept": kept, "compiled": [c for c in compiled if "probepkg" in c],
                  "prefix": sys.pycache_prefix,
                  "env_prefix": os.environ.get("PYTHONPYCACHEPREFIX"),
                  "env_dont_write": os.environ.get("PYTHONDONTWRITEBYTECODE"),
                  "value": probepkg.sub.VALUE}))
"""


def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "probepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("A = 1\n")
    (pkg / "sub.py").write_text("from . import A\nVALUE = A + 41\n")
    return pkg


def _run(tmp_path: Path, mode: str, **env_over: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{REPO}",
               TUIPROF_PYCACHE=str(tmp_path / "cache"))
    for k, v in env_over.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    out = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_start_compiles_nothing(tmp_path):
    pkg = _package(tmp_path)
    first = _run(tmp_path, "keep")
    assert first["kept"] == str(tmp_path / "cache")
    assert sorted(first["compiled"]) == ["probepkg/__init__.py", "probepkg/sub.py"]
    second = _run(tmp_path, "keep")
    assert second["compiled"] == []            # loaded from the tree
    assert second["value"] == 42
    assert not (pkg / "__pycache__").exists()  # nothing beside the sources
    assert list((tmp_path / "cache").rglob("sub.*.pyc"))
    # what the engine's children inherit: the tree, and leave to write it
    assert second["env_prefix"] == str(tmp_path / "cache")
    assert second["env_dont_write"] is None


def test_without_it_every_start_compiles(tmp_path):
    _package(tmp_path)
    for _ in range(2):
        run = _run(tmp_path, "plain")
        assert len(run["compiled"]) == 2
        assert run["prefix"] is None
    assert not (tmp_path / "cache").exists()


def test_an_edited_source_is_compiled_again(tmp_path):
    pkg = _package(tmp_path)
    _run(tmp_path, "keep")
    (pkg / "sub.py").write_text("from . import A\nVALUE = A + 99\n")
    os.utime(pkg / "sub.py", (1, 1))  # another mtime, whatever the clock's resolution
    run = _run(tmp_path, "keep")
    assert run["compiled"] == ["probepkg/sub.py"]
    assert run["value"] == 100


@pytest.mark.parametrize("case", ["bytecode-present", "writable", "off", "user-prefix"])
def test_left_alone(tmp_path, case):
    pkg = _package(tmp_path)
    over = {}
    if case == "bytecode-present":
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(pkg)], check=True)
    elif case == "writable":
        over["PYTHONDONTWRITEBYTECODE"] = None  # Python writes __pycache__ itself
    elif case == "off":
        over["TUIPROF_PYCACHE"] = "off"
    else:
        over["PYTHONPYCACHEPREFIX"] = str(tmp_path / "users")
    run = _run(tmp_path, "keep", **over)
    assert run["kept"] is None
    assert not (tmp_path / "cache").exists()


def test_tree_over_its_bound_is_emptied(tmp_path):
    where = tmp_path / "cache"
    (where / "usr" / "lib").mkdir(parents=True)
    (where / "usr" / "lib" / "x.cpython-312.pyc").write_bytes(b"0" * 100)
    (where / bytecode.SIZE_FILE).write_text(str(bytecode.MAX_BYTES + 1))
    bytecode._bound(where)
    assert list(where.iterdir()) == []
    (where / "a").mkdir()
    (where / "a" / "b.pyc").write_bytes(b"0" * 100)
    (where / bytecode.SIZE_FILE).write_text("100")
    bytecode._bound(where)                      # within the bound: kept
    assert (where / "a" / "b.pyc").exists()
    assert dir_bytes(where) == 103               # the pyc and the 3-byte size file


def test_a_damaged_file_in_the_tree_is_compiled_again(tmp_path):
    """A truncated or foreign .pyc in the tree (a full disk, another Python) costs a compile,
    never a failed import."""
    _package(tmp_path)
    _run(tmp_path, "keep")
    (pyc,) = list((tmp_path / "cache").rglob("sub.*.pyc"))
    pyc.write_bytes(b"\x00\x01garbage")
    run = _run(tmp_path, "keep")
    assert run["compiled"] == ["probepkg/sub.py"]
    assert run["value"] == 42


BUILD_WITH_TREE = r"""
import json, os, sys
from tuiprof.engine import bytecode
kept = bytecode.keep("probepkg")  # a package without bytecode: the tree from here on
import torch
from safetensors.torch import save_file
from tuiprof.engine.load import load_model, prompt_ids

loaded = load_model("qwen3-tiny", device="cpu", dtype="float32", seed=5, max_len=48)
ids, _ = prompt_ids(loaded, None, 12, seed=5, batch=2)
with torch.no_grad():
    logits = loaded.adapter.forward(ids)
tensors = {k: v.contiguous().clone() for k, v in loaded.adapter.model.state_dict().items()}
tensors["__logits"] = logits.contiguous()
save_file(tensors, sys.argv[1])
import transformers.models.qwen3.modeling_qwen3 as mq
print(json.dumps({"kept": kept, "torch_cached": torch.__spec__.cached,
                  "qwen3_cached": mq.__spec__.cached}))
"""


def test_the_model_built_through_the_tree_is_the_same(tmp_path):
    """qwen3-tiny built with torch's and transformers' bytecode from tuiprof's tree (first
    start: compiled into it; second: loaded from it) has the same weights and logits as the
    plain build."""
    from safetensors.torch import load_file
    import torch

    _package(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{REPO}",
               TUIPROF_PYCACHE=str(tmp_path / "cache"))
    builds, infos = [], []
    for name, code in (("plain", BUILD_WITH_TREE.replace('bytecode.keep("probepkg")', "None")),
                       ("fill", BUILD_WITH_TREE), ("from-tree", BUILD_WITH_TREE)):
        out = tmp_path / f"{name}.safetensors"
        r = subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        builds.append(load_file(str(out)))
        infos.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert infos[0]["kept"] is None and infos[2]["kept"] == str(tmp_path / "cache")
    for info in infos[1:]:  # torch's and the model code's bytecode came from the tree
        assert info["torch_cached"].startswith(str(tmp_path / "cache"))
        assert info["qwen3_cached"].startswith(str(tmp_path / "cache"))
        assert os.path.exists(info["qwen3_cached"])
    for other in builds[1:]:
        assert builds[0].keys() == other.keys()
        for key, t in builds[0].items():
            assert torch.equal(t, other[key]), key


def test_tuiprofs_own_modules_keep_their_bytecode_where_torch_has_none_either(tmp_path):
    """tuiprof from a checkout without bytecode, beside a package without any (torch, in an
    image built so), where Python may write none: ``keep_own`` (what ``python -m tuiprof`` calls
    first) keeps tuiprof's own modules' bytecode in the tree, and nothing beside the sources;
    where the package has its bytecode, nothing changes."""
    import shutil

    _package(tmp_path)
    src = tmp_path / "src"
    shutil.copytree(REPO / "tuiprof", src / "tuiprof",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    code = ("import json, sys\n"
            "from tuiprof.engine import bytecode\n"
            "kept = bytecode.keep_own(['--help'], probes=('tuiprof', 'probepkg'))\n"
            "import tuiprof.cli.run\n"
            "print(json.dumps({'kept': kept, 'prefix': sys.pycache_prefix}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONDONTWRITEBYTECODE="1", TUIPROF_PYCACHE=str(tmp_path / "tree"),
               PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{src}")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["kept"] == out["prefix"] == str(tmp_path / "tree")
    kept = {p.name.split(".")[0] for p in (tmp_path / "tree").rglob("*.pyc")
            if "tuiprof" in p.parts and "cli" in p.parts}
    assert {"__init__", "run", "common"} <= kept, sorted(kept)
    assert not list(src.rglob("__pycache__"))          # nothing beside the sources
    # the package with its bytecode (its own __pycache__): the tree would add nothing
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tmp_path / "site")],
                   check=True, env={**env, "PYTHONDONTWRITEBYTECODE": ""}, timeout=120)
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"kept": None, "prefix": None}
    # a command that runs a user's program is left alone
    assert bytecode.keep_own(["run", "--", "python", "x.py"]) is None
