"""What tuiprof's collection costs the decode loop: interleaved windows in one process.

One engine generates continuously (loop mode). A hook on the engine thread (:class:`Windows`)
runs a plan of windows back to back: at a token boundary it switches the configuration and
times the next ``n`` decode tokens, then switches again at the very next boundary, so no token
goes untimed inside a block. Configurations:

* ``bare``  — the engine alone: CUPTI subscribed with every activity kind off (device, memory,
              API, graph), the NVML sampler paused, the profiler's per-token listener bypassed, no
              allocator statistics;
* ``auto``  — tuiprof's defaults for the mode, as ``tuiprof --model`` collects: bursts of 4
              traced tokens (kernels, memcpy, memset, API subset) in every 256 eager / 4,096
              compiled tokens, memory records always, NVML at 10 Hz, allocator statistics (every
              eager token, every 64th compiled one), per-token attribution;
* ``full``  — (``--full``) every token traced, allocator statistics every token;
* ``auto-now`` — (``--parts``) ``auto`` with the store's per-token work done right after each
              token's sync, as before it moved to ``token_launched``;
* ``attached`` — (``--parts``) CUPTI as between bursts (memory records on, nothing else) and
              nothing else of tuiprof: what CUPTI costs by merely being there;
* ``none`` — (``--none``, eager only) no tuiprof at all in the window: CUPTI *finalized* (not
              merely quiet: its activity API detached, as in a process that never loaded it; a
              ``cuptiFinalize`` is clean in eager mode, which has no CUDA graphs) and attached
              again for the next window, NVML paused, no listener, no allocator statistics.
              With it, ratios are to ``none``: the user's baseline (no tuiprof at all) measured inside
              one process, free of the ±30 % that separates one eager process from the next
              on the H100 host (docs/performance.md#against-no-tuiprof-at-all). Compiled windows leave it out:
              detaching there drops the CUDA graphs, whose re-recording would land in the
              windows (bench/overhead/overhead_procs.py measures compiled);
* ``torch.profiler`` — (``--peer``) the peer, CUDA activities only, in a second phase whose
              process has no tuiprof CUPTI subscriber; it is started and stopped around its
              window, and its trace processing at stop is reported apart, not in the window.

The H100 host's speed drifts by ±10% over seconds, more than the effect measured, so windows
are short and alternate A B, B A, … (``--eager-tokens`` 32 / ``--compiled-tokens`` 128), and
results are grouped in **blocks**: a block holds one sampling period of ``auto`` tokens (256
eager, 4,096 compiled: exactly one traced burst, as in a real session, since ``auto``'s token
sequence runs on across its windows) and as many ``bare`` tokens in between. A window's figure
is its whole wall time: the sum of its tokens' start-to-next-start intervals (a loop's new
prefill is left out), so stalls between tokens count, and the forced flush and folding of its
records at its end are included. Per block: each configuration's wall time per token and the
ratio to ``bare``; the table gives the median of the block ratios (min–max) and the ratio of
the totals. Per window the bench also keeps the median token interval (the steady cost), mean
minus median (bursts and stalls) and the median CUDA-event time of a step. On the H100::

    python bench/overhead/overhead.py --blocks 12 --json $OUT/overhead.json
    python bench/overhead/overhead.py --batch 32 --blocks 4 --json $OUT/overhead-b32.json   # batched

``bench/overhead/ui_overhead.py`` runs the same :class:`Windows` in a session process with the app open.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuiprof.collect.cupti_collector import BURST  # noqa: E402
from tuiprof.profiler import Profiler  # noqa: E402
from tuiprof.spec import EngineSpec, ProfilerOptions  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402

_BASE = {"cupti": "off", "listener": None, "nvml": False, "alloc": 0, "peer": False}
CONFIGS = {
    "bare": {},
    "auto": {"cupti": "auto", "listener": True, "nvml": True, "alloc": "auto"},
    "full": {"cupti": "full", "listener": True, "nvml": True, "alloc": 1},
    "auto-now": {"cupti": "auto", "listener": "now", "nvml": True, "alloc": "auto"},
    "attached": {"cupti": "idle"},
    "none": {"cupti": "detached"},
    # --ablate: one part each on top of bare
    "listener": {"listener": True},
    "alloc": {"listener": True, "alloc": "auto"},
    "nvml": {"nvml": True},
    "bursts": {"cupti": "auto", "listener": True},
    "torch.profiler": {"cupti": None, "peer": True},
    # --ablate-none: one part each on top of none (CUPTI finalized, as between the default's
    # bursts): the per-step listener (store, CUDA-event times), with allocator reads, NVML
    "none+listener": {"cupti": "detached", "listener": True},
    "none+alloc": {"cupti": "detached", "listener": True, "alloc": "auto"},
    "none+nvml": {"cupti": "detached", "nvml": True},
}
NONE_PARTS = ["none", "none+listener", "none+alloc", "none+nvml"]


T0 = time.monotonic()  # the bench's start (main resets it): --deadline counts from here



def sayer(t0: float):
    """``say(text)``: a line stamped with the seconds since ``t0``, flushed at once."""
    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f} s] {text}", flush=True)
    return say


def still_waiting(status, end: float, what: str, who: str) -> None:
    """Leave in one line when the session failed or the wait ran past ``end``."""
    if status.state == "error":
        raise SystemExit(f"{who}: {status.message}")
    if time.monotonic() > end:
        raise SystemExit(f"{who}: timed out waiting for {what}")

def spec(name: str) -> dict:
    return {**_BASE, **CONFIGS[name]}


class Windows:
    """Engine-thread side: runs a plan of ``(configuration, tokens)`` windows back to back.

    Also a session-process hook (``RemoteControl(hook="bench.overhead.overhead:Windows")``): the ops
    ``("start", [[cfg, n], ...])`` and ``("poll",)`` run a plan without blocking the server."""

    def __init__(self, prof: Profiler) -> None:
        self.prof = prof
        self.plan: deque = deque()
        self.results: list[dict] = []
        self.done = threading.Event()
        self.error: str | None = None
        self.cfg = "auto"
        self.listener: bool | str = True
        self.quiet = False
        self.timing = False
        self.need = 0
        self.t_prev: int | None = None
        self.intervals: list[int] = []
        self.gpu: list[float] = []
        self.apply_ms = 0.0
        self.torch_prof = None
        self._started, self._finished = prof.token_started, prof.token_finished
        prof.token_started = self.token_started  # type: ignore[method-assign]
        prof.token_finished = self.token_finished  # type: ignore[method-assign]

    # ------------------------------------------------------------ caller's side
    def start_plan(self, plan: list) -> None:
        """Hand ``plan`` to the engine thread (``n == 0``: only apply the configuration)."""
        self.results, self.error = [], None
        self.done.clear()
        self.plan = deque((str(c), int(n)) for c, n in plan)

    def run_plan(self, plan: list, timeout: float = 600) -> list[dict]:
        """Run ``plan`` and return every window's figures, in order."""
        self.start_plan(plan)
        end = time.monotonic() + timeout
        while not self.done.wait(1.0):
            st = self.prof.status
            if st.state in ("error", "stopped", "done"):
                raise RuntimeError(f"the engine ended during a plan: {st.state} {st.message}")
            if time.monotonic() > end:
                raise RuntimeError(f"a plan did not end within {timeout} s")
        if self.error:
            raise RuntimeError(self.error)
        return self.results

    def handle(self, op: str, arg=None):
        """Requests from another process. They must not block: the session server answers
        the UI's pulls on the same connection while a plan runs."""
        if op == "start":
            self.start_plan(arg)
            return None
        if op == "poll":
            st = self.prof.status
            if not self.done.is_set() and st.state in ("error", "stopped", "done"):
                self.error = f"the engine ended during a plan: {st.state} {st.message}"
            return {"done": self.done.is_set() or self.error is not None,
                    "error": self.error, "results": self.results}
        raise ValueError(op)

    # ------------------------------------------------------------ configurations
    def _quiet(self) -> None:
        """Every CUPTI activity kind off (device, memory, API): the engine as without tuiprof."""
        c = self.prof.cupti
        if c is None or self.quiet:
            return
        c._set_device_kinds(False)
        c._set_graph_kind(False)        # graph records too (compiled mode has them between bursts)
        stay, c.api_kinds_stay_on = c.api_kinds_stay_on, False
        c._set_api_records(False)       # the API kinds off too, whatever the mode's policy
        c.api_kinds_stay_on = stay
        self._memory(c, False)
        c.paused = True                 # a listener, if on, must not start bursts
        self.quiet = True

    def _wake(self) -> None:
        """Back to tuiprof's state between bursts: memory records on (device kinds and API
        records follow the bursts)."""
        c = self.prof.cupti
        if c is None or not self.quiet:
            return
        self._memory(c, True)
        self.quiet = False

    @staticmethod
    def _memory(c, on: bool) -> None:
        k = c._cupti.ActivityKind.MEMORY2
        if k in c._enabled_kinds:
            (c._cupti.activity_enable if on else c._cupti.activity_disable)(k)

    def _attached(self, on: bool) -> None:
        """CUPTI finalized (``none``) or attached again; graphs dropped as the profiler does."""
        from tuiprof.engine.graphs import drop_cuda_graphs  # noqa: PLC0415

        c = self.prof.cupti
        if c is None or c.attached == on:
            return
        if on:
            if c.attach():
                drop_cuda_graphs()
            self.quiet = False  # attached with tuiprof's kinds on: the configuration decides
        else:
            if self.prof.status.mode != "eager":
                raise ValueError("none (CUPTI finalized) is measured in eager windows only")
            drop_cuda_graphs()
            c.detach()

    def _align(self, n: int) -> None:
        """With CUPTI attached for bursts only (the default), an ``auto`` window starts 16
        tokens (mod its length ``n``, which divides the sampling period) into the period, so no
        window boundary splits the tokens CUPTI is attached for (2 before a burst's warm-up to
        4 after it): each period costs one attach and one finalize, as in a session."""
        c = self.prof.cupti
        if c is None or not self.prof._may_detach or not c.bursts_only:
            return
        period = c.sample_every * BURST
        phase = (self.prof.store.next_seq() - c._origin) % period
        c._origin += (phase - 16) % n

    def apply(self, cfg: str, n: int = 0) -> None:
        sp, prof = spec(cfg), self.prof
        if self.torch_prof is not None:
            self._stop_peer()
        if sp["cupti"] == "detached":
            self._attached(False)
            if prof.cupti is not None:  # a listener must not attach CUPTI for a burst
                prof.cupti.paused = True
        elif sp["cupti"] in ("off", "idle") or not prof._may_detach:
            self._attached(True)
        # auto/full with CUPTI attached for bursts only: the profiler attaches for the bursts
        if sp["cupti"] == "off":
            self._quiet()
        elif sp["cupti"] not in (None, "detached") and prof.cupti is not None:
            self._wake()
            c = prof.cupti
            c.paused = sp["cupti"] == "idle"
            if c.paused:  # no listener, so no burst switching: as between bursts
                c._set_device_kinds(False)
                c._set_api_records(False)
            c.sample_every = 1 if sp["cupti"] == "full" else prof._sample_every(prof.status.mode)
            if n:
                self._align(n)
        if sp["peer"]:
            import torch  # noqa: PLC0415

            self.torch_prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CUDA])
            self.torch_prof.__enter__()
        if prof.nvml is not None:
            prof.nvml.paused = not sp["nvml"]
        prof.options.alloc_every = sp["alloc"]
        prof.options.overlap = sp["listener"] != "now"
        self.listener = sp["listener"]
        self.cfg = cfg

    def _stop_peer(self) -> float:
        t0 = time.perf_counter()
        self.torch_prof.__exit__(None, None, None)
        self.torch_prof = None
        return time.perf_counter() - t0

    # ------------------------------------------------------------ engine thread
    def token_started(self, phase, mode, step, cycle, start_ns):
        if self.timing and self.t_prev is not None:
            self.intervals.append(time.perf_counter_ns() - self.t_prev)
            self.t_prev = None
        if phase == "decode" and (self.timing or self.plan):
            try:
                self._boundary(mode)
            except Exception as exc:  # report it to the caller; generation goes on
                self.error = f"{type(exc).__name__}: {exc}"
                self.plan.clear()
                self.timing = False
                self.done.set()
            if self.timing:
                self.t_prev = time.perf_counter_ns()
        if self.listener:
            self._started(phase, mode, step, cycle, start_ns)

    def _boundary(self, mode: str) -> None:
        if self.timing and len(self.intervals) >= self.need:
            self._close(mode)
        while not self.timing and self.plan:
            cfg, n = self.plan.popleft()
            t0 = time.perf_counter()
            self.apply(cfg, n)
            self.apply_ms = (time.perf_counter() - t0) * 1e3
            if n > 0:
                self.timing, self.need, self.intervals, self.gpu = True, n, [], []
        if not self.timing and not self.plan:
            self.done.set()

    def _close(self, mode: str) -> None:
        t0 = time.perf_counter_ns()
        stop_s = None
        if self.torch_prof is not None:
            stop_s = self._stop_peer()
            flush_ns = 0
        else:
            if self.prof.cupti is not None and not self.quiet:
                self.prof.cupti.flush()  # the window pays for handling its own records
            flush_ns = time.perf_counter_ns() - t0
        iv = self.intervals
        total = sum(iv) + flush_ns
        med = statistics.median(iv)
        self.results.append({
            "config": self.cfg, "mode": mode, "tokens": len(iv), "wall_ns": total,
            "ms_per_token": total / len(iv) / 1e6, "median_interval_us": med / 1e3,
            "excess_us": (total / len(iv) - med) / 1e3, "flush_ms": flush_ns / 1e6,
            "gpu_ms": statistics.median(self.gpu) if self.gpu else None,
            "peer_stop_s": stop_s, "apply_ms": self.apply_ms})
        self.timing = False

    def token_finished(self, ev):
        if self.timing and ev.phase == "decode" and ev.gpu_ms is not None:
            self.gpu.append(ev.gpu_ms)
        if self.listener:
            self._finished(ev)


