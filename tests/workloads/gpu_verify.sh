#!/usr/bin/env bash
# GPU verification of the study workloads (run on the GPU machine from the repo root).
# Usage: OUT=/tmp/out bash tests/workloads/gpu_verify.sh
# Writes $OUT/workloads.log and $OUT/sweeps.tar.gz (the sweeps' CSV/Markdown/JSON files).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
S=/tmp/sweeps
mkdir -p "$OUT" $S
log() { echo; echo "=== $* ($(date +%H:%M:%S))"; }
{
  log "versions"; python3 -c "import torch,transformers,sys;print(sys.version.split()[0],torch.__version__,transformers.__version__,torch.cuda.get_device_name())"
  log "transformers DeepseekV2: can it express plain MHA (use_mla false)?"
  python3 - <<'PY'
import inspect, transformers
from transformers import DeepseekV2Config
from transformers.models.deepseek_v2 import modeling_deepseek_v2 as m
params = inspect.signature(DeepseekV2Config.__init__).parameters
src = inspect.getsource(m.DeepseekV2Attention.__init__)
print("use_mla param:", "use_mla" in params, "| kv_lora_rank default:", DeepseekV2Config().kv_lora_rank,
      "| attention always builds kv_a_proj_with_mqa:", "kv_a_proj_with_mqa" in src and "if self.kv_lora_rank" not in src)
PY
  log "pytest tests/workloads (CPU tests + GPU-marked tests)"
  timeout 240 python3 -m pytest tests/workloads -q -p no:cacheprovider 2>&1 | tail -15
  log "llama-layer decode: eager vs compiled (ms per layer step)"
  timeout 200 python3 -m tuiprof sweep --models llama-layer --passes decode --mode eager,compiled --seq-lens 128,2048 --iters 20 --out $S/layer 2>/dev/null
  log "gpt2 sizes: passes x attention"
  timeout 240 python3 -m tuiprof sweep --models gpt2-small,gpt2-medium,gpt2-large --seq-lens 128,512 --passes inference,train-forward,train-backward --attention plain,sdpa --out $S/gpt2 2>/dev/null
  log "nanochat + deepseek-ocr-decoder: forward and decode"
  timeout 240 python3 -m tuiprof sweep --models nanochat-d20,nanochat-d34,deepseek-ocr-decoder --seq-lens 256,1024 --passes inference,decode --out $S/big 2>/dev/null
  log "real OOM under --memory-limit 12 GiB, sweep continues"
  timeout 200 python3 -m tuiprof sweep --models gpt2-2.7b,gpt2-small --seq-lens 1024 --passes train-backward --memory-limit 12 --no-profile --out $S/oom 2>/dev/null
  for d in layer gpt2 big oom; do log "kernels $d"; cat $S/$d/kernels.csv | cut -c1-220 | head -40; log "attention $d"; cat $S/$d/attention.csv; done
} > "$OUT/workloads.log" 2>&1
tar -C /tmp -czf "$OUT/sweeps.tar.gz" sweeps
tail -c 11000 "$OUT/workloads.log"
