"""The slimmer import of transformers' Qwen3 code (:mod:`tuiprof.engine.imports`) builds the
same model: the same weights and the same logits for the same seed as the plain
``from transformers import Qwen3ForCausalLM``, each built in a fresh process (the imports are
per process), and it leaves the probed-only packages out of the session process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tuiprof.engine import imports

BUILD = """
import json, sys
import torch
from safetensors.torch import save_file
from tuiprof.engine.load import load_model, prompt_ids

loaded = load_model("qwen3-tiny", device="cpu", dtype="float32", seed=5, max_len=48)
model = loaded.adapter.model
ids, _ = prompt_ids(loaded, None, 12, seed=5, batch=2)
with torch.no_grad():
    prefill = loaded.adapter.prefill(ids, loaded.adapter.new_cache(2))
    full = loaded.adapter.forward(ids)
tensors = {k: v.contiguous().clone() for k, v in model.state_dict().items()}
tensors["__prefill_logits"] = prefill.contiguous()
tensors["__full_logits"] = full.contiguous()
save_file(tensors, sys.argv[1])
from tuiprof.engine.imports import PROBED_ONLY
print(json.dumps({"loaded": [m for m in PROBED_ONLY if m in sys.modules],
                  "cls": f"{type(model).__module__}.{type(model).__qualname__}"}))
"""


def _build(tmp_path: Path, way: str) -> tuple[dict, dict]:
    out = tmp_path / f"{way}.safetensors"
    env = dict(os.environ, TUIPROF_IMPORTS=way)
    r = subprocess.run([sys.executable, "-c", BUILD, str(out)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return load_file(str(out)), json.loads(r.stdout.strip().splitlines()[-1])


def test_the_slim_import_builds_the_same_weights_and_logits_as_the_plain_one(tmp_path):
    old, old_info = _build(tmp_path, "none")
    new, new_info = _build(tmp_path, "all")
    assert old.keys() == new.keys()
    for key, t in old.items():
        assert torch.equal(t, new[key]), key
    assert old_info["cls"] == new_info["cls"] == (
        "transformers.models.qwen3.modeling_qwen3.Qwen3ForCausalLM")
    assert new_info["loaded"] == []         # kept out of the session process
    # where scipy is installed, transformers' plain import brings it in (its detection losses)
    installed = [m for m in imports.PROBED_ONLY if _installed(m)]
    if installed:
        assert old_info["loaded"], "the plain import no longer brings in any probed-only package"


def _installed(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:
        return True


def test_hidden_packages_come_back_after_the_import():
    code = ("import importlib.util, sys\n"
            "import json\n"
            "from tuiprof.engine.imports import hidden\n"
            "with hidden(['json', 'colorsys']) as hid:\n"
            "    inside = importlib.util.find_spec('colorsys')\n"
            "    try:\n"
            "        import colorsys\n"
            "        failed = False\n"
            "    except ImportError:\n"
            "        failed = True\n"
            "import colorsys\n"
            "print(hid, inside, failed, colorsys.__name__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # json was imported already: left as it is
    assert r.stdout.split() == ["['colorsys']", "None", "True", "colorsys"]


@pytest.mark.parametrize("raw,expected", [
    ("", set(imports.DEFAULT_WAYS)), ("all", set(imports.DEFAULT_WAYS)), ("none", set()),
    ("hide,bogus", {"hide"}), ("direct, warm-blas", {"direct", "warm-blas"}),
])
def test_ways_from_the_environment(monkeypatch, raw, expected):
    monkeypatch.setenv(imports.ENV, raw)
    assert imports.ways() == expected


def test_a_process_that_imported_transformers_already_imports_the_plain_way():
    """transformers caches some of its probes: hiding a package after one said "installed"
    broke the guarded import ("'scipy' is not a package")."""
    code = ("import transformers\n"
            "from transformers.utils import import_utils\n"
            "import_utils.is_scipy_available()\n"
            "from tuiprof.engine.imports import import_model_classes\n"
            "print(import_model_classes('qwen3')[1].__name__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "Qwen3ForCausalLM"
