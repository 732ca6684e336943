"""GPU verification of tensor-parallel profiling (issue #16): one command, one table.

For each model and TP degree one live session of ranks (what ``tuiprof --model M --tp N``
runs: torch.distributed ranks, NCCL on GPUs, each rank a session process with CUPTI, NVML and
its own store), eager first, then compiled (``c``, agreed by all ranks) where asked. Per
model, TP and mode, per rank: median ms per decode step over all tokens, tokens/s, and over
the traced steps (tuiprof's default sampling: bursts of 4 tokens) compute / communication /
idle ms per step, the NCCL share and how much of it overlaps compute; the step-end skew
across ranks, the slowest rank, the cross-rank findings, and the TP scaling efficiency against
the TP=1 session of the same model and mode. The collection overhead per rank comes from
bench/overhead.py's interleaved windows (``bare`` vs ``auto``) run in every rank at once.

On 2 GPUs (nvidia-h200-x2)::

    python bench/verify_tp.py                      # qwen3-0.6b TP 1,2 eager+compiled,
                                                   # nanochat-d34 TP 1,2 eager, compiled at TP 2
On the CPU (gloo, tiny models, the same code path)::

    python bench/verify_tp.py --device cpu --tiny

``$OUT`` (when set) receives ``verify_tp.json`` and one multi-rank snapshot per session.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.overhead import Windows, table  # noqa: E402
from tuiprof.analysis.ranks import find_ranks, ranks_summary, tp_scaling  # noqa: E402
from tuiprof.analysis.tokens import mode_summaries  # noqa: E402
from tuiprof.export.snapshot import write_snapshot  # noqa: E402
from tuiprof.profiler import AUTO_SAMPLE_EVERY, ProfilerOptions  # noqa: E402
from tuiprof.remote.ranks import RankSetControl  # noqa: E402
from tuiprof.store.ranks import RanksView  # noqa: E402

TINY = {"qwen3-0.6b": "qwen3-tiny", "nanochat-d34": "nanochat-tiny"}
T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s] {text}", flush=True)


class AlignedWindows(Windows):
    """bench/overhead.py's windows, started at a decode step every rank reaches at once (a
    multiple of ``ALIGN``), so that all ranks switch collection on and off together."""

    ALIGN = 16

    def __init__(self, prof) -> None:
        super().__init__(prof)
        self._step = 0

    def token_started(self, phase, mode, step, cycle, start_ns):
        self._step = step
        super().token_started(phase, mode, step, cycle, start_ns)

    def _boundary(self, mode: str) -> None:
        if not self.timing and self.plan and self._step % self.ALIGN:
            return
        super()._boundary(mode)


# ------------------------------------------------------------------ one session of ranks
class Session:
    def __init__(self, a: argparse.Namespace, model: str, tp: int, overhead: bool) -> None:
        self.a, self.model, self.tp = a, model, tp
        opts = ProfilerOptions(cupti=not a.no_cupti, nvml=True, engine_kwargs=dict(
            model_spec=model, device=a.device, dtype=a.dtype, loop=True,
            max_new_tokens=a.cycle_tokens, prompt_len=16, mode="eager"))
        self.ctl = RankSetControl(opts, {"ring_tokens": a.ring_tokens}, tp,
                                  hook="bench.verify_tp:AlignedWindows" if overhead else None)

    def wait(self, pred, seconds: float, what: str) -> None:
        end = time.monotonic() + seconds
        while not pred():
            if self.ctl.failure:
                raise RuntimeError(self.ctl.failure)
            if any(c.status.state == "error" for c in self.ctl.ranks):
                raise RuntimeError("; ".join(f"rank {r}: {c.status.message}"
                                             for r, c in enumerate(self.ctl.ranks)
                                             if c.status.state == "error"))
            if time.monotonic() > end:
                raise RuntimeError(f"timed out after {seconds:.0f} s waiting for {what}")
            time.sleep(0.2)

    def decode_tokens(self, mode: str) -> int:
        counts = []
        for c in self.ctl.ranks:
            s = mode_summaries(c.view(raw=False, wait=True), "decode").get(mode)
            counts.append(s.tokens if s else 0)
        return min(counts)

    def overhead(self, mode: str) -> list[dict]:
        """Interleaved bare/auto windows in every rank at once; per rank the table rows."""
        a = self.a
        n = a.eager_window if mode == "eager" else a.compiled_window
        period = 4 * AUTO_SAMPLE_EVERY[mode]        # one burst of auto per block
        rounds = max(2, period // n)
        rounds += rounds % 2
        blocks = a.eager_blocks if mode == "eager" else a.compiled_blocks
        plan = [("bare", a.warmup)]
        for b in range(blocks):
            plan += [(c, n) for r in range(rounds)
                     for c in (("bare", "auto") if r % 2 == 0 else ("auto", "bare"))]
        plan.append(("auto", 0))
        for c in self.ctl.ranks:
            c.call("hook", "start", plan)
        per_rank: list = [None] * self.tp
        end = time.monotonic() + a.timeout
        while any(p is None for p in per_rank):
            for r, c in enumerate(self.ctl.ranks):
                if per_rank[r] is None:
                    got = c.call("hook", "poll")
                    if got["error"]:
                        raise RuntimeError(f"rank {r} overhead windows: {got['error']}")
                    if got["done"]:
                        ws = got["results"][1:]          # the warm-up window is not measured
                        blk = 2 * rounds
                        for i, w in enumerate(ws):
                            w.update(block=i // blk, round=(i % blk) // 2, phase=f"rank {r}")
                        per_rank[r] = ws
            if time.monotonic() > end:
                raise RuntimeError("overhead windows did not finish in time")
            time.sleep(0.5)
        rows = []
        for r, ws in enumerate(per_rank):
            for row in table(ws):
                if row["config"] == "auto":
                    rows.append({"rank": r, "mode": mode, "ratio": row["block_ratio"],
                                 "min": row["block_min"], "max": row["block_max"],
                                 "pooled": row["pooled_ratio"], "tokens": row["tokens"],
                                 "blocks": row["blocks"]})
        return rows

    def analyse(self, mode: str) -> dict:
        rv = self.ctl.views(raw=True, raw_tokens=self.a.raw_tokens)
        s = ranks_summary(rv, mode)
        return {"summary": s, "findings": find_ranks(rv, s)}

    def run(self, compiled: bool, overhead: bool) -> dict:
        a, ctl = self.a, self.ctl
        out: dict = {"model": self.model, "tp": self.tp, "modes": {}}
        t = time.monotonic()
        ctl.start()
        try:
            self.wait(lambda: all(c.status.state == "decode" for c in ctl.ranks), a.timeout,
                      "every rank decoding")
            out["load_s"] = time.monotonic() - t
            say(f"{self.model} TP={self.tp}: decoding after {out['load_s']:.1f} s")
            modes = ["eager"] + (["compiled"] if compiled else [])
            for mode in modes:
                if mode == "compiled":
                    t = time.monotonic()
                    say(f"{self.model} TP={self.tp}: {ctl.toggle_mode()}")
                    self.wait(lambda: all(c.status.mode == "compiled" and c.status.state == "decode"
                                          for c in ctl.ranks), a.timeout, "compiled decode")
                    out["compile_s"] = time.monotonic() - t
                    say(f"{self.model} TP={self.tp}: compiled on every rank in "
                        f"{out['compile_s']:.1f} s")
                want = a.eager_tokens if mode == "eager" else a.compiled_tokens
                self.wait(lambda: self.decode_tokens(mode) >= want, a.timeout,
                          f"{want} {mode} decode tokens")
                res = self.analyse(mode)
                if overhead:
                    say(f"{self.model} TP={self.tp}: {mode} overhead windows")
                    res["overhead"] = self.overhead(mode)
                out["modes"][mode] = res
                say(f"{self.model} TP={self.tp}: {mode} done")
            ctl.stop()
            out["ranks_view"] = ctl.views(raw=True)
        finally:
            ctl.close()
        return out


# ------------------------------------------------------------------ the table
def rows_of(results: list[dict]) -> tuple[list[list], list[str]]:
    ref = {(r["model"], m): res["summary"] for r in results if r["tp"] == 1
           for m, res in r["modes"].items()}
    rows, notes = [], []
    for r in results:
        for mode, res in r["modes"].items():
            s = res["summary"]
            over = {o["rank"]: o for o in res.get("overhead", [])}
            base = ref.get((r["model"], mode))
            eff = None
            if base is not None and r["tp"] > 1 and base.ranks and s.ranks:
                step = statistics.median(x.step_ms for x in s.ranks)
                eff = tp_scaling(base.ranks[0].step_ms, step, r["tp"])
            for k in s.ranks:
                o = over.get(k.rank)
                rows.append([
                    r["model"], r["tp"], mode, k.rank, f"{k.step_ms:.2f}", f"{k.tokens_per_s:.0f}",
                    _f(k.compute_ms), _f(k.comm_ms), _f(k.idle_ms), _p(k.comm_share),
                    _p(k.overlap_fraction), str(k.traced_steps),
                    f"{s.skew.end_median_us:.0f}" if s.skew and r["tp"] > 1 else "–",
                    "yes" if s.slowest == k.rank and r["tp"] > 1 else "",
                    f"{eff['efficiency']:.0%} (×{eff['speedup']:.2f})" if eff and k.rank == 0 else "",
                    f"{o['ratio']:.3f} ({o['min']:.3f}–{o['max']:.3f})" if o and o["ratio"] else ""])
            for f in res["findings"]:
                notes.append(f"{r['model']} TP={r['tp']} {mode}: {f.title} — {f.evidence}")
    return rows, notes


def _f(v) -> str:
    return "–" if v is None else f"{v:.3f}"


def _p(v) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"


HEAD = ["model", "TP", "mode", "rank", "ms/step", "tok/s", "compute ms", "comm ms", "idle ms",
        "NCCL", "overlap", "traced", "skew µs", "slowest", "TP eff", "overhead auto/bare"]


def print_table(rows: list[list], notes: list[str], results: list[dict]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(HEAD, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    print("\n" + line(HEAD))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    print("\nms/step: median host time per decode step over all tokens of the mode; compute / "
          "comm / idle: medians per traced step (CUPTI bursts); NCCL: communication share of "
          "the traced steps' wall time; skew: median step-end skew across ranks; TP eff: "
          "speed-up over TP=1 / TP; overhead: median of block ratios auto/bare (min–max).")
    for r in results:
        comp = f", compile {r['compile_s']:.0f} s" if "compile_s" in r else ""
        print(f"{r['model']} TP={r['tp']}: load {r.get('load_s', 0):.0f} s{comp}")
    for n in notes:
        print("finding: " + n)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="qwen3-0.6b,nanochat-d34")
    p.add_argument("--tp", default="1,2")
    p.add_argument("--compiled", action="append", default=None, metavar="MODEL=TPS",
                   help="where compiled mode is measured (default qwen3-0.6b=1,2 and "
                        "nanochat-d34=2; one compile per model per TP)")
    p.add_argument("--overhead-at", default="qwen3-0.6b=2", metavar="MODEL=TP",
                   help="session that also measures collection overhead per rank ('' = none)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--tiny", action="store_true", help="tiny models, short runs (CPU smoke run)")
    p.add_argument("--no-cupti", action="store_true")
    p.add_argument("--eager-tokens", type=int, default=256)
    p.add_argument("--compiled-tokens", type=int, default=512)
    p.add_argument("--cycle-tokens", type=int, default=1024)
    p.add_argument("--ring-tokens", type=int, default=1024)
    p.add_argument("--raw-tokens", type=int, default=16, help="traced steps per rank analysed")
    p.add_argument("--eager-window", type=int, default=32)
    p.add_argument("--compiled-window", type=int, default=128)
    p.add_argument("--eager-blocks", type=int, default=2)
    p.add_argument("--compiled-blocks", type=int, default=1)
    p.add_argument("--warmup", type=int, default=32)
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args(argv)
    compiled = a.compiled or ["qwen3-0.6b=1,2", "nanochat-d34=2"]
    if a.tiny:
        a.eager_tokens, a.compiled_tokens, a.cycle_tokens = 24, 24, 48
        a.ring_tokens, a.eager_window, a.compiled_window = 64, 4, 4
        a.eager_blocks = a.compiled_blocks = 1
        a.warmup = 4
        AUTO_SAMPLE_EVERY.update(eager=2, compiled=2)  # one burst per 8-token block
    rename = (lambda m: TINY.get(m, m)) if a.tiny else (lambda m: m)
    models = [rename(m) for m in a.models.split(",") if m]
    tps = [int(t) for t in a.tp.split(",")]
    want_compiled = {}
    for spec in compiled:
        m, _, ts = spec.partition("=")
        want_compiled[rename(m)] = {int(t) for t in ts.split(",") if t}
    om, _, ot = a.overhead_at.partition("=")
    overhead_at = (rename(om), int(ot)) if om else None
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    results: list[dict] = []
    failed = []
    for model in models:
        for tp in tps:
            try:
                r = Session(a, model, tp, overhead_at == (model, tp)).run(
                    tp in want_compiled.get(model, set()), overhead_at == (model, tp))
            except Exception as exc:  # one line, and the other sessions still run
                msg = " ".join(str(exc).split())[:300]
                say(f"{model} TP={tp} failed: {msg}")
                failed.append(f"{model} TP={tp}: {msg}")
                continue
            rv = r.pop("ranks_view")
            if out_dir is not None:
                base = next((x for x in results if x["model"] == model and x["tp"] == 1), None)
                meta = dict(rv.meta)
                if base and "eager" in base["modes"] and base["modes"]["eager"]["summary"].ranks:
                    meta["tp_reference"] = {"tp": 1, "mode": "eager", "source": "TP=1 session",
                                            "ms_per_token": base["modes"]["eager"]["summary"].ranks[0].step_ms}
                write_snapshot(RanksView(rv.views, meta), out_dir / f"tp{tp}-{model}.json")
            results.append(r)
    rows, notes = rows_of(results)
    print_table(rows, notes, results)
    for f in failed:
        print(f"FAILED {f}")
    if out_dir is not None:
        doc = {"rows": [dict(zip(HEAD, row)) for row in rows], "findings": notes,
               "failed": failed, "sessions": [{k: v for k, v in r.items() if k != "modes"}
                                              for r in results],
               "overhead": [o for r in results for m in r["modes"].values()
                            for o in m.get("overhead", [])]}
        (out_dir / "verify_tp.json").write_text(json.dumps(doc, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
