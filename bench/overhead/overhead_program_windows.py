"""What `tuiprof run` costs an HF ``generate()`` program, inside one process.

Whole eager processes on the H100 host differ by ±40 % from one to the next, pinned to CPUs or
not (docs/performance.md#against-no-tuiprof-at-all), and compiled ones by ±20 %, so ``bench/overhead/overhead_program.py``
resolves neither target (5 % eager, 3 % compiled) in fewer than tens of rounds. Here one process
holds a real ``tuiprof run`` session (``ProgramSession``: collectors, transformers' step source,
output capture, the live app's sampling, CUPTI attached for its bursts only) around a
``generate()`` loop of qwen3-0.6b (random weights, static cache; ``--mode compiled``:
transformers' own compiled decode forward replayed as CUDA graphs, as ``hf_qwen.py``), and
alternates windows of one ``generate()`` call each:

* ``tuiprof``: the session as ``tuiprof run`` runs it;
* ``none``: no tuiprof at all in the window: transformers' patches removed (no step hooks, no
  store, no allocator reads), CUPTI *finalized*, NVML paused. A session's CUPTI
  is finalized between its bursts anyway (compiled: its CUDA graphs dropped and recorded again
  around each switch), so a ``none`` window differs from a ``tuiprof`` one by everything tuiprof
  does per step and by the bursts, which fall inside ``tuiprof`` windows (below). A window that
  would end attached is detached as the profiler does (graphs dropped first) and counted in
  ``forced``: none should be.

A window's figure is the wall time of the whole call (prefill, every decode step, the final
sync): what the user waits for. Windows alternate A B B A inside **blocks** of one sampling
period of ``tuiprof`` steps (256 eager, 4,096 compiled: one burst and one due prefill, the burst
in the middle of a window, as in a session) and as many ``none`` steps; per block the ratio of
the two configurations' total wall times; the table gives the median of the blocks (min–max)
and the ratio of the totals::

    python bench/overhead/overhead_program_windows.py --blocks 10
    python bench/overhead/overhead_program_windows.py --mode compiled --blocks 8
    python bench/overhead/overhead_program_windows.py --device cpu --tiny --blocks 2   # the CPU path

``--nonvml`` adds a third configuration to every block (A B C C B A): the session with its NVML
sampler paused, to tell what NVML's sampling costs from the rest.

``--tp`` runs the same on every rank of a tensor-parallel job, launched by torchrun:
the MLPs sharded as ``tests/programs/tp_job.py`` shards them (one all-reduce a layer), the ranks'
windows in lockstep. A rank's session attaches CUPTI for its bursts only, as one process's does
(the ranks' bursts fall on the same steps); rank 0 prints every rank's row. ``--mode compiled``
there: transformers' compiled decode with the all-reduces inside its CUDA graphs, which every
rank drops at the same step (tuiprof/engine/graphs.py; ``TUIPROF_RANK_GRAPHS=keep`` keeps the
ranks attached instead)::

    torchrun --standalone --nproc-per-node 2 bench/overhead/overhead_program_windows.py --tp --blocks 8
    torchrun --standalone --nproc-per-node 2 bench/overhead/overhead_program_windows.py --tp \
        --device cpu --tiny --blocks 1    # gloo, the CPU path
    torchrun --standalone --nproc-per-node 2 \
        bench/overhead/overhead_program_windows.py --tp --mode compiled --blocks 4
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def build(tiny: bool, device: str, prompt_len: int, tp: bool = False):
    """The model and prompt of ``bench/programs/hf_qwen.py`` (eager, static cache); with ``tp``
    its MLPs sharded over the job's ranks as ``tests/programs/tp_job.py`` shards them."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    name = "qwen3-tiny" if tiny else "qwen3-0.6b"
    spec = json.loads((REPO / "models" / f"{name}.json").read_text())
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen3Config(**spec["config"]), dtype=dtype).eval()
    if tp:
        import torch.distributed as dist

        sys.path.insert(0, str(REPO / "tests" / "programs"))
        from tp_job import shard_mlp

        for layer in model.model.layers:
            shard_mlp(layer.mlp, dist.get_rank(), dist.get_world_size())
    ids = torch.randint(0, spec["config"]["vocab_size"], (1, prompt_len), device=device)
    return model, ids


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="qwen3-tiny (a CPU run)")
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--deadline", type=float, default=0, help="start no block after this many s")
    p.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    p.add_argument("--new-tokens", type=int, default=0,
                   help="steps per window, dividing the sampling period (default: 32 eager, "
                        "64 compiled)")
    p.add_argument("--json", default=None)
    p.add_argument("--nonvml", action="store_true",
                   help="a third configuration, interleaved with the two: the session with its "
                        "NVML sampler paused (what NVML's sampling costs the program)")
    p.add_argument("--tp", action="store_true",
                   help="every rank of a torchrun job in lockstep (see above)")
    a = p.parse_args()
    a.new_tokens = a.new_tokens or (32 if a.mode == "eager" else 64)
    t_start = time.perf_counter()

    import torch

    from tuiprof.cli.run import run_defaults as _run_defaults
    from tuiprof.collect.cupti_collector import BURST
    from tuiprof.engine.graphs import drop_cuda_graphs
    from tuiprof.cli.program import program_options
    from tuiprof.program.launch import ProgramResult, parse_program
    from tuiprof.program.program_session import ProgramSession
    from tuiprof.profiler import Profiler
    from tuiprof.sampling import AUTO_SAMPLE_EVERY
    from tuiprof.store import SessionStore

    args = argparse.Namespace(**_run_defaults())
    args.sample_every = "live"
    prof = Profiler(SessionStore(ring_tokens=256), program_options(args, headless=False))
    log = Path(tempfile.mkdtemp(prefix="overhead-windows-")) / "program.log"
    session = ProgramSession(prof, parse_program(["python", __file__]), log, tee=True)
    session.start()  # collectors before the program's first CUDA call, as `tuiprof run`
    cuda = a.device.startswith("cuda")
    rank, dist = 0, None
    if a.tp:  # the program's own set-up, after the session started (as under `tuiprof run`)
        import os

        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", 0))
        if cuda:
            torch.cuda.set_device(local)
            a.device = f"cuda:{local}"
        dist.init_process_group("nccl" if cuda else "gloo")
        rank = dist.get_rank()
    model, ids = build(a.tiny, a.device, 16, tp=a.tp)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0,
              cache_implementation="static", max_new_tokens=a.new_tokens,
              min_new_tokens=a.new_tokens)
    if a.mode == "eager":
        kw["disable_compile"] = True  # generate() would compile a static-cache forward itself
    elif not cuda:  # transformers compiles by itself on a GPU only (hf_qwen.py does the same)
        from transformers import CompileConfig

        cc = CompileConfig(backend="eager")
        cc._compile_all_devices = True
        kw["compile_config"] = cc
    forced = 0

    def window() -> float:
        if dist is not None:  # every rank's window starts together
            dist.barrier()
        t0 = time.perf_counter()
        model.generate(ids, **kw)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def configure(cfg: str) -> None:
        nonlocal forced
        on = cfg != "none"
        if on:
            session.sources["transformers"].install()
        else:
            session.sources["transformers"].uninstall()
            c = prof.cupti
            if c is not None and c.attached:  # as Profiler._cycle_cupti: graphs CUPTI saw go first
                forced += 1
                drop_cuda_graphs()
                torch.cuda.synchronize()
                c.detach()
        if prof.nvml is not None:
            prof.nvml.paused = cfg != "tuiprof"

    for _ in range(3):  # warm-up (compiled: the compile and the first graphs); the steps'
        window()        # sequence numbers then start on a window boundary
    period = BURST * (prof.cupti.sample_every if prof.cupti is not None
                      else AUTO_SAMPLE_EVERY[a.mode])
    per_block = max(1, period // a.new_tokens)
    c = prof.cupti
    if c is not None:  # the burst in the middle of a window: no window boundary splits it
        c._origin = prof.store.next_seq() + a.new_tokens // 2
    print(f"# {a.device}, {a.mode}, {a.new_tokens} steps a window, {per_block} windows of each "
          f"a block; "
          f"CUPTI: {prof.store.view().collectors.get('cupti', {}).get('message')}", flush=True)
    cfgs = ["tuiprof", "none"] + (["nonvml"] if a.nonvml else [])
    order = cfgs + cfgs[::-1]  # A B B A, or A B C C B A
    blocks: list[dict] = []
    for b in range(a.blocks):
        stop = [bool(a.deadline and time.perf_counter() - t_start > a.deadline)]
        if dist is not None:  # rank 0's clock decides for every rank
            dist.broadcast_object_list(stop, 0)
        if stop[0]:
            break
        sums = {k: [] for k in cfgs}
        for i in range(len(cfgs) * per_block):
            cfg = order[(i + len(cfgs) * (b % 2)) % len(order)]
            configure(cfg)
            sums[cfg].append(window())
        ratio = sum(sums["tuiprof"]) / sum(sums["none"])
        blocks.append({k: v for k, v in sums.items()} | {"ratio": ratio})
        if a.nonvml:
            blocks[-1]["ratio_nonvml"] = sum(sums["nonvml"]) / sum(sums["none"])
        detaches = c.detaches if c is not None else 0
        print(f"[rank {rank}] " * a.tp + f"[{time.perf_counter() - t_start:6.1f} s] block {b + 1}: tuiprof/none {ratio:.3f};"
              f" ms/step tuiprof {1e3 * statistics.median(sums['tuiprof']) / a.new_tokens:.2f}"
              f" none {1e3 * statistics.median(sums['none']) / a.new_tokens:.2f};"
              f" CUPTI detaches so far {detaches}, forced {forced}", flush=True)
    if not blocks:
        configure("tuiprof")
        session.finish(ProgramResult(0, "exited"))
        print("no block fitted before the deadline")
        return 1
    ratios = [blk["ratio"] for blk in blocks]
    tot = {k: sum(sum(blk[k]) for blk in blocks) for k in ("tuiprof", "none")}
    n = a.new_tokens * per_block * len(blocks)
    name = f"{'qwen3-tiny' if a.tiny else 'qwen3-0.6b'} {a.device}" + (f", rank {rank}" if a.tp else "")
    row = (f"| {name} | {len(blocks)} | "
           f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) | "
           f"{tot['tuiprof'] / tot['none']:.3f} | {1e3 * tot['tuiprof'] / n:.2f} | "
           f"{1e3 * tot['none'] / n:.2f} |")
    # each rank's row before anything that may not return (a compiled job's NCCL teardown on
    # the GPU has hung past a call's limit), so the measurement is never lost
    print(f"[rank {rank}] " * a.tp + f"row: {row}", flush=True)
    configure("tuiprof")
    session.finish(ProgramResult(0, "exited"))
    view = prof.store.view()
    rows = [row]
    if dist is not None:  # every rank's row, printed by rank 0
        rows = [None] * dist.get_world_size()
        dist.all_gather_object(rows, row)
        if rank:
            dist.destroy_process_group()
            return 0
    where = f"every rank of a TP={len(rows)} job" if a.tp else "in one process"
    print(f"\n| {a.mode} generate(), {where} | blocks | tuiprof / none: median of blocks "
          f"(min–max) | ratio of totals | ms/step tuiprof | ms/step none |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    if a.nonvml:
        rn = [blk["ratio_nonvml"] for blk in blocks]
        print(f"| the same, NVML paused | {len(blocks)} | {statistics.median(rn):.3f} "
              f"({min(rn):.3f}–{max(rn):.3f}) | "
              f"{sum(sum(blk['nonvml']) for blk in blocks) / tot['none']:.3f} | – | – |")
    print(f"session: {json.dumps(view.counters)}; overhead {json.dumps(view.overhead)}; "
          f"windows detached by the bench: {forced}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "blocks": blocks, "forced": forced,
                                            "counters": view.counters,
                                            "overhead": view.overhead}, indent=1))
    if dist is not None:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
