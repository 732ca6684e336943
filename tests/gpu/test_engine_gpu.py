"""qwen3-0.6b on the GPU: eager and compiled (CUDA graphs), 256 decode tokens each."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DECODE = 256


@pytest.fixture(scope="module")
def loaded():
    from tuiprof.engine.load import load_model

    return load_model("qwen3-0.6b", device="cuda", max_len=16 + DECODE + 1)


@pytest.fixture(scope="module")
def prompt(loaded):
    from tuiprof.engine.load import prompt_ids

    return prompt_ids(loaded, None, 16, seed=0)[0]


def _run(loaded, prompt, mode):
    from tuiprof.engine.events import CollectingListener
    from tuiprof.engine.generate import Engine

    listener = CollectingListener()
    engine = Engine(loaded.adapter, prompt, max_new_tokens=DECODE + 1, mode=mode,
                    listener=listener)
    engine.run()
    assert engine.error is None, engine.error
    return engine, listener


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_qwen3_0_6b_decode(loaded, prompt, mode):
    assert loaded.dtype == "bfloat16" and loaded.params == 596_049_920
    engine, listener = _run(loaded, prompt, mode)
    decode = [e for e in listener.events if e.phase == "decode"]
    assert len(decode) == DECODE
    bad = [(e.step, e.mode, e.gpu_ms) for e in decode
           if not (e.mode == mode and e.gpu_ms is not None and e.gpu_ms > 0)]
    assert not bad, (engine.message, bad[:4])
    steady = decode[8:]
    host_s = sum(e.host_ms for e in steady) / 1e3
    print(f"\nqwen3-0.6b {mode}: {len(steady) / host_s:.1f} tokens/s "
          f"(median gpu {sorted(e.gpu_ms for e in steady)[len(steady) // 2]:.3f} ms/token"
          f"{'' if engine.compile_s is None else f', compile {engine.compile_s:.1f} s'})")

