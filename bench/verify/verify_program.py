"""GPU verification of ``tuiprof run -- python …`` (docs/programs.md), in one call.

    python bench/verify/verify_program.py                      # on the H100 (≈ 4.5 min, see below)
    python bench/verify/verify_program.py --device cpu --tiny  # dry run of the same code paths here

1. Kernel counts (six processes at once: a kernel count does not depend on contention):
   the built-in engine (``tuiprof --headless``) eager and compiled, and a user's HF
   ``generate()`` script of the same model under ``tuiprof run --headless`` eager and with a
   static cache (transformers compiles the decode forward: CUDA graphs); continuous batching
   (``bench/programs/cb_qwen.py``); an NVTX-ranged loop with ``--step-range``.
2. Overhead: the HF script alone (A) and under ``tuiprof run --headless --sample-every live``
   (B: the live app's sampling) as whole processes, interleaved A B, B A, …; the figure is the
   decode time per step the script reports itself.
3. Screens: the live app (session process + Textual, as ``tuiprof run -- python …`` runs it)
   on the eager script, SVG screenshots at 200x50 and 80x24.

Prints one table; details go to $OUT (at most 8 files). Budget on the H100: phase 1 ≈ 90 s
(two torch.compile in parallel, 44-68 s each alone), phase 2 ≈ 150 s (4 eager rounds ≈ 12 s
a process, 2 compiled rounds ≈ 25 s a process: the compile is cached by phase 1), phase 3
≈ 30 s. ``--budget-s`` drops overhead rounds that would not fit, and says so.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "bench" / "programs"
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="qwen3-tiny (a CPU dry run)")
    ap.add_argument("--eager-rounds", type=int, default=4)
    ap.add_argument("--compiled-rounds", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=65)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--no-screens", action="store_true")
    ap.add_argument("--no-overhead", action="store_true",
                    help="skip phase 2 (bench/overhead/overhead_program.py forks from warm imports)")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="verify-program-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="verify-program-work-"))
    v = Verify(args, out, work)
    v.kernels()
    if not args.no_overhead:
        v.overhead()
    if not args.no_screens:
        v.screens()
    v.report()
    return 0


class Verify:
    def __init__(self, args: argparse.Namespace, out: Path, work: Path) -> None:
        self.args, self.out, self.work = args, out, work
        self.t0 = time.monotonic()
        self.model = "qwen3-tiny" if args.tiny else "qwen3-0.6b"
        self.prog_flags = ["--device", args.device] + (["--tiny"] if args.tiny else [])
        self.lines: list[str] = []       # the table
        self.details: list[str] = []     # verify_program.txt
        self.logs: list[str] = []        # logs.txt
        self.env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep
                        + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")

    # ------------------------------------------------------------------ helpers
    def _tuiprof(self, *a: str) -> list[str]:
        return [sys.executable, "-m", "tuiprof", *a]

    def _run_program(self, json_name: str, program: list[str], *opts: str) -> list[str]:
        return self._tuiprof("run", "--headless", "--sample-every", "1", "--ring-tokens", "4", "--json",
                             str(self.work / json_name), *opts, "--", "python", *program)

    def _log(self, name: str, proc: subprocess.CompletedProcess | None, note: str = "") -> None:
        if proc is None:
            self.logs.append(f"=== {name}: {note}")
            return
        tail = (proc.stdout[-3000:] + "\n--- stderr ---\n" + proc.stderr[-3000:]).strip()
        self.logs.append(f"=== {name} (exit {proc.returncode}) {note}\n{tail}")

    def _snap(self, name: str) -> dict | None:
        p = self.work / name
        return json.loads(p.read_text()) if p.exists() else None

    # ------------------------------------------------------------------ phase 1
    def kernels(self) -> None:
        a, dev = self.args, ["--device", self.args.device]
        hf = str(PROGRAMS / "hf_qwen.py")
        n = str(a.new_tokens)
        jobs = {
            "engine_eager": self._tuiprof("--model", self.model, *dev, "--headless", "--sample-every", "1",
                                          "--max-new-tokens", "33", "--ring-tokens", "4",
                                          "--json", str(self.work / "engine_eager.json")),
            "engine_compiled": self._tuiprof("--model", self.model, *dev, "--headless", "--sample-every", "1", "--mode",
                                             "compiled", "--max-new-tokens", "33",
                                             "--ring-tokens", "4", "--json",
                                             str(self.work / "engine_compiled.json")),
            "hf_eager": self._run_program("hf_eager.json", [hf, "--mode", "eager", "--new-tokens",
                                                            n, "--repeats", "1",
                                                            *self.prog_flags]),
            "hf_compiled": self._run_program("hf_compiled.json", [hf, "--mode", "compiled",
                                                                  "--new-tokens", n, "--repeats",
                                                                  "1", *self.prog_flags]),
            "cb": self._run_program("cb.json", [str(PROGRAMS / "cb_qwen.py"), *self.prog_flags]),
            "nvtx": self._run_program("nvtx.json", [str(PROGRAMS / "nvtx_loop.py"), "--device",
                                                    a.device], "--step-range", "decode_step"),
        }
        t = time.monotonic()
        procs = {k: subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=self.env, cwd=self.work) for k, c in jobs.items()}
        for k, p in procs.items():
            try:
                so, se = p.communicate(timeout=max(30.0, 420 - (time.monotonic() - t)))
            except subprocess.TimeoutExpired:
                p.kill()
                so, se = p.communicate()
                se += "\n(timed out)"
            self._log(k, subprocess.CompletedProcess(jobs[k], p.returncode, so, se))
        self.details.append(f"phase 1 (kernel counts, 6 processes at once): "
                            f"{time.monotonic() - t:.0f} s")
        self._kernel_table()

    def _kernel_table(self) -> None:
        L = self.lines
        L.append("1. kernels per decode step: a user's generate() under `tuiprof run` vs the "
                 "built-in engine (median of steady steps)")
        L.append(f"   {'mode':<9} {'engine':>8} {'generate()':>10} {'ratio':>7}  "
                 f"{'graph k/step':>12}  {'steps':>5}  {'step source':<13} verdict")
        for mode in ("eager", "compiled"):
            eng, hf = self._snap(f"engine_{mode}.json"), self._snap(f"hf_{mode}.json")
            e, h = _kernels_per_step(eng), _kernels_per_step(hf)
            ratio = h["kernels"] / e["kernels"] if e["kernels"] and h["kernels"] else None
            verdict = ("n/a (no kernels: no CUPTI here)" if ratio is None else
                       "within 1%" if abs(ratio - 1) <= 0.01 else f"off by {ratio - 1:+.1%}")
            src = (hf or {}).get("meta", {}).get("step_source", "-")
            L.append(f"   {mode:<9} {e['kernels']:>8.0f} {h['kernels']:>10.0f} "
                     f"{ratio if ratio else float('nan'):>7.3f}  "
                     f"{e['graph']:>5.0f} / {h['graph']:<5.0f}  {h['steps']:>5}  {src:<13} "
                     f"{verdict}")
            if e["kernel_ms"] and h["kernel_ms"]:
                r = h["kernel_ms"] / e["kernel_ms"]
                L.append(f"   {'':<9} kernel time/step {e['kernel_ms']:.3f} vs "
                         f"{h['kernel_ms']:.3f} ms ({r - 1:+.2%}); API calls/step "
                         f"{e['api']:.0f} vs {h['api']:.0f}")
            L.extend(_kernel_diff(eng, hf))
            # the same comparison for the kernels each step's model forward launched (the
            # store's split by launch); the loop's own kernels are listed apart
            if e["split_steps"] and h["split_steps"]:
                r = h["model"] / e["model"] if e["model"] else float("nan")
                ok = "within 1%" if abs(r - 1) <= 0.01 else f"off by {r - 1:+.1%}"
                L.append(f"   {'':<9} model forward kernels/step {e['model']:.0f} vs "
                         f"{h['model']:.0f} ({r:.4f}: {ok}), time {e['model_ms']:.3f} vs "
                         f"{h['model_ms']:.3f} ms; the loop's own {e['loop']:.0f} vs "
                         f"{h['loop']:.0f} kernels ({e['loop_ms'] * 1e3:.0f} vs "
                         f"{h['loop_ms'] * 1e3:.0f} µs); launches matched "
                         f"{e['coverage']:.1%} / {h['coverage']:.1%} of "
                         f"{e['split_steps']} / {h['split_steps']} steps")
                L.extend(_kernel_diff(eng, hf, model_only=True))
            else:
                L.append(f"   {'':<9} model forward split: no traced step with a model window "
                         f"(engine {e['split_steps']}, generate() {h['split_steps']})")
            for name, d in ((f"engine {mode}", e), (f"generate() {mode}", h)):
                self.details.append(f"{name}: {json.dumps(d)}")
        cb = self._snap("cb.json")
        L.append("2. continuous batching (generate()'s batching manager): steps with a varying "
                 "number of sequences")
        cb_log = next((x for x in self.logs if x.startswith("=== cb ")), "")
        if "NO_CONTINUOUS_BATCHING" in cb_log:
            L.append("   not in this transformers: " + cb_log.split("NO_CONTINUOUS_BATCHING")[1]
                     .splitlines()[0].strip())
        elif cb is None:
            L.append("   FAILED (see logs.txt)")
        else:
            steps = [t for t in cb["tokens"] if t["done"] and t["phase"] in ("prefill", "decode")]
            batches = [t["batch"] for t in steps]
            made = sum(t["batch"] for t in steps if t["phase"] == "decode")
            L.append(f"   step source {cb['meta'].get('step_source')}: {len(steps)} steps "
                     f"({sum(t['phase'] == 'prefill' for t in steps)} with prompt positions), "
                     f"batch {min(batches, default=0)}..{max(batches, default=0)} "
                     f"({len(set(batches))} sizes), {made} decode tokens; "
                     f"exit {cb['meta']['program']['exit_status']}")
            self.details.append("cb batches per step: " + " ".join(map(str, batches)))
        nv = self._snap("nvtx.json")
        L.append("3. NVTX-ranged loop (--step-range decode_step; 40 ranges, 6 kernels each)")
        if nv is None:
            L.append("   FAILED (see logs.txt)")
        else:
            steps = [t for t in nv["tokens"] if t["done"] and t["phase"] == "decode"]
            ks = sorted(t["kernels"] for t in steps) or [0]
            L.append(f"   step source {nv['meta'].get('step_source')}: {len(steps)} steps, "
                     f"median {ks[len(ks) // 2]} kernels/step (min {ks[0]}, max {ks[-1]}); "
                     f"{nv['collectors'].get('nvtx', {}).get('message', '')}")
            # which kernels a step holds (6 expected: is a matmul two, GEMM + split-K reduce?)
            n = max(1, sum(1 for t in steps if t.get("sampled", True)))   # traced steps
            for k in nv.get("kernels", []):
                if k.get("phase") == "decode":
                    count = (k.get("stats") or {}).get("count", 0)
                    L.append(f"     {count / n:5.2f}/step  {(k.get('demangled') or k['name'])[:90]}")

    # ------------------------------------------------------------------ phase 2
    def overhead(self) -> None:
        a = self.args
        L = self.lines
        L.append("4. overhead of `tuiprof run` (live sampling) on the generate() script: decode "
                 "ms/step the script reports, whole processes interleaved")
        L.append(f"   {'mode':<9} {'rounds':>6} {'alone (A)':>10} {'tuiprof (B)':>11} "
                 f"{'B/A median':>10} {'min-max':>13} {'target':>7}")
        for mode, rounds, target in (("eager", a.eager_rounds, 1.05),
                                     ("compiled", a.compiled_rounds, 1.03)):
            A, B, ratios, per = [], [], [], []
            for r in range(rounds):
                left = a.budget_s - (time.monotonic() - self.t0)
                need = 2 * statistics.median(per) if per else 0.0
                if left < need:
                    self.details.append(f"overhead {mode}: round {r + 1} of {rounds} dropped "
                                        f"(budget: {left:.0f} s left, a round takes {need:.0f} s)")
                    break
                t = time.monotonic()
                order = ("A", "B") if r % 2 == 0 else ("B", "A")
                got = {k: self._decode_ms(mode, k == "B", f"{mode}-{k}{r}") for k in order}
                per.append(time.monotonic() - t)
                if None in got.values():
                    continue
                A.append(got["A"])
                B.append(got["B"])
                ratios.append(got["B"] / got["A"])
            if not ratios:
                L.append(f"   {mode:<9} {'0':>6}  FAILED or no time (see logs.txt)")
                continue
            med = statistics.median(ratios)
            L.append(f"   {mode:<9} {len(ratios):>6} {statistics.median(A):>8.3f}ms "
                     f"{statistics.median(B):>9.3f}ms {med:>10.3f} "
                     f"{min(ratios):>6.3f}-{max(ratios):.3f} {'≤' + str(target):>7}"
                     + ("  met" if med <= target else "  NOT met"))
            self.details.append(f"overhead {mode}: A={A} B={B} ratios={ratios} "
                                f"seconds/round={[round(x) for x in per]}")

    def _decode_ms(self, mode: str, under: bool, tag: str) -> float | None:
        prog = [str(PROGRAMS / "hf_qwen.py"), "--mode", mode, "--new-tokens",
                str(self.args.new_tokens), "--repeats", "3", *self.prog_flags]
        cmd = (self._run_program(f"ovh-{tag}.json", prog, "--sample-every", "live") if under
               else [sys.executable, *prog])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=self.env,
                                  cwd=self.work)
        except subprocess.TimeoutExpired:
            self._log(tag, None, "timed out")
            return None
        m = re.search(r"DECODE_MS_PER_STEP=([\d.]+)", proc.stdout)
        self._log(tag, proc, f"decode {m.group(1) if m else '?'} ms/step")
        return float(m.group(1)) if m else None

    # ------------------------------------------------------------------ phase 3
    def screens(self) -> None:
        import asyncio

        from tuiprof.program.launch import parse_program
        from tuiprof.spec import ProfilerOptions
        from tuiprof.sessions import RemoteControl
        from tuiprof.ui.app import make_app

        t = time.monotonic()
        spec = parse_program(["python", str(PROGRAMS / "hf_qwen.py"), "--mode", "eager",
                              "--new-tokens", "129", "--repeats", "2", *self.prog_flags])
        ctl = RemoteControl(ProfilerOptions(), {"ring_tokens": 16}, program={
            "spec": spec, "log_path": str(self.work / "live.log"), "options": {"window_ms": 100.0}})
        ctl.start()
        app = make_app(ctl, title="tuiprof hf_qwen.py", export_dir=self.work, refresh_hz=4.0)
        shots = []

        async def run():
            async with app.run_test(size=(200, 50)) as pilot:
                t_end = time.monotonic() + 120
                while time.monotonic() < t_end:
                    app.refresh_view()
                    v = app.view
                    if v is not None and sum(t.phase == "decode" for t in v.tokens) > 150:
                        break
                    await asyncio.sleep(0.5)
                await asyncio.sleep(1.0)
                app.refresh_now()
                await pilot.pause()
                shots.append(app.save_screenshot("program_live_200x50.svg", str(self.out)))
                await pilot.resize_terminal(80, 24)
                await pilot.pause(0.5)
                app.refresh_now()
                await pilot.pause()
                shots.append(app.save_screenshot("program_live_80x24.svg", str(self.out)))
                await pilot.press("q")
                await app.workers.wait_for_complete()

        try:
            asyncio.run(run())
        finally:
            ctl.stop()
            ctl.close()
        prog = ctl.status.extra.get("program") or {}
        names = ", ".join(Path(s).name for s in shots)
        state = ("still running at the screenshots" if prog.get("running")
                 else f"{prog.get('ended')} (exit {prog.get('exit_status')})")
        self.lines.append(f"5. live app on the generate() script: screenshots {names}; the "
                          f"program {state}; {time.monotonic() - t:.0f} s")

    # ------------------------------------------------------------------ report
    def report(self) -> None:
        import torch
        import transformers

        head = (f"verify_program: {self.model} on {self.args.device}, torch {torch.__version__}, "
                f"transformers {transformers.__version__}, {time.monotonic() - self.t0:.0f} s")
        text = "\n".join([head, *self.lines])
        print(text)
        (self.out / "verify_program.txt").write_text(text + "\n\n" + "\n".join(self.details)
                                                     + "\n")
        (self.out / "logs.txt").write_text("\n\n".join(self.logs) + "\n")
        print(f"(details: {self.out}/verify_program.txt, logs: {self.out}/logs.txt)")


def _kernels_per_step(doc: dict | None, skip: int = 2) -> dict:
    """Median kernels (and CUDA-graph kernels) per traced decode step of the last run (cycle),
    without its first ``skip`` steps (warm-up, capture)."""
    steps = [t for t in (doc or {"tokens": []})["tokens"] if t["done"] and t["phase"] == "decode"]
    if steps:
        last = max(t["cycle"] for t in steps)
        steps = [t for t in steps if t["cycle"] == last][skip:]
    traced = [t for t in steps if t["sampled"]]
    med = (lambda xs: float(statistics.median(xs)) if xs else 0.0)
    split = [t for t in traced if t.get("model_start_ns") and t["kernels"]]
    matched = sum(t["model_kernels"] + t["loop_kernels"] for t in split)
    return {"kernels": med([t["kernels"] for t in traced]),
            "model": med([t["model_kernels"] for t in split]),
            "model_ms": med([t["model_kernel_ns"] / 1e6 for t in split]),
            "loop": med([t["loop_kernels"] for t in split]),
            "loop_ms": med([t["loop_kernel_ns"] / 1e6 for t in split]),
            "split_steps": len(split),
            "coverage": matched / max(1, sum(t["kernels"] for t in split)),
            "graph": med([t["graph_kernels"] for t in traced]), "steps": len(steps),
            "kernel_ms": med([t["kernel_ns"] / 1e6 for t in traced]),
            "api": med([t["api_calls"] for t in traced]),
            "ms": med([t["host_ms"] for t in steps]),
            "batch": sorted({t["batch"] for t in steps})}


def _per_step_names(doc: dict | None, model_only: bool = False) -> dict[str, tuple[float, float]]:
    """Decode kernels by name: (launches, µs) per traced decode step, over the whole run
    (``model_only``: those launched inside the model forward)."""
    if doc is None:
        return {}
    n = sum(1 for t in doc["tokens"] if t["done"] and t["phase"] == "decode" and t["sampled"])
    out: dict[str, tuple[float, float]] = {}
    for k in doc.get("kernels", []):
        if k.get("phase") != "decode" or not n:
            continue
        st = k.get("stats") or {}
        name = (k.get("demangled") or k["name"])[:70]
        c, us = out.get(name, (0.0, 0.0))
        count, ns = st.get("count", 0), st.get("total", 0)
        if model_only:
            count, ns = count - k.get("loop_launches", 0), ns - k.get("loop_ns", 0)
        out[name] = (c + count / n, us + ns / n / 1e3)
    return out


def _kernel_diff(eng: dict | None, hf: dict | None, top: int = 6,
                 model_only: bool = False) -> list[str]:
    """The kernels whose launches per step differ most between the engine and generate()."""
    a, b = _per_step_names(eng, model_only), _per_step_names(hf, model_only)
    rows = sorted(((b.get(k, (0, 0))[0] - a.get(k, (0, 0))[0],
                    b.get(k, (0, 0))[1] - a.get(k, (0, 0))[1], k) for k in set(a) | set(b)),
                  key=lambda r: -abs(r[0]))
    tag = "model " if model_only else ""
    return [f"     {tag}{dc:+6.2f}/step {dus:+8.1f} µs/step  {k}" for dc, dus, k in rows[:top]
            if abs(dc) >= 0.5]


if __name__ == "__main__":
    raise SystemExit(main())
