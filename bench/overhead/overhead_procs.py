"""What a user pays for tuiprof: whole processes with and without it, interleaved.

``bench/overhead/overhead.py`` compares windows inside one process, where CUPTI stays subscribed even in
its ``bare`` windows (CUPTI cannot be detached cleanly from a process). A user compares their
program *without* tuiprof. So here every run is its own process:

* ``none``: the engine alone. No CUPTI (libcupti is never loaded), no NVML, no allocator
  statistics, no per-token listener (the engine's own no-op listener, as outside tuiprof).
* ``default``: tuiprof as the live app collects (``ProfilerOptions()``: bursts of 4 traced
  tokens in every 128 eager / 4,096 compiled, the API subset in the bursts, memory records,
  NVML at 10 Hz, allocator statistics, the per-token listener and store).
* ``app``: the live app as ``tuiprof --model M`` runs it: a session process of its own (spawned,
  so it pays its imports itself; only the decode figure compares) with tuiprof's defaults, and
  the Textual app headless at 200×50 in the run's process, pulling and redrawing at 4 Hz the
  whole time. Decode wall time from the session's own end time of each step (its token clock:
  CUPTI's timestamps, which on Linux read the same clock as ``time.time_ns()``). Its line
  also gives the session's own overhead figure and the CPU time spent answering the UI.
  ``app-no-findings``: the same app without its findings pass (every 2 s, on the raw records of
  the last 16 traced tokens). ``remote``: the app's session process alone (spawned, tuiprof's
  defaults, pulled once a second), no app: what the app costs beside its session process.
* parts (``--parts``), each alone: ``cupti`` (CUPTI as in ``default``, nothing else),
  ``cupti-memory`` (subscribed, memory records only; the prefill and the first burst are still
  traced), ``cupti-attached`` (subscribed, no memory records), ``listener`` (the per-token
  listener and store, no collector), ``nvml``, ``alloc``; and ``torch.profiler`` (the peer,
  CUDA activities, around the same generation, ``--peer``).
* ``no-memory``: ``default`` without CUPTI's memory records.
* ``detached``: ``default``, then CUPTI finalized after 64 steps, the floor that detaching
  between bursts would reach. In compiled mode it is a reproducer, not a figure: on the H100
  (CUDA 13, driver 580) the next CUDA-graph launch after ``cuptiFinalize`` fails with
  "unspecified launch failure" (docs/performance.md#cupti-and-cuda-graphs), as Kineto found with CUDA 11-12
  (it keeps CUPTI attached when CUDA graphs are used).
* ``recapture``: ``default``, then at step 64 the CUDA graphs dropped (``torch._dynamo.reset()``
  on the engine thread: the step is compiled again from the warm caches and its graphs
  recorded at the next steps) and CUPTI finalized; at
  step 1,024 CUPTI attached again and the graphs dropped again (recorded under it); at step
  1,536 dropped and finalized again. The question: graphs recorded *after* the finalize do not
  carry CUPTI's instrumentation, so does the ``detached`` crash go away, does the cost go with
  CUPTI (segments ``seg_ms``: median ms/step of each stretch), and does a CUPTI attached again
  trace the new graphs (``kernels_reattached``)? If so, kernel detail can be sampled in
  compiled mode by attaching for a burst and dropping the graphs around it.
* ``detach``: ``default`` with ``detach_between_bursts`` (compiled: CUPTI attached two steps
  before each burst and finalized after it, the CUDA graphs recorded again around each switch;
  ``kernels`` and ``detaches`` say the bursts were traced). With the live sampling a compiled
  run of 2,048 steps holds one burst (one in 4,096), so ``detach`` measures a session that
  stays detached; ``detach-256`` and ``default-256`` trace a burst every 256 steps (8 cycles a
  run): what each cycle costs.
* ``rerecord``: as ``recapture``, in three attach/finalize cycles, but the graphs dropped in
  place (:func:`tuiprof.engine.graphs.drop_cuda_graphs`: every recorded graph of this thread's cudagraph trees freed,
  the compiled functions kept, so their next calls record new graphs without a recompile).
  Also CUPTI's clock after each re-attach (``clock``: µs a read, offset from ``time.time_ns``).
* ``burst-attach``: no CUPTI until step 256, then CUPTI attached for 64 steps (one burst) and
  finalized, three times (256, 1,024, 1,600), the CUDA graphs never dropped: they were recorded
  before any CUPTI. Do graphs that a late CUPTI traced still replay after its finalize (the
  ``detached`` crash was on graphs recorded under CUPTI), and what does each state cost? If they
  do, compiled sessions can attach CUPTI for bursts only.
* ``late-attach``: no CUPTI until step 64, then CUPTI as in ``default`` (its next burst comes 8
  steps later): in compiled mode, what CUPTI costs when the CUDA graphs were captured and
  instantiated before it attached, and (``kernels_after_attach``) whether their kernels are
  traced at all. The question behind kernel detail on demand (attach at a key) for compiled
  sessions, since CUPTI cannot be detached from them.

To pay the imports (torch, the model code: 15 s for Qwen3 on the H100 host) once, a parent
process imports them and **forks** one child per run before anything touches CUDA, CUPTI or
NVML; each child creates its own CUDA context, builds the model, decodes and exits. A round runs
every configuration once, in an order that rotates from round to round (A B, B A, B A, A B, ...:
:func:`round_order`), so the host's drift (±10 % over seconds) spreads over all of them.

Compiled runs compile in every process. ``--warm-compile`` (the default in compiled mode) first
runs one untimed ``none`` process, so that the others find torch.compile's on-disk caches
(FX graph and AOTAutograd caches) warm and compile in seconds instead of a minute.

Figures per run: **decode wall time** (from the end of decode step ``--skip`` to the end of the
last step: every stall, burst, flush and GIL wait in between included), and the process's
whole wall time (fork to exit: CUDA init, model build, compile, prefill, decode, CUPTI's final
flush). Per configuration: the median over rounds of the ratio to the same round's ``none``
(min-max), and the ratio of the totals::

    python bench/overhead/overhead_procs.py --mode eager --rounds 8 --tokens 256 --json $OUT/procs.json
    python bench/overhead/overhead_procs.py --mode eager --rounds 4 --parts --peer
    python bench/overhead/overhead_procs.py --device cpu --model qwen3-tiny --tokens 24 --rounds 2  # CI path
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CONFIGS: dict[str, dict | str | None] = {
    "none": None,
    "default": {},
    "cupti": {"nvml": False, "alloc_every": 0},
    "default-no-graphs": {"graphs": False},
    "no-memory": {"memory": False},
    "detached": {},  # default, then CUPTI finalized after SWITCH_AT steps (see above)
    "late-attach": {"cupti": False},  # CUPTI started after SWITCH_AT steps (see above)
    "recapture": {},  # graphs dropped around CUPTI's finalize and re-attach (see above)
    "detach": {"detach_between_bursts": True},  # tuiprof's CUPTI attached for bursts only
    # a burst every 256 steps (8 in a run of 2,048): what each attach/finalize cycle costs
    "detach-256": {"detach_between_bursts": True, "sample_every": 64},
    "default-256": {"sample_every": 64},
    "rerecord": {},  # as recapture, the graphs dropped in place: no recompile (see above)
    "burst-attach": {"cupti": False},  # CUPTI attached for bursts only, graphs kept (above)
    "cupti-memory": {"nvml": False, "alloc_every": 0, "api": False, "sample_every": 10**9},
    "cupti-attached": {"nvml": False, "alloc_every": 0, "api": False, "memory": False,
                       "sample_every": 10**9},
    "listener": {"cupti": False, "nvml": False, "alloc_every": 0},
    "nvml": {"cupti": False, "alloc_every": 0},
    "alloc": {"cupti": False, "nvml": False},
    "torch.profiler": "peer",
    "app": "app",
    "app-no-findings": "app",  # the app without its findings pass (raw records every 2 s)
    "remote": "app",           # the session process of the app, no app (see the module doc)
}
SWITCH_AT = 64
# decode step -> action, and how the CUDA graphs are dropped around each action ("reset":
# torch._dynamo.reset(), a recompile; "drop": in place, tuiprof.engine.graphs; "": kept)
SCHEDULES = {"recapture": ({64: "detach", 1024: "attach", 1536: "detach"}, "reset"),
             "rerecord": ({64: "detach", 512: "attach", 576: "detach", 1024: "attach",
                           1088: "detach", 1536: "attach", 1600: "detach"}, "drop"),
             "burst-attach": ({256: "attach", 320: "detach", 1024: "attach", 1088: "detach",
                               1600: "attach", 1664: "detach"}, "")}
PARTS = ("cupti", "cupti-memory", "cupti-attached", "listener", "nvml", "alloc")


def preimport(model: str, app: bool = False) -> None:
    """Everything a child would import, except what touches CUDA, CUPTI or NVML."""
    import torch  # noqa: F401

    if app:
        from tuiprof.sessions import RemoteControl  # noqa: F401
        from tuiprof.ui.app import make_app  # noqa: F401

    from tuiprof.engine.families import get_family
    from tuiprof.engine.generate import Engine  # noqa: F401
    from tuiprof.engine.load import load_engine  # noqa: F401
    from tuiprof.engine.source import resolve_model
    from tuiprof.profiler import Profiler  # noqa: F401
    from tuiprof.store import SessionStore  # noqa: F401

    family = get_family(resolve_model(model).family)
    preload = getattr(family, "preload", None)
    if preload is not None:
        preload()


class Stamps:
    """Times the decode steps from the outside: one counter per step, nothing else."""

    def __init__(self, skip: int) -> None:
        self.skip = skip
        self.n = 0
        self.t_first = 0.0
        self.t_last = 0.0
        self.gpu_ms: list[float] = []
        self.ends: list[float] = []  # every decode step's end (perf_counter), first 100,000
        self.digest = 0  # of every decode token id: runs that decode the same tokens agree

    def step(self, ev) -> None:
        if ev.phase != "decode":
            return
        self.n += 1
        self.digest = (self.digest * 1_000_003 + int(ev.token_id)) % (1 << 61)
        if len(self.ends) < 100_000:
            self.ends.append(time.perf_counter())
        if self.n == self.skip:
            self.t_first = time.perf_counter()
        elif self.n > self.skip:
            self.t_last = time.perf_counter()
            if ev.gpu_ms is not None and len(self.gpu_ms) < 100_000:
                self.gpu_ms.append(ev.gpu_ms)

    def result(self) -> dict:
        steps = self.n - self.skip
        out = {"steps": steps, "decode_s": self.t_last - self.t_first if steps > 0 else None,
               "tokens_digest": self.digest}
        if self.gpu_ms:
            out["gpu_ms_median"] = statistics.median(self.gpu_ms)
        return out

    def segments(self, cuts: list[int], settle: int = 16) -> dict:
        """Median ms/step between consecutive ``cuts`` (decode step numbers, 1-based), leaving
        out ``settle`` steps after each cut (the new graphs' warm-up and recording), and the
        extra seconds those settling steps took beyond that median."""
        out = {}
        bounds = [self.skip] + cuts + [len(self.ends)]
        for a, b in zip(bounds, bounds[1:]):
            d = [y - x for x, y in zip(self.ends[a - 1:b - 1], self.ends[a:b])]
            if len(d) <= settle + 8:
                continue
            med = statistics.median(d[settle:])
            out[f"{a}-{b}"] = {"ms": round(1e3 * med, 4),
                               "settle_extra_s": round(sum(d[:settle]) - settle * med, 4)}
        return out


def _engine_kwargs(a: argparse.Namespace) -> dict:
    return {"model_spec": a.model, "device": a.device, "mode": a.mode, "batch": a.batch,
            "max_new_tokens": a.tokens + a.skip + 1, "prompt_len": a.prompt_len, "seed": 0}


def _engine_spec(kw: dict):
    from tuiprof.spec import EngineSpec

    kw = dict(kw)
    return EngineSpec.resolve(kw.pop("model_spec"), **kw)


def child(name: str, a: argparse.Namespace, conn) -> None:
    """One run in a fresh process: decode, send the figures, exit."""
    t0 = time.perf_counter()
    out: dict = {"config": name}
    try:
        cfg = CONFIGS[name]
        stamps = Stamps(a.skip)
        kw = _engine_kwargs(a)
        if cfg == "app":
            out.update(_app_run(a, kw, ui=name))
        elif cfg is None or cfg == "peer":
            from tuiprof.engine.events import NullListener
            from tuiprof.engine.load import load_engine

            class _Listener(NullListener):
                def token_finished(self, ev) -> None:
                    stamps.step(ev)

            eng = load_engine(**kw)
            eng.listener = _Listener()
            if cfg == "peer":
                import torch
                from torch.profiler import ProfilerActivity, profile

                acts = [ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU]
                prof = profile(activities=acts)
                prof.__enter__()
                eng.start()
                eng.join()
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                t1 = time.perf_counter()
                prof.__exit__(None, None, None)
                out["peer_exit_s"] = time.perf_counter() - t1
            else:
                eng.start()
                eng.join()
            out["state"] = "done"
        else:
            from tuiprof.profiler import Profiler
            from tuiprof.spec import ProfilerOptions
            from tuiprof.store import SessionStore

            store = SessionStore()
            prof = Profiler(store, ProfilerOptions(**cfg, engine=_engine_spec(kw)))
            finished = prof.token_finished
            seen = [0]

            def token_finished(ev) -> None:
                finished(ev)
                stamps.step(ev)
                if ev.phase != "decode":
                    return
                seen[0] += 1
                plan = SCHEDULES.get(name, ({}, ""))[0]
                if seen[0] in plan:
                    recapture(plan[seen[0]], SCHEDULES[name][1])
                if seen[0] != SWITCH_AT:
                    return
                if name == "detached" and prof.cupti is not None:
                    c, prof.cupti = prof.cupti, None  # what detaching between bursts would save
                    c.stop()
                elif name == "late-attach" and attach_cupti():
                    out["kernels_at_attach"] = store._counters["kernels"]

            def attach_cupti() -> bool:
                """CUPTI as in ``default`` from here on (its next burst 8 steps later)."""
                prof.options.cupti = True
                prof.start_collector("cupti")
                if prof.cupti is not None:
                    prof.cupti.restart_sampling(store.next_seq())
                return prof.cupti is not None

            def recapture(action: str, drop: str) -> None:
                """On the engine thread, at a step's end: finalize CUPTI or attach it again,
                the CUDA graphs dropped (``drop``, see SCHEDULES; recorded again at the next
                steps) after an attach and before a finalize. Resetting inductor's cudagraph
                trees alone would leave the compiled function holding a shut-down tree manager,
                hence dynamo's whole reset for "reset"."""
                def drop_graphs() -> None:
                    if drop == "drop":
                        from tuiprof.engine.graphs import drop_cuda_graphs

                        out.setdefault("dropped", []).append(drop_cuda_graphs())
                    elif drop == "reset":
                        from torch._dynamo import reset

                        reset()

                t = time.perf_counter()
                if action == "attach":
                    attach_cupti()
                    out["kernels_at_reattach"] = store._counters["kernels"]
                    if prof.cupti is not None:
                        c0 = time.perf_counter()
                        for _ in range(20):
                            ts = prof.cupti.clock()
                        us = (time.perf_counter() - c0) / 20 * 1e6
                        out.setdefault("clock", []).append(
                            f"{us:.1f} us, {(time.time_ns() - ts) / 1e6:+.1f} ms")
                    drop_graphs()
                else:
                    drop_graphs()
                    if prof.cupti is not None:
                        if "kernels_at_reattach" in out:
                            prof.cupti.flush()
                            n = store._counters["kernels"] - out["kernels_at_reattach"]
                            out["kernels_reattached"] = n
                            out.setdefault("kernels_per_attach", []).append(n)
                        c, prof.cupti = prof.cupti, None
                        c.stop()
                out.setdefault("actions", []).append(
                    f"{seen[0]}:{action} {1e3 * (time.perf_counter() - t):.0f} ms")

            prof.token_finished = token_finished  # type: ignore[method-assign]
            prof.start()
            prof.wait()
            if prof.cupti is not None:  # before stop(), which lets the collector go
                out["detaches"] = prof.cupti.detaches
            prof.stop()
            out["state"] = prof.status.state
            out["kernels"] = store._counters["kernels"]
            if "kernels_at_attach" in out:
                out["kernels_after_attach"] = store._counters["kernels"] - out["kernels_at_attach"]
            if prof.status.state == "error":
                out["error"] = prof.status.message
            over = store.overhead if hasattr(store, "overhead") else None
            if isinstance(over, dict):
                out["own_pct"] = over.get("pct")
        if cfg != "app":
            out.update(stamps.result())
            if name in SCHEDULES:
                out["seg_ms"] = stamps.segments(sorted(SCHEDULES[name][0]))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as one line
        out["error"] = f"{exc.__class__.__name__}: {str(exc)[:200]}"
    out["child_s"] = time.perf_counter() - t0
    out["cpu_s"] = time.process_time()  # since the fork: every thread of this run's process
    conn.send(out)
    conn.close()
    os._exit(0)


def _app_run(a: argparse.Namespace, kw: dict, ui: str = "app") -> dict:
    """The live app over a session process of its own until the session is done; the decode
    time from the session's per-step end times (``--skip`` steps left out, as in Stamps).
    ``ui``: ``app``, ``app-no-findings`` or ``remote`` (no app: the session process alone,
    pulled once a second by the control's own loop)."""
    import asyncio
    import tempfile

    from tuiprof.spec import ProfilerOptions
    from tuiprof.sessions import RemoteControl
    from tuiprof.ui.app import make_app

    ctl = RemoteControl(ProfilerOptions(engine=_engine_spec(kw)), {"ring_tokens": 64})
    ctl.start()
    got: dict = {}
    cpu0 = time.process_time()

    async def wait_done() -> None:
        t_end = time.monotonic() + a.run_timeout
        while ctl.status.state not in ("done", "stopped", "error"):
            if time.monotonic() > t_end:
                got["error"] = "timed out"
                break
            await asyncio.sleep(0.25)
        if ctl.status.state == "error":
            got["error"] = ctl.status.message
        got["app_cpu_s"] = time.process_time() - cpu0  # this process: the app (or the control)
        got["session_cpu_s"] = _cpu_s(ctl.pid)
        view = ctl.view(raw=True, raw_tokens=0)  # one last pull, waited for
        ends = sorted(t.end_ns for t in view.tokens if t.done and t.phase == "decode")
        got["pulls"] = ctl.pulls
        over = view.overhead or {}  # the session's own figure, answering the UI included
        got["own_pct"], got["serve_s"] = over.get("pct"), over.get("serve_s")
        if len(ends) > a.skip:
            got["steps"] = len(ends) - a.skip
            got["decode_s"] = (ends[-1] - ends[a.skip - 1]) / 1e9

    async def run() -> None:
        if ui == "remote":
            await wait_done()
            return
        app = make_app(ctl, title="overhead-app", export_dir=Path(tempfile.mkdtemp()),
                       refresh_hz=4.0, findings_interval=2.0 if ui == "app" else 1e9)
        async with app.run_test(size=(200, 50)) as pilot:
            await wait_done()
            await pilot.press("q")

    try:
        asyncio.run(run())
    finally:
        ctl.stop()
        ctl.close()
    got["state"] = "done" if "error" not in got else "error"
    return got


def _cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), all threads."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return None


