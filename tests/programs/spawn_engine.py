"""A program shaped like a serving engine: the main process takes requests and hands them to
an engine process (multiprocessing, spawn by default) that owns the model and runs
``generate()``; ``--inline`` runs the same engine in the main process instead (the one-process
reference of bench/verify/verify_processes.py).

Usage: python spawn_engine.py [--requests N] [--new-tokens N] [--start fork|spawn|forkserver]
           [--inline] [--model qwen3-tiny] [--device cpu|cuda] [--seconds S]
"""
import argparse
import json
import multiprocessing as mp
import pathlib
import time

MODELS = pathlib.Path(__file__).resolve().parents[2] / "models"


def engine(requests, answers, new_tokens, model_name="qwen3-tiny", device="cpu"):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    config = json.loads((MODELS / f"{model_name}.json").read_text())["config"]
    model = AutoModelForCausalLM.from_config(Qwen3Config(**config)).eval()
    if device.startswith("cuda"):
        model = model.to(device, torch.bfloat16)
    while True:
        req = requests.get()
        if req is None:
            break
        ids = torch.tensor([req], device=model.device)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False, pad_token_id=0)
        answers.put(out[0, len(req):].tolist())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=6)
    p.add_argument("--start", default="spawn")
    p.add_argument("--inline", action="store_true", help="the engine in this process")
    p.add_argument("--model", default="qwen3-tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seconds", type=float, default=0.0, help="keep sending requests this long")
    p.add_argument("--hold", type=float, default=0.0, help="seconds to wait before the end")
    args = p.parse_args()
    if args.inline:
        import queue
        import threading
        requests, answers = queue.Queue(), queue.Queue()
        proc = threading.Thread(target=engine, args=(requests, answers, args.new_tokens,
                                                     args.model, args.device))
    else:
        ctx = mp.get_context(args.start)
        requests, answers = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=engine, args=(requests, answers, args.new_tokens, args.model,
                                                args.device), name="EngineCore")
    proc.start()
    t_end = time.monotonic() + args.seconds
    i = 0
    while i < args.requests or time.monotonic() < t_end:
        requests.put([1 + i % 500, 2, 3, 4, 5, 6, 7, 8])
        print("request", i, "->", answers.get(timeout=600), flush=True)
        i += 1
    requests.put(None)
    proc.join(60)
    time.sleep(args.hold)
    print("engine exit code", getattr(proc, "exitcode", 0), flush=True)


if __name__ == "__main__":
    main()
