"""Decode speed with the live UI open: interleaved windows, session process vs UI process.

``tuiprof --model X`` runs the model, the collectors and the store in a session process and
the Textual app in its own (``tuiprof.remote``). This benchmark runs exactly that pair: the
app, headless under ``run_test`` at 200×50 (every pane visible and redrawn at 4 Hz, findings
every 2 s), over a RemoteControl. A hook in the session process (:class:`Windows`) switches the
configuration at a token boundary when asked and times each window, A B C A B C …:

* ``bare``    — no collection: CUPTI kinds and API records off, NVML paused, no allocator
                statistics, and the profiler's per-token listener bypassed;
* ``auto``    — everything tuiprof collects with its defaults for the mode (bursts of 4 traced
                tokens in every 128 eager / 1,024 compiled tokens, API records included; allocator statistics every eager
                token, every 64th compiled one), UI frozen (no pulls);
* ``auto+ui`` — the same, with the UI live (pulling a delta every 250 ms and redrawing);
* ``full``    — eager only, with ``--full``: every token traced (what ``auto`` samples from);
* compiled only: ``listener`` (collectors off as in ``bare``, but every token attributed in
  the store as always), ``auto-noapi`` and ``auto-nonvml`` (auto without API records / without the
  NVML sampler, UI frozen) show what the remaining cost is made of; ``auto@256`` traces bursts
  of 4 tokens in every 256 instead of 1,024.

A window is a fixed number of decode tokens (sampled configurations start on a sampling-period
boundary, so each window holds the same number of bursts); its figure is its whole wall time
per token, from its first token's start to the next token's start after its last, which
includes the forced flush and folding of the window's CUPTI records. Rounds alternate the order
(A B C, C B A, …); the table gives the median over rounds and the median of each round's ratio
to its own ``bare`` window (which cancels slow drifts of the machine). Medians over rounds, ratios to ``bare``. On the H100::

    python bench/ui_overhead.py --rounds 5 --json $OUT/ui_overhead.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class Windows:
    """Session-process side (loaded by ``RemoteControl(hook=...)``): configurations switched
    from the engine thread at token boundaries; requests arrive as ``("hook", op, arg)``.

    A window of a sampled configuration starts at a sampling-period boundary and lasts a
    whole number of periods, so every window holds the same number of traced bursts."""

    def __init__(self, prof) -> None:
        self.prof = prof
        self.cfg = "auto"
        self.pending: tuple | None = None
        self.closing = False
        self.ntokens = 0
        self.n = 0
        self.t0 = 0.0
        self.result: tuple | None = None
        self.applied = threading.Event()
        self.closed = threading.Event()
        self._started, self._finished = prof.token_started, prof.token_finished
        prof.token_started = self.token_started
        prof.token_finished = self.token_finished

    def handle(self, op: str, arg=None):
        if op == "window":                       # run one window and return its figures
            self.closed.clear()
            self.pending = tuple(arg)
            if not self.closed.wait(600):
                raise RuntimeError("the window did not end within 600 s")
            return self.result
        raise ValueError(op)

    def apply(self, cfg: str) -> None:
        prof = self.prof
        on = cfg not in ("bare", "listener")
        c = prof.cupti
        if c is not None:
            c.sample_every = (int(cfg.split("@")[1]) // 4 if "@" in cfg else 1 if cfg == "full"
                              else prof._sample_every(prof.status.mode))
            c.paused = not on
            if not on:
                c._set_device_kinds(False)
            c.set_api(on and "noapi" not in cfg)
        if prof.nvml is not None:
            prof.nvml.paused = not on or "nonvml" in cfg
        prof.options.alloc_every = "auto" if on else 0

    def _period(self, cfg: str) -> int:
        if cfg in ("bare", "listener"):
            return 1
        if "@" in cfg:
            return int(cfg.split("@")[1])
        if cfg == "full":
            return 1
        return 4 * self.prof._sample_every(self.prof.status.mode)

    def token_started(self, phase, mode, step, cycle, start_ns):
        if phase == "decode":
            if self.closing:
                if self.cfg not in ("bare", "listener") and self.prof.cupti is not None:
                    self.prof.cupti.flush()      # the window pays for its own records
                self.result = (self.cfg, self.n, time.perf_counter() - self.t0, mode)
                self.closing = False
                self.cfg = "between"
                self.closed.set()
            if self.pending is not None:
                cfg, ntokens = self.pending
                if self.cfg != "between" \
                        or self.prof.store.next_seq() % self._period(cfg) == 0:
                    self.apply(cfg)
                    self.cfg, self.ntokens, self.pending = cfg, ntokens, None
                    self.n, self.t0 = 0, time.perf_counter()
        if self.cfg != "bare":
            self._started(phase, mode, step, cycle, start_ns)

    def token_finished(self, ev):
        if ev.phase == "decode" and self.ntokens and self.cfg != "between":
            self.n += 1
            if self.n == self.ntokens:
                self.closing = True
        if self.cfg != "bare":
            self._finished(ev)


def run(a: argparse.Namespace) -> dict:
    from tuiprof.profiler import ProfilerOptions
    from tuiprof.remote import RemoteControl
    from tuiprof.ui.app import make_app

    opts = ProfilerOptions(engine_kwargs=dict(model_spec=a.model, device=a.device, loop=True,
                                              max_new_tokens=a.cycle_tokens, mode="eager",
                                              prompt_len=16))
    ctl = RemoteControl(opts, {"ring_tokens": 32}, hook="bench.ui_overhead:Windows")
    ctl.start()
    app = make_app(ctl, title="ui-overhead", export_dir=a.tmp, refresh_hz=4.0)
    results: dict = {}

    async def wait_for(pred, seconds, what):
        t_end = time.monotonic() + seconds
        while not pred():
            if ctl.status.state == "error":
                raise SystemExit(f"ui_overhead: {ctl.status.message}")
            if time.monotonic() > t_end:
                raise SystemExit(f"ui_overhead: timed out waiting for {what}")
            app.refresh_view()
            await asyncio.sleep(0.2)

    async def phase(mode: str, configs: list[str], ntokens: int) -> None:
        res = results.setdefault(mode, {c: [] for c in configs})
        loop = asyncio.get_running_loop()
        for r in range(a.rounds):
            # A B C, then C B A: a drift over the run does not favour any configuration.
            for cfg in (configs if r % 2 == 0 else configs[::-1]):
                if cfg.endswith("+ui"):
                    app.resume_refresh()
                else:
                    app.pause_refresh()
                name, n, secs, m = await loop.run_in_executor(
                    None, lambda: ctl.call("hook", "window", (cfg, ntokens), timeout=700))
                assert m == mode and name == cfg and n == ntokens, (name, n, m)
                res[cfg].append(secs * 1e3 / max(1, n))
                print(f"  [{mode}] round {r + 1} {cfg:<12} {n:>5} tokens "
                      f"{secs * 1e3 / max(1, n):8.3f} ms/token", flush=True)
        app.resume_refresh()

    async def main():
        async with app.run_test(size=(200, 50)):
            await wait_for(lambda: ctl.status.state == "decode", 600, "decode")
            await asyncio.sleep(a.warmup)
            if "eager" in a.modes:
                await phase("eager", ["bare", "auto", "auto+ui"]
                            + (["full"] if a.full else []), a.eager_tokens)
            if "compiled" in a.modes:
                app.action_toggle_mode()
                await wait_for(lambda: ctl.status.mode == "compiled"
                               and ctl.status.state == "decode", 600, "compiled decode")
                await asyncio.sleep(a.warmup)
                await phase("compiled", ["bare", "auto", "auto+ui"]
                            + (["listener", "auto-noapi", "auto-nonvml", "auto@256"]
                               if a.ablations else []), a.compiled_tokens)
            v = ctl.store.view(raw=False)
            results["session"] = {
                "counters": v.counters, "api": {k: st.count for k, st in v.api.items()},
                "sampled_decode_tokens": sum(1 for t in v.tokens if t.sampled
                                             and t.phase == "decode"),
                "decode_tokens_in_series": sum(1 for t in v.tokens if t.phase == "decode"),
                "collectors": v.collectors}
            results["refresh"] = dict(app.refresh_stats)
            results["pulls"] = ctl.pulls
            results["meta"] = {k: ctl.store.meta.get(k) for k in
                               ("model", "device_name", "dtype", "torch", "driver")}
            app.exit()

    try:
        asyncio.run(main())
    finally:
        ctl.stop()
        ctl.close()
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--device", default=None)
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--eager-tokens", type=int, default=128,
                   help="decode tokens per eager window (a multiple of the sampling period)")
    p.add_argument("--full", action="store_true", help="eager: also every token traced")
    p.add_argument("--ablations", action="store_true",
                   help="compiled: also listener, auto-noapi, auto-nonvml, auto@256")
    p.add_argument("--compiled-tokens", type=int, default=2048,
                   help="decode tokens per compiled window (a multiple of every sampling period)")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--cycle-tokens", type=int, default=1024)
    p.add_argument("--json", default=None)
    p.add_argument("--tmp", default="/tmp")
    a = p.parse_args(argv)
    res = run(a)
    meta = res.get("meta", {})
    print(f"\n{meta.get('model')} on {meta.get('device_name')}, {meta.get('dtype')}, "
          f"torch {meta.get('torch')}; UI refresh {res['refresh']['count']} times, mean "
          f"{res['refresh']['mean_ms']:.1f} ms (UI process); {res['pulls']} pulls")
    print("\n| mode | configuration | ms/token (median of rounds) | ratio of medians | "
          "median of per-round ratios to bare (min–max) | rounds |")
    print("|---|---|---|---|---|---|")
    table = []
    for mode in ("eager", "compiled"):
        if mode not in res:
            continue
        bare = res[mode]["bare"]
        base = statistics.median(bare)
        for cfg, vals in res[mode].items():
            med = statistics.median(vals)
            paired = [v / b for v, b in zip(vals, bare)]
            pm = statistics.median(paired)
            table.append({"mode": mode, "config": cfg, "ms_per_token": med,
                          "ratio": med / base, "paired_ratio": pm, "rounds": vals})
            print(f"| {mode} | {cfg} | {med:.3f} | {med / base:.3f} | {pm:.3f} "
                  f"({min(paired):.3f}–{max(paired):.3f}) | {len(vals)} |")
    print(f"\nsession at the end: {json.dumps(res.get('session'), default=str)}")
    if a.json:
        Path(a.json).write_text(json.dumps({"table": table, **res}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
