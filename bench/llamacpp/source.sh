#!/usr/bin/env bash
# llama.cpp's source, pinned, stripped to what a CUDA build of llama-bench, llama-cli,
# llama-simple, llama-server and llama-quantize needs, packed with xz so that it travels to the
# GPU machine (whose working tree may carry at most 64 MiB in all). The source is the registry's
# llama-cpp-python sdist, whose vendor/llama.cpp is the llama.cpp that binding release was cut
# from (no git clone: the registry is the one source reachable from here).
#
#   bash bench/llamacpp/source.sh DEST_DIR        # writes DEST_DIR/llama.tar.xz (+ .version)
#
# Left out: models/ (vocab test files), docs/, media/, tests/, benches/, the web UI's sources
# (the server then builds without an embedded UI), the server's Python tests, the converters and
# every ggml backend but CPU and CUDA (the build enables only those).
set -euo pipefail
VERSION=0.3.36
dest=${1:?usage: source.sh DEST_DIR}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# LLAMACPP_SDIST: an sdist of that version already downloaded (the download takes minutes)
if [ -n "${LLAMACPP_SDIST:-}" ]; then
  cp "$LLAMACPP_SDIST" .
else
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d . >/dev/null
fi
tar xzf "llama_cpp_python-$VERSION.tar.gz"
src="llama_cpp_python-$VERSION/vendor/llama.cpp"
cd "$src"
rm -rf models docs media tests benches ci .devops .github skills \
       conversion convert_*.py requirements requirements.txt \
       tools/server/tests tools/server/webui tools/server/public* \
       tools/ui/src tools/ui/tests tools/ui/static tools/ui/package-lock.json tools/ui/scripts
for b in ggml/src/ggml-*/; do
  case "$b" in ggml/src/ggml-cpu/|ggml/src/ggml-cuda/) ;; *) rm -rf "$b" ;; esac
done
find . -name '*.png' -o -name '*.jpg' -o -name '*.gif' -o -name '*.mp4' | xargs rm -f
cd ..
echo "llama-cpp-python $VERSION vendor/llama.cpp" > "$dest/llama.version"
tar cf - llama.cpp | xz -T2 -6 > "$dest/llama.tar.xz"
du -h "$dest/llama.tar.xz"
