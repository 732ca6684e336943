#!/bin/bash
# The load client for the GPU machine, which has no internet: NVIDIA aiperf and exactly the
# packages its `aiperf profile` run imports there, as Python 3.12 manylinux x86-64 wheels in
# ./.aiperf-whl (under 50 MiB). Run from the project root on a machine with the registry:
#     bench/client_wheels.sh
# then carry `.aiperf-whl` with the command and install it there into a directory of its own:
#     python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/aiperf-site .aiperf-whl/*.whl
#     PYTHONPATH=/tmp/aiperf-site python3 -m aiperf profile ...
#
# How the list was found (2026-11-26, aiperf 0.13.0, CPU machine): `aiperf profile` against
# `transformers serve` with a site hook logging every top-level module each of its processes
# imported, then again with these imports made to fail, one by one, until the run still
# succeeded: pyarrow, scipy, pandas, matplotlib, plotly, dash, seaborn, kaleido, optuna,
# datasets, soundfile, kubernetes_asyncio, kopf and tiktoken are not needed by a profile run
# (aiperf imports them lazily or optionally); PIL, sentencepiece and ffmpeg are. Left out too:
# what the GPU machine already has (numpy, transformers, tokenizers, huggingface_hub, regex,
# PyYAML, tqdm, filelock, packaging, Jinja2, MarkupSafe, Pygments, typing_extensions).
# Versions: those pip resolved for aiperf 0.13.0 (aiperf pins rich 14.1: shipped, so the GPU
# machine's rich 15 is shadowed for the client only).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
ex=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$ex")"
grep -qx '/.aiperf-whl/' "$ex" 2>/dev/null || echo '/.aiperf-whl/' >> "$ex"
mkdir -p .aiperf-whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
pkgs=("aiperf==0.13.0" "aiofiles==24.1.0" "aiohappyeyeballs==2.7.1" "aiohttp==3.14.5"
      "aiosignal==1.4.0" "annotated-types==0.8.0" "anyio==4.16.0" "attrs==26.1.0" "brotli==1.2.1"
      "certifi==2026.10.19.post1" "click==8.5.1" "crick==0.0.8" "cyclopts==4.25.3"
      "ffmpeg-python==0.2.0" "frozenlist==1.8.0" "future==1.0.0" "h11==0.16.0" "httpcore==1.0.9"
      "httpx==0.28.1" "idna==3.20" "msgspec==0.22.0" "multidict==7.2.1" "orjson==3.11.9"
      "pillow==12.3.0" "prometheus_client==0.23.1" "propcache==0.5.4" "psutil==7.0.0"
      "pydantic==2.14.4" "pydantic-core==2.50.5" "pydantic-settings==2.16.3"
      "typing-inspection==0.4.5" "python-dotenv==1.2.4" "pyzmq==26.4.0" "ruamel.yaml==0.18.17"
      "ruamel.yaml.clib==0.2.15" "sentencepiece==0.2.3" "setproctitle==1.3.8" "uvloop==0.23.0"
      "yarl==1.25.1" "zstandard==0.25.0" "rich==14.1.0" "markdown-it-py" "mdurl"
      "docstring-parser" "rich-rst" "docutils" "sniffio")
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d .aiperf-whl "${pkgs[@]}"
ls -1 .aiperf-whl
du -sh .aiperf-whl
