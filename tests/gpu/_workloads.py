"""The GPU workloads of tests/gpu, each run in a fresh Python process:

    python tests/gpu/_workloads.py eager|compiled|agreement

A workload logs to stderr and prints, last, one line ``WORKLOAD-RESULT {json}`` with what it
measured; the tests (``run_workload`` in conftest.py) assert on those values. One process per
workload because CUPTI (tuiprof's collector, torch.profiler) and torch.compile/CUDA-graph state
are process-wide: a second ``torch.compile`` in one pytest process fell back to eager on the
H100.
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

MODEL = "qwen3-0.6b"
PROMPT_LEN = 16
DECODE = 256        # engine test: decode tokens per mode (the compiled session's length too)
SESSION = 24        # eager profiler session: decode tokens, every one traced
FULL = 24           # compiled session: decode steps traced in full, then bursts
BURST_EVERY = 8     # compiled session from step FULL on: 4 traced tokens in every 4 * 8
DETACH_CYCLE = 101  # detached: decode steps per generation cycle (prime to the period)
DETACH_CYCLES = 6   # detached: cycles from the same prompt (same tokens every cycle)
AGREE_DECODE = 8    # agreement: decode steps per profiled run
AGREE_ROUNDS = 5    # agreement: runs per profiler, alternating
MARK = "WORKLOAD-RESULT "
ROW_FIELDS = ("step", "phase", "mode", "done", "sampled", "kernels", "graph_kernels",
              "busy_ns", "gpu_ms", "host_ms", "model_start_ns", "model_kernels", "loop_kernels")


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def _load():
    from tuiprof.engine.load import load_model, prompt_ids

    loaded = load_model(MODEL, device="cuda", max_len=PROMPT_LEN + DECODE + 1)
    return loaded, prompt_ids(loaded, None, PROMPT_LEN, seed=0)[0]


def _session(mode: str, decode: int, profiler_cls=None, **options):
    """A live tuiprof session (engine + CUPTI + NVML) of ``decode`` decode tokens."""
    from tuiprof.profiler import Profiler
    from tuiprof.spec import EngineSpec, ProfilerOptions
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=decode + 2)
    prof = (profiler_cls or Profiler)(store, ProfilerOptions(**options, engine=EngineSpec.resolve(
        MODEL, mode=mode, max_new_tokens=decode + 1, loop=False)))
    prof.start()
    finished = prof.wait(600)
    prof.stop()
    view = store.view()
    st = prof.status
    out = {
        "mode": mode, "dtype": view.meta.get("dtype"), "params": view.meta.get("params"),
        "error": None if finished and st.state != "error" else st.message or "did not finish",
        "message": st.message, "compile_s": getattr(prof.engine, "compile_s", None),
        "dropped": view.counters["dropped"], "collectors": view.collectors,
        "gpm_sm_util": [s["gpm_sm_util"] for s in view.nvml if "gpm_sm_util" in s],
        "api": {k: st.count for k, st in view.api.items()},
        "tokens": [{k: getattr(t, k) for k in ROW_FIELDS} for t in view.tokens],
    }
    log(f"{mode} session: {st.state} {st.message!r}, {len(out['tokens'])} tokens")
    return out, view


def eager() -> dict:
    """The bare engine, 256 eager decode tokens; then a profiled eager session."""
    import torch

    from tuiprof.engine.events import CollectingListener
    from tuiprof.engine.generate import Engine

    loaded, prompt = _load()
    listener = CollectingListener()
    engine = Engine(loaded.adapter, prompt, max_new_tokens=DECODE + 1, mode="eager",
                    listener=listener)
    engine.run()
    log(f"eager engine: {engine.state} {engine.message!r}")
    out = {"engine": {
        "mode": "eager", "dtype": loaded.dtype, "params": loaded.params, "error": engine.error,
        "message": engine.message, "compile_s": engine.compile_s,
        "tokens": [{"step": e.step, "phase": e.phase, "mode": e.mode, "gpu_ms": e.gpu_ms,
                    "host_ms": e.host_ms} for e in listener.events]}}
    del loaded, engine, listener
    torch.cuda.empty_cache()
    out["session"] = _session("eager", SESSION, sample_every=1)[0]  # every token traced
    return out


def compiled() -> dict:
    """One compiled session (the only compile of the suite): every decode token traced up to
    step FULL, bursts from there on; it also serves the engine test's compiled case."""
    from tuiprof.profiler import Profiler

    class BurstsAfterFull(Profiler):
        def token_started(self, phase, mode, step, cycle, start_ns, *args, **kw):
            if phase == "decode" and step == FULL and self.cupti is not None:
                self.cupti.sample_every = BURST_EVERY  # kinds go off, bursts switch them on
            super().token_started(phase, mode, step, cycle, start_ns, *args, **kw)

    out, view = _session("compiled", DECODE, BurstsAfterFull, sample_every=1)
    rows = {t.seq: t for t in view.tokens}
    nvjet = defaultdict(list)  # durations in the burst-traced tokens only
    for seq, recs in view.raw:
        row = rows.get(seq)
        if row is not None and row.phase == "decode" and row.step >= FULL and row.sampled:
            for r in recs:
                if r[0] == "K" and r[1].startswith("nvjet"):
                    nvjet[r[1]].append(r[3] - r[2])
    out["burst_nvjet_mean_ns"] = {n: statistics.fmean(d) for n, d in nvjet.items()}
    return {"engine": out, "session": out}