CPUS: set[int] = set()  # --cpus: every child runs on these CPUs only (empty: wherever)


def parse_cpus(text: str) -> set[int]:
    """``"4-7,12"`` → {4, 5, 6, 7, 12}."""
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _pinned(target, cpus: set[int], *args) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    target(*args)


def fork_run(target, args: tuple, config: str, timeout: float) -> dict:
    """``target(*args, conn)`` in a forked child, which sends one dict on ``conn`` and exits;
    returns it with the process's wall time (fork to exit) as ``whole_s``. With ``CPUS`` the
    child and every thread it starts run on those CPUs only (the same for every configuration:
    a process landing on other cores made eager runs differ by ±40 % on the H100 host)."""
    ctx = mp.get_context("fork")
    parent, kid = ctx.Pipe(duplex=False)
    t0 = time.perf_counter()
    p = ctx.Process(target=_pinned, args=(target, set(CPUS), *args, kid))
    p.start()
    kid.close()
    res: dict = {"config": config, "error": "no result"}
    if parent.poll(timeout):
        try:
            res = parent.recv()
        except EOFError:
            pass
    p.join(30)
    if p.is_alive():
        p.kill()
        p.join()
        res.setdefault("error", "killed after the run's timeout")
    res["whole_s"] = time.perf_counter() - t0
    res["exitcode"] = p.exitcode
    return res


