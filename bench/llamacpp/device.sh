#!/usr/bin/env bash
# llama.cpp under tuiprof on the GPU machine, one device call: build llama.cpp with CUDA (or
# unpack a build brought back by an earlier call), write the GGUF models (f16, then Q8_0 and
# $LLAMA_QUANTS, default Q4_K_M, by llama-quantize), then run
# bench/llamacpp/measure.py (tuiprof against nsys, CUDA graphs on and off, overhead, the
# llama-simple recordings, the server). Everything lands in $OUT as it comes:
#   build.log,
#   results.tar.xz (snapshots, nsys CSVs, llama-bench JSON, logs), measure.txt.
#
# The assets: a folder ($LLAMA_ASSETS, else this script's own) holding llama.tar.xz
# (bench/llamacpp/source.sh); the wheels tuiprof needs there, nsys's importer's libraries and
# tmux as .deb files, in that folder's whl/, dw/, tmx/ or the repository's .whl/, .dw/, .tmx/
# (../shared/device/{wheels,nsys,tmux}.sh). From the repository root:
#   LLAMA_ASSETS=.llama bash bench/llamacpp/device.sh [--bin llama-bin.tar.xz] [measure.py options …]
# (bench/gpu_next.sh llamacpp queues it), or from a copy of these scripts beside the assets.
set -u
here=$(cd "$(dirname "$0")" && pwd)
A=$(cd "${LLAMA_ASSETS:-$here}" && pwd)
if [ -f "$here/../../pyproject.toml" ]; then repo=$(cd "$here/../.." && pwd); else repo=$(cd "$here/.." && pwd); fi
pick() { if [ -d "$A/$1" ]; then echo "$A/$1"; else echo "$repo/.$1"; fi; }
WHL=$(pick whl); DW=$(pick dw); TMX=$(pick tmx)
OUT=${OUT:-$(mktemp -d)}
BIN=""
if [ "${1:-}" = "--bin" ]; then BIN=$2; shift 2; fi
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$WHL"/*.whl || exit 1
export PYTHONPATH=/tmp/site:$repo PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
for f in "$DW"/*.deb; do dpkg -x "$f" /tmp/dwroot; done
for f in "$TMX"/*.deb; do dpkg -x "$f" /tmp/tmxroot; done
W=/tmp/llw
mkdir -p $W/models
cd $W
# A machine still warm from an earlier call of this session keeps /tmp: its sources, build and
# models are used again (a build takes 205-328 s of a call's 10 minutes)
[ -f $W/llama.cpp/CMakeLists.txt ] || tar xJf "$A/llama.tar.xz"
# the models are written while the build runs (one core against ninja's sixteen)
if [ -s $W/models/qwen3-0.6b-f16.gguf ] && [ -s $W/models/tiny-f16.gguf ]; then
  true &
else
  (PYTHONPATH=$W/llama.cpp/gguf-py python3 "$here/gguf_model.py" $W/models/qwen3-0.6b-f16.gguf \
     --shape qwen3-0.6b > $W/models/gguf.log 2>&1;
   PYTHONPATH=$W/llama.cpp/gguf-py python3 "$here/gguf_model.py" $W/models/tiny-f16.gguf \
     --shape tiny >> $W/models/gguf.log 2>&1) &
fi
gg=$!
B=$W/build/bin
have=1
for t in ${LLAMA_TARGETS:-llama-bench llama-server llama-simple llama-quantize}; do
  [ -x $B/$t ] || have=0
done
if [ $have = 1 ] && [ -z "$BIN" ]; then
  echo "reused the build of an earlier call on this machine: $(ls $B | tr '\n' ' ')" > "$OUT/build.log"
  cat "$OUT/build.log"
elif [ -n "$BIN" ]; then
  mkdir -p $B && tar xJf "$BIN" -C $B
  echo "binaries from $BIN" > "$OUT/build.log"
else
  {
    echo "cmake: $(cmake --version | head -1); nvcc: $(nvcc --version | tail -2 | head -1); cores: $(nproc)"
    s=$(date +%s)
    cmake -S llama.cpp -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
      > cmake.log 2>&1 || { tail -30 cmake.log; }
    c=$(date +%s)
    timeout 420 cmake --build build -j16 --target ${LLAMA_TARGETS:-llama-bench llama-server llama-simple llama-quantize} 2>&1 | tail -5
    e=$(date +%s)
    echo "configure_s $((c - s)) build_s $((e - c)) (${LLAMA_TARGETS:-llama-bench llama-server llama-simple llama-quantize}, -j16)"
    ls -la $B
  } > "$OUT/build.log" 2>&1
  cat "$OUT/build.log"
fi
wait $gg
cat $W/models/gguf.log
[ -x $B/llama-bench ] || { echo "no llama-bench built: see build.log"; exit 1; }
export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
for q in Q8_0 ${LLAMA_QUANTS:-Q4_K_M}; do
  [ -s $W/models/qwen3-0.6b-$(echo $q | tr A-Z a-z).gguf ] && continue
  s=$(date +%s)
  $B/llama-quantize $W/models/qwen3-0.6b-f16.gguf $W/models/qwen3-0.6b-$(echo $q | tr A-Z a-z).gguf \
    $q > $W/models/quant_$q.log 2>&1
  echo "$q: rc $? in $(( $(date +%s) - s )) s; $(tail -2 $W/models/quant_$q.log | head -1)"
done
ls -la $W/models
echo "set-up done at $(( $(date +%s) - t0 )) s"
cd "$repo"
python3 "$here/measure.py" --bin $B --models $W/models --out "$OUT" --t0 "$t0" \
  --nsys-importer-lib /tmp/dwroot/usr/lib/x86_64-linux-gnu --tmux-root /tmp/tmxroot "$@" \
  2>&1 | tee "$OUT/measure.txt"
wait
ls -la "$OUT"
