"""`c` in a session of its own process (qwen3-tiny on the CPU, inductor's CPU backend), as the app
drives it: decode eager, ask for compiled mode, wait for it. Prints one JSON line: the status
line, the notes, whether the step was compiled ahead of time and saved or loaded, seconds from
`c` to compiled mode, the saved files, and the compiled step's logits for fixed inputs beside
eager's (the same model in every process: the weights come from the seed).

    python tests/engine/precompile_scenario.py [BATCH]
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

from compile_scenario import wait  # run as a script: its folder is on the path

from tuiprof.engine.load import load_engine


def main(batch: int) -> dict:
    engine = load_engine("qwen3-tiny", device="cpu", prompt=None, max_new_tokens=None,
                         loop=True, batch=batch, max_batch=4)
    engine.start()
    wait(lambda: engine.tokens >= 3, 120, "eager tokens")
    t0 = time.monotonic()
    engine.request_mode("compiled")
    wait(lambda: bool(engine.error) or (engine.mode == "compiled"
                                        and engine.message.startswith("compiled")),
         600, "compiled mode")
    out = {"seconds": round(time.monotonic() - t0, 2), "mode": engine.mode,
           "error": engine.error, "message": engine.message, "notes": list(engine.notes),
           "saved_step": engine.saved_step, "cache_hits": engine.compile_cache_hits,
           "cache": engine.info.get("inductor_cache")}
    n = engine.tokens
    wait(lambda: engine.tokens >= n + 3, 60, "compiled tokens")
    saving = list(engine.compile_helper._saving)
    for h in saving:   # a helper saving the step for the next session: let it finish
        h.saves.wait(600)
    out["helper_lines"] = [ln for h in saving for ln in h.lines
                           if ln.startswith(("saved", "unsaved", "finished"))]
    engine.stop()
    engine.join(30)
    step = engine._compiled.get(engine.compile_mode)
    out["graphs"] = sorted(step.aot)
    with torch.no_grad():
        logits = {}
        for name, fn in (("compiled", step.fn), ("eager", engine.adapter.decode)):
            cache = engine.adapter.new_cache(batch)
            plen = engine.prompt_ids.shape[1]
            tok = torch.full((batch, 1), 7, dtype=torch.long)
            pos = torch.tensor([plen])
            masks = engine._decode_masks(cache, batch)
            args = (tok, pos, cache) if masks is None else (tok, pos, cache, masks.at(pos, plen))
            logits[name] = fn(*args).float()
    out["logits_sum"] = round(float(logits["compiled"].sum()), 3)
    out["max_diff_vs_eager"] = float((logits["compiled"] - logits["eager"]).abs().max())
    pre = os.path.join(out["cache"] or "", "precompiled")
    out["files"] = sorted(os.listdir(pre)) if os.path.isdir(pre) else []
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)), flush=True)
    sys.stderr.flush()
    os._exit(0)