def block_plan(configs: list[str], rounds: int, n: int) -> list[tuple[str, int]]:
    """``rounds`` rounds of ``configs``, every other round reversed (A B, B A, …)."""
    return [(c, n) for r in range(rounds) for c in (configs if r % 2 == 0 else configs[::-1])]


def period(mode: str) -> int:
    """Decode tokens in one sampling period of ``auto`` (one burst)."""
    from tuiprof.sampling import AUTO_SAMPLE_EVERY  # noqa: PLC0415

    return BURST * AUTO_SAMPLE_EVERY[mode]


def run_phase(a: argparse.Namespace, configs: list[str], cupti: bool, out: dict,
              factory=None) -> None:
    """One engine, every mode of ``--modes`` in turn, ``--blocks`` blocks of ``configs``.
    ``cupti=False``: no CUPTI subscriber at all in this process (the torch.profiler phase).
    ``factory``: builds the engine (``Profiler``'s ``engine_factory``; e.g. over a model that
    is already loaded and compiled), instead of loading ``--model``."""
    store = SessionStore(ring_tokens=16)
    opts = ProfilerOptions(cupti=cupti, engine=EngineSpec.resolve(
        a.model, device=a.device, mode="eager", loop=True,
        max_new_tokens=a.cycle_tokens, prompt_len=16, batch=a.batch, max_batch=a.batch))
    prof = Profiler(store, opts, engine_factory=factory)
    win = Windows(prof)
    prof.start()
    t_run = time.monotonic()
    tag = "tuiprof" if cupti else "peer"

    say = sayer(t_run)

    def wait_state(pred, seconds: float, what: str) -> None:
        end = time.monotonic() + seconds
        while not pred():
            still_waiting(prof.status, end, what, "overhead")
            time.sleep(0.1)

    try:
        wait_state(lambda: prof.status.state == "decode", 900, "decode")
        say(f"decoding ({prof.status.mode}), CUPTI {'on' if cupti else 'off'}")
        for mode in a.modes.split(","):
            if mode != prof.status.mode:
                win.run_plan([("auto" if cupti else "bare", 0)])  # compile as a session would
                prof.toggle_mode()
                wait_state(lambda: prof.status.mode == mode and prof.status.state == "decode",
                           900, f"{mode} decode")
                say(f"decoding ({mode})")
            n = a.eager_tokens if mode == "eager" else a.compiled_tokens
            rounds = max(2, period(mode) // n)  # auto windows of one block: one period
            rounds += rounds % 2                # even: a block ends where it began (bare)
            win.run_plan([(configs[0], a.warmup)])  # clocks, allocator, caches in this mode
            blocks = getattr(a, "mode_blocks", {}).get(mode, a.blocks)
            here = [c for c in configs if c != "none" or mode == "eager"]
            say(f"warmed up; {blocks} blocks of {rounds} rounds of {here} × {n} tokens")
            for b in range(blocks):
                if past_deadline(a, f"{b} blocks"):
                    break
                res = win.run_plan(block_plan(here, rounds, n))
                for i, w in enumerate(res):
                    w.update(block=b, round=i // len(here), phase=tag)
                out["windows"].extend(res)
                tot = _totals(res)
                base = tot.get("bare")
                say(f"[{mode}] block {b + 1:>2}: " + "  ".join(
                    f"{c} {v:.3f} ms/token" + (f" ({v / base:.3f})" if base and c != "bare"
                                               else "") for c, v in tot.items()))
            if getattr(a, "ablate_none", False) and mode == "eager" and cupti:
                ablate_none(a, win, n, tag, out, say)
        win.run_plan([("auto" if cupti else "bare", 0)])
    finally:
        prof.stop()
    v = store.view(raw=False)
    out.setdefault("session", {})[tag] = {
        "counters": v.counters, "api": {k: st.count for k, st in v.api.items()},
        "collectors": v.collectors, "overhead": v.overhead}
    out["meta"] = {k: store.meta.get(k) for k in ("model", "device_name", "dtype", "torch",
                                                  "driver", "sample_every", "batch")}


def past_deadline(a: argparse.Namespace, what: str) -> bool:
    """True (and says so) once ``--deadline`` seconds have passed since the bench started."""
    if a.deadline and time.monotonic() - T0 > a.deadline:
        print(f"[{time.monotonic() - T0:6.1f} s] deadline: {what}", flush=True)
        return True
    return False


def ablate_none(a: argparse.Namespace, win: "Windows", n: int, tag: str, out: dict, say) -> None:
    """Blocks of ``NONE_PARTS`` windows (A B C D, D C B A, …): what each per-step part costs
    against no tuiprof, without bursts (no window here attaches CUPTI)."""
    say(f"parts: {a.ablate_blocks} blocks of 4 rounds of {NONE_PARTS} × {n} tokens")
    for b in range(a.ablate_blocks):
        if past_deadline(a, f"{b} blocks of parts"):
            break
        res = win.run_plan(block_plan(NONE_PARTS, 4, n))
        for i, w in enumerate(res):
            w.update(block=b, round=i // len(NONE_PARTS), phase=f"{tag}, parts")
        out["windows"].extend(res)
        tot = _totals(res)
        say(f"[parts] block {b + 1:>2}: " + "  ".join(
            f"{c} {v / tot['none']:.3f}" for c, v in tot.items() if c != "none"))


def _totals(windows: list[dict]) -> dict[str, float]:
    """Configuration -> whole wall time per token (ms) over the given windows."""
    acc: dict[str, list] = {}
    for w in windows:
        a = acc.setdefault(w["config"], [0, 0])
        a[0] += w["wall_ns"]
        a[1] += w["tokens"]
    return {c: ns / max(1, n) / 1e6 for c, (ns, n) in acc.items()}


def table(windows: list[dict]) -> list[dict]:
    """Per mode, phase and configuration: block ratios to the baseline (``none`` where it was
    measured, else ``bare``) and pooled figures."""
    rows = []
    groups: dict = {}
    for w in windows:
        groups.setdefault((w["mode"], w["phase"]), []).append(w)
    for (mode, phase), ws in groups.items():
        blocks: dict = {}
        for w in ws:
            blocks.setdefault(w["block"], []).append(w)
        per_block = [_totals(bw) for bw in blocks.values()]
        pooled = _totals(ws)
        base = "none" if "none" in pooled else "bare"
        for cfg in pooled:
            mine = [w for w in ws if w["config"] == cfg]
            ratios = [t[cfg] / t[base] for t in per_block if cfg in t and base in t]
            rows.append({
                "mode": mode, "phase": phase, "config": cfg, "base": base, "blocks": len(ratios),
                "windows": len(mine), "tokens": sum(w["tokens"] for w in mine),
                "ms_per_token": pooled[cfg],
                "block_ratio": statistics.median(ratios) if ratios else None,
                "block_min": min(ratios) if ratios else None,
                "block_max": max(ratios) if ratios else None,
                "pooled_ratio": pooled[cfg] / pooled[base] if base in pooled else None,
                "median_interval_us": statistics.median(w["median_interval_us"] for w in mine),
                "excess_us": statistics.median(w["excess_us"] for w in mine),
                "gpu_ms": statistics.median(w["gpu_ms"] for w in mine)
                if all(w["gpu_ms"] is not None for w in mine) else None,
                "peer_stop_s": statistics.median(w["peer_stop_s"] for w in mine)
                if cfg == "torch.profiler" else None})
    return rows


def finish(out: dict, json_path: str | None, label: str = "session") -> None:
    """Print the table of ``out``'s windows (kept in ``out["table"]``) and the session's state
    at the end; write ``out`` as JSON to ``json_path``."""
    print_table(table_of(out))
    print(f"\n{label} at the end: {json.dumps(out.get('session'), default=str)}")
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=1, default=str))


def table_of(out: dict) -> list[dict]:
    out["table"] = table(out["windows"])
    return out["table"]


def print_table(rows: list[dict]) -> None:
    print("\n| mode | phase | configuration | ms/token (all windows) | ratio to the baseline: "
          "median of blocks (min–max) | ratio of totals | median token interval, µs | mean − "
          "median, µs | step CUDA-event ms | blocks × tokens |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = (f"{r['block_ratio']:.3f} ({r['block_min']:.3f}–{r['block_max']:.3f})"
                 if r["block_ratio"] is not None else "—")
        extra = (f"; trace processing at stop {r['peer_stop_s']:.1f} s"
                 if r["peer_stop_s"] is not None else "")
        print(f"| {r['mode']} | {r['phase']} | {r['config']}{extra} (/ {r['base']}) | {r['ms_per_token']:.3f} "
              f"| {ratio} | {r['pooled_ratio'] or 0:.3f} | {r['median_interval_us']:.1f} | "
              f"{r['excess_us']:.1f} | {(r['gpu_ms'] or 0):.3f} | {r['blocks']} × "
              f"{r['tokens'] // max(1, r['blocks'])} |")


def add_window_options(p: argparse.ArgumentParser) -> None:
    """The model, the modes and the windows' sizes: this bench's and ui_overhead's."""
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--device", default=None)
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--eager-tokens", type=int, default=32, help="decode tokens per eager window")
    p.add_argument("--compiled-tokens", type=int, default=128,
                   help="decode tokens per compiled window")
    p.add_argument("--warmup", type=int, default=64, help="decode tokens before a mode's blocks")
    p.add_argument("--cycle-tokens", type=int, default=1024)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_window_options(p)
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together (default 1)")
    p.add_argument("--full", action="store_true", help="also every token traced")
    p.add_argument("--parts", action="store_true",
                   help="also auto-now and attached (what auto is made of)")
    p.add_argument("--peer", action="store_true", help="also torch.profiler (CUDA activities)")
    p.add_argument("--peer-blocks", type=int, default=0, help="blocks of the peer's phase "
                   "(default: --blocks)")
    p.add_argument("--none", action="store_true",
                   help="also none (eager windows): CUPTI finalized, no tuiprof at all; the "
                        "ratios are then to none")
    p.add_argument("--no-bare", action="store_true",
                   help="leave bare out (with --none: none and auto alternate, so no auto window "
                        "starts with the CUPTI a bare window attached)")
    p.add_argument("--ablate", action="store_true",
                   help="also each part alone on top of bare: attached (memory records), nvml, "
                        "alloc (with the listener), listener, bursts (with the listener)")
    p.add_argument("--ablate-none", action="store_true",
                   help="eager: then blocks of none, none+listener, none+alloc, none+nvml")
    p.add_argument("--ablate-blocks", type=int, default=6)
    p.add_argument("--deadline", type=float, default=0,
                   help="start no block after this many seconds (the table covers the blocks "
                        "run); a run still going 150 s later prints every thread's stack and "
                        "ends")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    global T0
    T0 = time.monotonic()
    if a.deadline:
        import faulthandler  # noqa: PLC0415

        faulthandler.dump_traceback_later(a.deadline + 150, exit=True)
    out: dict = {"windows": []}
    configs = ["bare", "auto"] + (["full"] if a.full else []) \
        + (["auto-now", "attached"] if a.parts else []) \
        + (["attached", "nvml", "alloc", "listener", "bursts"] if a.ablate else []) \
        + (["none"] if a.none else [])
    configs = list(dict.fromkeys(configs))
    if a.no_bare:
        configs.remove("bare")
    run_phase(a, configs, True, out)
    if a.peer:
        a.blocks = a.peer_blocks or a.blocks
        run_phase(a, ["bare", "torch.profiler"], False, out)
    meta = out["meta"]
    print(f"\n{meta.get('model')} on {meta.get('device_name')}, {meta.get('dtype')}, batch "
          f"{meta.get('batch')}, torch {meta.get('torch')}, driver {meta.get('driver')}")
    finish(out, a.json, "sessions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
