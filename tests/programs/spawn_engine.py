"""A program shaped like a serving engine: the main process takes requests and hands them to
an engine process (multiprocessing, spawn) that owns the model and runs ``generate()``.

Usage: python spawn_engine.py [--requests N] [--new-tokens N] [--start fork|spawn|forkserver]
"""
import argparse
import json
import multiprocessing as mp
import pathlib
import time

CONFIG = pathlib.Path(__file__).parents[2] / "models" / "qwen3-tiny.json"


def engine(requests, answers, new_tokens):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    config = json.loads(CONFIG.read_text())["config"]
    model = AutoModelForCausalLM.from_config(Qwen3Config(**config)).eval()
    while True:
        req = requests.get()
        if req is None:
            break
        ids = torch.tensor([req])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        answers.put(out[0, len(req):].tolist())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=6)
    p.add_argument("--start", default="spawn")
    p.add_argument("--hold", type=float, default=0.0, help="seconds to wait before the end")
    args = p.parse_args()
    ctx = mp.get_context(args.start)
    requests, answers = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=engine, args=(requests, answers, args.new_tokens), name="EngineCore")
    proc.start()
    for i in range(args.requests):
        requests.put([1 + i, 2, 3, 4, 5, 6, 7, 8])
        print("request", i, "->", answers.get(timeout=600), flush=True)
    requests.put(None)
    proc.join(60)
    time.sleep(args.hold)
    print("engine exit code", proc.exitcode, flush=True)


if __name__ == "__main__":
    main()