def detached() -> dict:
    """A compiled session with CUPTI attached for bursts only (``detach_between_bursts``):
    bursts of 4 in every 32 steps, CUPTI finalized between them and the CUDA graphs recorded
    again around every switch. The engine loops from the prompt every DETACH_CYCLE steps, so
    the drops fall at other positions in every cycle: greedy tokens that agree cycle by cycle
    say the graphs recorded again compute what the first ones did."""
    from tuiprof.profiler import Profiler

    class Cycles(Profiler):
        def token_finished(self, ev):
            super().token_finished(ev)
            self.ids.setdefault(ev.cycle, []).append(ev.token_id)
            if ev.cycle >= DETACH_CYCLES and self.engine is not None:
                self.engine.stop()

        def _cycle_cupti(self, seq, prefill=False, eager=False):
            if VARIANT != "drop-only":
                if VARIANT == "no-flush-period" and self.cupti.flush_period_ms:
                    self.cupti.flush_period_ms = 0
                    self.cupti._cupti.activity_flush_period(0)
                return super()._cycle_cupti(seq, prefill, eager)
            # the graphs dropped where "full" would switch, CUPTI attached throughout
            c = self.cupti
            period = c.sample_every * BURST
            phase = (seq - c._origin) % period
            window = phase <= BURST or phase >= period - ATTACH_LEAD
            if window != self.window:
                self.window = window
                self.drops += 1
                return drop_cuda_graphs()
            return None

    import os

    from tuiprof.collect.cupti_collector import ATTACH_LEAD, BURST
    from tuiprof.engine.graphs import drop_cuda_graphs

    # DETACH_VARIANT: "full" (the product's path), "drop-only" (graphs dropped on the same
    # schedule, CUPTI never detached), "no-flush-period" (full, CUPTI's periodic flush off)
    VARIANT = os.environ.get("DETACH_VARIANT", "full")
    Cycles.ids, Cycles.window, Cycles.drops = {}, True, 0
    from tuiprof.spec import EngineSpec, ProfilerOptions
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=4096)
    prof = Cycles(store, ProfilerOptions(detach_between_bursts=True, sample_every=BURST_EVERY,
                                         engine=EngineSpec.resolve(MODEL, mode="compiled",
                                                            max_new_tokens=DETACH_CYCLE,
                                                            loop=True)))
    prof.ids = {}
    prof.start()
    finished = prof.wait(600)
    c = prof.cupti
    detaches = c.detaches if c is not None else None
    buffers = c.buffer_stats() if c is not None else None
    lock_type = type(getattr(c, "_lock", None)).__name__
    stop_error = None
    try:
        prof.stop()
    except Exception as exc:  # reported: the test names it
        import traceback

        stop_error = f"{exc!r} (lock {lock_type}) " + traceback.format_exc()[-600:]
        log(stop_error)
    view = store.view()
    st = prof.status
    rows = {t.seq: t for t in view.tokens}
    nvjet = defaultdict(list)
    for seq, recs in view.raw:
        row = rows.get(seq)
        if row is not None and row.phase == "decode" and row.sampled:
            for r in recs:
                if r[0] == "K" and r[1].startswith("nvjet"):
                    nvjet[r[1]].append(r[3] - r[2])
    out = {"error": None if finished and st.state != "error" else st.message or "did not finish",
           "message": st.message, "detaches": detaches, "stop_error": stop_error,
           "variant": VARIANT, "drops": prof.drops, "buffers": buffers,
           "buffers_after_stop": c.buffer_stats() if c is not None else None,
           "collectors": view.collectors,
           "dropped": view.counters["dropped"],
           "cycles": [prof.ids[c] for c in sorted(prof.ids) if c < DETACH_CYCLES],
           "nvjet_mean_ns": {n: statistics.fmean(d) for n, d in nvjet.items()},
           "tokens": [{k: getattr(t, k) for k in ROW_FIELDS} for t in view.tokens]}
    log(f"detached session: {st.state} {st.message!r}, {detaches} detaches")
    return {"session": out}