def with_baseline(names: list[str], baseline: str, known) -> bool:
    """Put ``baseline`` first in ``names`` (in place) unless it is there; False, having said
    which, if a name is not a known configuration."""
    if baseline not in names:
        names.insert(0, baseline)
    bad = [n for n in names if n not in known]
    if bad:
        print(f"unknown configuration {bad[0]!r}: pick from {', '.join(known)}")
    return not bad


def write_json(a: argparse.Namespace, rounds: list, table: dict) -> None:
    """The run's arguments, every round's results and the table, where ``--json`` says."""
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "rounds": rounds, "table": table},
                                           indent=1))


def round_order(names: list[str], r: int) -> list[str]:
    """Round ``r``'s order (see :func:`interleaved_rounds`). Reversing every odd round of a
    rotation, as an earlier version did, gives two configurations the same order every round."""
    k = r % len(names)
    order = names[k:] + names[:k]
    return order[::-1] if (r // len(names)) % 2 else order


def interleaved_rounds(names: list[str], rounds: int, deadline: float, t_start: float,
                       run: Callable[[str], dict], describe: Callable[[dict], str]) -> list:
    """Every configuration once per round, in :func:`round_order` (rotating, and backwards in
    every other cycle of rotations: A B, B A, B A, A B; A B C, B C A, C A B, C B A, A C B,
    B A C), so each is first equally often and the host's drift spreads over all of them; no
    round starts after ``deadline`` seconds from ``t_start`` (0: no limit)."""
    out: list[list[dict]] = []
    for r in range(rounds):
        if deadline and time.perf_counter() - t_start > deadline:
            print(f"# deadline: {r} rounds", flush=True)
            break
        order = round_order(names, r)
        rnd = []
        for name in order:
            res = run(name)
            rnd.append(res)
            print(f"round {r} {name:15s} {describe(res)}"
                  + (f"  ERROR {res['error']}" if res.get("error") else ""), flush=True)
        out.append(rnd)
    return out


def run_one(name: str, a: argparse.Namespace) -> dict:
    return fork_run(child, (name, a), name, a.run_timeout)


def summarise(rounds: list[list[dict]], names: list[str]) -> dict:
    """Per configuration: ratios to the same round's ``none``, medians and totals."""
    table = {}
    for name in names:
        ratios, wratios, dec, whole, base_dec, base_whole = [], [], [], [], [], []
        for rnd in rounds:
            by = {r["config"]: r for r in rnd}
            r, b = by.get(name), by.get("none")
            if not r or not b or r.get("error") or b.get("error") or not r.get("decode_s") \
                    or not b.get("decode_s"):
                continue
            ratios.append(r["decode_s"] / b["decode_s"])
            wratios.append(r["whole_s"] / b["whole_s"])
            dec.append(r["decode_s"])
            whole.append(r["whole_s"])
            base_dec.append(b["decode_s"])
            base_whole.append(b["whole_s"])
        if not ratios:
            table[name] = {"rounds": 0}
            continue
        steps = max(1, rounds[0][0].get("steps") or 1)
        table[name] = {
            "rounds": len(ratios),
            "decode_ratio_median": statistics.median(ratios),
            "decode_ratio_min": min(ratios), "decode_ratio_max": max(ratios),
            "decode_ratio_totals": sum(dec) / sum(base_dec),
            "whole_ratio_median": statistics.median(wratios),
            "ms_per_step_median": 1e3 * statistics.median(dec) / steps,
            "whole_s_median": statistics.median(whole),
        }
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--device", default=None)
    p.add_argument("--mode", default="eager", choices=("eager", "compiled"))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--tokens", type=int, default=256, help="timed decode steps per run")
    p.add_argument("--skip", type=int, default=8, help="decode steps before the timed ones")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--configs", default="none,default")
    p.add_argument("--parts", action="store_true", help="also each part alone: " + ", ".join(PARTS))
    p.add_argument("--peer", action="store_true", help="also torch.profiler (CUDA activities)")
    p.add_argument("--deadline", type=float, default=0,
                   help="start no round after this many seconds (0: no limit)")
    p.add_argument("--run-timeout", type=float, default=300)
    p.add_argument("--warm-compile", default="auto", choices=("auto", "yes", "no"),
                   help="one untimed run first (auto: in compiled mode)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    names = [n for n in a.configs.split(",") if n]
    if a.parts:
        names += [n for n in PARTS if n not in names]
    if a.peer and "torch.profiler" not in names:
        names.append("torch.profiler")
    if not with_baseline(names, "none", CONFIGS):
        return 2
    t_start = time.perf_counter()
    preimport(a.model, app=any(CONFIGS.get(n) == "app" for n in names))
    print(f"# {a.model} {a.mode} batch {a.batch}: {a.tokens} timed decode steps per run "
          f"after {a.skip}; imports {time.perf_counter() - t_start:.1f} s", flush=True)
    if a.warm_compile == "yes" or (a.warm_compile == "auto" and a.mode == "compiled"):
        res = run_one("none", a)
        print(f"# warm-up run (untimed, fills the compile caches): {res['whole_s']:.1f} s"
              + (f"  ERROR {res['error']}" if res.get("error") else ""), flush=True)

    def describe(res: dict) -> str:
        dec = res.get("decode_s")
        extra = (f"; kernel records after the attach {res['kernels_after_attach']}"
                 if "kernels_after_attach" in res else "")
        if res.get("serve_s") is not None:
            extra += (f"; session's own {res['own_pct']} % (answering the UI "
                      f"{res['serve_s']:.2f} s, {res['pulls']} pulls)")
        if res.get("seg_ms"):
            extra += "; " + ", ".join(f"{k}: {v['ms']:.3f} ms (+{v['settle_extra_s']:.2f} s)"
                                      for k, v in res["seg_ms"].items())
            extra += (f"; {res.get('actions')}; kernels per attach "
                      f"{res.get('kernels_per_attach')}; dropped {res.get('dropped')}; "
                      f"clock {res.get('clock')}")
        if res.get("detaches"):
            extra += f"; {res['detaches']} detaches, {res.get('kernels')} kernel records"
        if res.get("tokens_digest") is not None:
            extra += f"; tokens #{res['tokens_digest'] % 100000:05d}"
        if res.get("cpu_s") is not None:
            extra += f"; CPU {res['cpu_s']:.1f} s"
        if res.get("app_cpu_s") is not None:
            extra += (f"; CPU s: this process {res['app_cpu_s']:.1f}, session process "
                      f"{res.get('session_cpu_s')}")
        return f"decode {dec if dec is None else round(dec, 3)} s whole {res['whole_s']:.2f} s" + extra

    rounds = interleaved_rounds(names, a.rounds, a.deadline, t_start,
                                lambda name: run_one(name, a), describe)
    table = summarise(rounds, names)
    print(f"\n| configuration | rounds | decode / none: median (min-max) | ratio of totals | "
          f"whole process / none | ms/step | whole s |")
    print("|---|---|---|---|---|---|---|")
    for name, row in table.items():
        if not row.get("rounds"):
            print(f"| {name} | 0 | – | – | – | – | – |")
            continue
        print(f"| {name} | {row['rounds']} | {row['decode_ratio_median']:.3f} "
              f"({row['decode_ratio_min']:.3f}-{row['decode_ratio_max']:.3f}) | "
              f"{row['decode_ratio_totals']:.3f} | {row['whole_ratio_median']:.3f} | "
              f"{row['ms_per_step_median']:.2f} | {row['whole_s_median']:.1f} |")
    write_json(a, rounds, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