def rerecord() -> dict:
    """drop_cuda_graphs() alone: a reduce-overhead compiled function's graphs dropped in place
    are recorded again at its next calls (no recompile) and compute the same outputs."""
    import torch

    from tuiprof.engine.graphs import drop_cuda_graphs

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                              torch.nn.Linear(1024, 256)).cuda().eval()
    fn = torch.compile(net, mode="reduce-overhead")
    x = torch.randn(8, 256, device="cuda")
    outs, dropped = [], []
    with torch.no_grad():
        for _ in range(3):
            for _ in range(3):  # warm-up, record, replay
                torch.compiler.cudagraph_mark_step_begin()
                y = fn(x).clone()
            outs.append(y)
            dropped.append(drop_cuda_graphs())
        eager = net(x)
    return {"dropped": dropped, "max_abs_diff": [float((o - outs[0]).abs().max()) for o in outs],
            "eager_diff": float((eager - outs[0]).abs().max())}


class _Window:
    """Engine listener that opens a profiling window once the prefill's token is on the host
    and closes it after the last decode token: a window holds exactly the decode steps."""

    def __init__(self, start=None, stop=None) -> None:
        self.start, self.stop, self.open = start, stop, False
        self.token_ids: list[int] = []

    def token_started(self, *args) -> None:
        pass

    def token_launched(self, model_ns=None) -> None:
        pass

    def token_finished(self, ev) -> None:
        self.token_ids.append(ev.token_id)
        if ev.phase == "prefill" and self.start is not None:
            self.start()
            self.open = True

    def state_changed(self, state: str, message: str = "") -> None:
        if state in ("done", "stopped", "error") and self.open:
            self.open = False
            self.stop()


def agreement() -> dict:
    """Per-kernel-name totals of the same decode steps under tuiprof's collector and under
    torch.profiler, alternating in one process (each profiler releases CUPTI before the other
    starts: tuiprof's stop() flushes, disables and finalizes; torch.profiler disables its kinds).
    Every run restarts generation from the same prompt on the same model and cache, so every
    window covers the same positions (prompt + 0 .. AGREE_DECODE - 1) with the same tokens."""
    import torch

    from tuiprof.analysis import demangle
    from tuiprof.collect.cupti_collector import CuptiCollector
    from tuiprof.engine.generate import Engine
    from tuiprof.store import SessionStore

    loaded, prompt = _load()
    keep = []  # collectors (their C callbacks) outlive their CUPTI sessions

    def run(window: _Window) -> list[int]:
        engine = Engine(loaded.adapter, prompt, max_new_tokens=AGREE_DECODE + 1,
                        listener=window)
        engine.run()
        if engine.error:
            raise RuntimeError(engine.error)
        return window.token_ids

    def tuiprof() -> dict:
        store = SessionStore()
        col = CuptiCollector(store)
        keep.append(col)
        ids = run(_Window(col.start, col.stop))
        view = store.view(raw=False)
        totals = defaultdict(lambda: [0, 0])
        for agg in view.kernels.values():
            t = totals[demangle(agg.name)]  # torch.profiler reports demangled names
            t[0] += agg.stats.count
            t[1] += agg.stats.total
        return {"tokens": ids, "totals": totals, "dropped": view.counters["dropped"]}

    def torch_profiler() -> dict:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        ids = run(_Window(prof.start, prof.stop))
        totals = defaultdict(lambda: [0, 0.0])
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                t = totals[ev.name]
                t[0] += 1
                t[1] += ev.device_time_total * 1e3  # µs -> ns
        return {"tokens": ids, "totals": totals, "dropped": 0}

    run(_Window())  # warm-up: allocator, cuBLAS handles and heuristics, clocks
    runs = []
    pair = (("tuiprof", tuiprof), ("torch.profiler", torch_profiler))
    for r in range(AGREE_ROUNDS):  # T P, P T, T P ...: neither profiler always goes first
        for name, fn in (pair[::-1] if r % 2 else pair):
            res = fn()
            res["profiler"] = name
            runs.append(res)
            log(f"round {r} {name}: {sum(n for n, _ in res['totals'].values())} kernels")
    return {"decode": AGREE_DECODE, "runs": runs}


WORKLOADS = {"eager": eager, "compiled": compiled, "agreement": agreement, "detached": detached,
             "rerecord": rerecord}

if __name__ == "__main__":
    result = WORKLOADS[sys.argv[1]]()
    print(MARK + json.dumps(result), flush=True)
