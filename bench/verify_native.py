"""GPU verification of native programs (``tuiprof run -- ./binary``): a decode-like CUDA C++
program (tests/gpu/native/decode_like.cu) compiled with nvcc here, then

1. its steps found automatically: decode steps == the program's loop count, one prefill,
   the kernels of every step by name exactly the program's launch list;
2. the same with its NVTX ranges (``--step-range``);
3. kernel times against ``nsys profile`` of the same binary (mean per kernel name, within 1 %);
4. the program's own decode time alone and under tuiprof, interleaved, medians (<= 5 % slower);
5. the live app on it in tmux (captures at 200x50 and 80x24, pause and resume, the log, q).

    python3 bench/verify_native.py --out DIR [--steps 512] [--rounds 6] [--overhead-steps 3000]
        [--tmux "TMUX COMMAND"] [--nsys NSYS --importer QDSTRM_IMPORTER --dw-lib DIR]

Writes DIR/verify_native.json (every figure, every check) and prints a summary.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tests" / "gpu" / "native" / "decode_like.cu"


def sh(cmd, timeout=300, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=env or os.environ, **kw)


def program_line(text: str) -> tuple[list[str], dict]:
    names, figures = [], {}
    for line in text.splitlines():
        if line.startswith("decode_like: kernels per step"):
            names = line.split(":", 2)[2].split()
        elif line.startswith("decode_like: {"):
            figures = json.loads(line[len("decode_like: "):])
    return names, figures


def tuiprof(out: Path, binary: str, *args: str, options=(), timeout=300):
    json_path = out
    cmd = [sys.executable, "-m", "tuiprof", "run", "--headless", "--json", str(json_path),
           *options, "--", binary, *args]
    proc = sh(cmd, timeout=timeout)
    doc = json.loads(json_path.read_text()) if json_path.exists() else None
    return proc, doc


def check(results: dict, name: str, ok: bool, detail) -> None:
    results["checks"][name] = {"ok": bool(ok), "detail": detail}
    print(f"  [{'ok' if ok else 'FAIL'}] {name}: {detail}", flush=True)


def steps_checks(results, doc, names, steps, source, prefix):
    meta = doc["meta"]
    toks = [t for t in doc["tokens"] if t["done"]]
    dec = [t for t in toks if t["phase"] == "decode"]
    pre = [t for t in toks if t["phase"] == "prefill"]
    check(results, f"{prefix}: step source", meta.get("step_source") == source,
          meta.get("step_source"))
    check(results, f"{prefix}: decode steps == loop count", len(dec) == steps,
          f"{len(dec)} found, {steps} run")
    check(results, f"{prefix}: one prefill", len(pre) == 1, f"{len(pre)} prefill steps")
    counts = sorted({t["kernels"] for t in dec})
    check(results, f"{prefix}: kernels per decode step", counts == [len(names)],
          f"{counts} (program: {len(names)})")
    raw = {e["seq"]: [r for r in e["records"] if r[0] == "K"] for e in doc["raw"]}
    bad = [t["seq"] for t in dec if t["seq"] in raw
           and [r[1] for r in sorted(raw[t["seq"]], key=lambda r: r[2])] != names]
    seen = sum(1 for t in dec if t["seq"] in raw)
    check(results, f"{prefix}: kernel names of every step, in order", not bad and seen == len(dec),
          f"{seen} steps compared, {len(bad)} differ" + (f" (first: seq {bad[0]})" if bad else ""))


def nsys_compare(results, args, binary, steps, doc, out):
    rep = Path("/tmp/tuiprof_native_nsys")
    for p in rep.parent.glob(rep.name + ".*"):
        p.unlink()
    t0 = time.time()
    prof = sh([args.nsys, "profile", "-o", str(rep), "--force-overwrite", "true", "--trace",
               "cuda", binary, str(steps)], timeout=240)
    qd = rep.with_suffix(".qdstrm")
    if not qd.exists():
        check(results, "nsys: profile", False, prof.stderr[-300:] or prof.stdout[-300:])
        return
    env = dict(os.environ, LD_LIBRARY_PATH=args.dw_lib or "")
    sh([args.importer, "-i", str(qd)], timeout=240, env=env)
    stats = sh([args.nsys, "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv",
                str(rep.with_suffix(".nsys-rep"))], timeout=240)
    (out / "nsys_kern_sum.csv").write_text(stats.stdout)
    text = stats.stdout[stats.stdout.find('"Time'):] if '"Time' in stats.stdout else stats.stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    nsys = {}
    for r in rows:
        try:
            name = re.sub(r"\(.*$", "", r["Name"]).strip()
            nsys[name] = (int(float(r["Instances"])), float(r["Total Time (ns)"]))
        except (KeyError, ValueError):
            continue
    ours: dict[str, list] = {}
    for k in doc["kernels"]:
        c = ours.setdefault(k["name"], [0, 0.0])
        c[0] += k["stats"]["count"]
        c[1] += k["stats"]["total"]
    total = sum(v[1] for v in ours.values()) or 1.0
    table, worst = [], 0.0
    for name, (n, tot) in sorted(ours.items(), key=lambda kv: -kv[1][1]):
        if name not in nsys:
            table.append({"kernel": name, "missing_in_nsys": True})
            continue
        nn, ntot = nsys[name]
        ratio = (tot / n) / (ntot / nn) if n and nn else None
        share = tot / total
        table.append({"kernel": name, "tuiprof_count": n, "nsys_count": nn,
                      "tuiprof_mean_ns": tot / n if n else None, "nsys_mean_ns": ntot / nn,
                      "mean_ratio": ratio, "share_of_gpu_time": share})
        if ratio is not None and share >= 0.005:
            worst = max(worst, abs(ratio - 1))
    results["nsys"] = {"table": table, "seconds": round(time.time() - t0, 1)}
    for row in table:
        if "mean_ratio" in row:
            print(f"    {row['kernel']:<20} tuiprof {row['tuiprof_mean_ns'] / 1e3:9.2f} us "
                  f"x{row['tuiprof_count']:<6} nsys {row['nsys_mean_ns'] / 1e3:9.2f} us "
                  f"x{row['nsys_count']:<6} ratio {row['mean_ratio']:.4f}")
    check(results, "nsys: kernel mean times within 1 % (kernels >= 0.5 % of GPU time)",
          worst <= 0.01 and table and not any(r.get("missing_in_nsys") for r in table),
          f"worst |ratio-1| = {worst:.4f}")
    counts_ok = all(r.get("tuiprof_count") == r.get("nsys_count") for r in table
                    if "mean_ratio" in r)
    check(results, "nsys: kernel counts equal", counts_ok, "per kernel name")


def overhead(results, args, binary, out):
    alone, under = [], []
    for r in range(args.rounds):
        for which in ("alone", "tuiprof") if r % 2 == 0 else ("tuiprof", "alone"):
            if which == "alone":
                p = sh([binary, str(args.overhead_steps)], timeout=120)
                _, fig = program_line(p.stdout)
                alone.append(fig)
            else:
                p, _ = tuiprof(Path(f"/tmp/tuiprof_native_overhead_{r}.json"), binary,
                               str(args.overhead_steps))
                _, fig = program_line(p.stdout)
                under.append(fig)
    res = {}
    for key in ("decode_ms", "median_step_us"):
        a = statistics.median(f[key] for f in alone if f)
        b = statistics.median(f[key] for f in under if f)
        res[key] = {"alone": [f.get(key) for f in alone], "tuiprof": [f.get(key) for f in under],
                    "median_alone": a, "median_tuiprof": b, "ratio": b / a}
    results["overhead"] = res
    r = res["decode_ms"]["ratio"]
    check(results, "overhead: the program's own decode time under tuiprof <= 1.05x", r <= 1.05,
          f"{res['decode_ms']['median_tuiprof']:.1f} / {res['decode_ms']['median_alone']:.1f} ms "
          f"= {r:.3f} (median of {args.rounds}, interleaved); median step "
          f"{res['median_step_us']['ratio']:.3f}")


def live(results, args, binary, out):
    t = args.tmux.split()
    sess = "tpnative"
    exp = Path("/tmp/tuiprof_native_live")
    exp.mkdir(exist_ok=True)
    subprocess.run([*t, "kill-session", "-t", sess], capture_output=True)
    cmd = (f"cd {REPO} && {sys.executable} -m tuiprof run --export-dir {exp} -- {binary} "
           f"{args.live_steps} --sleep-us 300; sleep 30")
    subprocess.run([*t, "new-session", "-d", "-s", sess, "-x", "200", "-y", "50", cmd], check=True)

    screens = out / "native_live.txt"   # every capture, one after the other
    screens.write_text("")

    def cap(name, wait):
        time.sleep(wait)
        text = subprocess.run([*t, "capture-pane", "-p", "-t", sess], capture_output=True,
                              text=True).stdout
        with screens.open("a") as fh:
            fh.write(f"===== {name}\n{text}\n")
        return text

    def key(k):
        subprocess.run([*t, "send-keys", "-t", sess, k])

    first = cap("200x50", 25)
    later = cap("200x50_later", 10)
    key("space")
    cap("200x50_paused", 3)
    key("space")
    cap("200x50_resumed", 3)
    key("l")
    cap("200x50_log", 3)
    key("Escape")
    subprocess.run([*t, "resize-window", "-t", sess, "-x", "80", "-y", "24"])
    cap("80x24", 4)
    key("q")
    end = cap("quit", 12)
    subprocess.run([*t, "kill-session", "-t", sess], capture_output=True)
    steps = [int(m.group(1).replace(",", "")) for txt in (first, later)
             for m in [re.search(r"steps ([\d,]+)", txt)] if m]
    check(results, "live: steps counted on screen and moving", len(steps) == 2
          and steps[1] > steps[0] > 0, f"header steps {steps}")
    check(results, "live: q wrote the snapshot", "snapshot written" in end,
          end.strip().splitlines()[-3:] if end.strip() else "")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--overhead-steps", type=int, default=3000)
    ap.add_argument("--live-steps", type=int, default=200000)
    ap.add_argument("--tmux", default="")
    ap.add_argument("--nsys", default="")
    ap.add_argument("--importer", default="")
    ap.add_argument("--dw-lib", default="")
    ap.add_argument("--only", default="steps,nvtx,nsys,overhead,live")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(","))
    results: dict = {"checks": {}}
    smi = sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    results["device"] = smi.stdout.strip()
    print("device:", results["device"])
    binary = "/tmp/decode_like"
    t0 = time.time()
    b = sh(["nvcc", "-O2", "-arch=native", "-o", binary, str(SOURCE)], timeout=300)
    if b.returncode:
        b = sh(["nvcc", "-O2", "-arch=sm_90", "-o", binary, str(SOURCE)], timeout=300)
    check(results, "nvcc builds decode_like.cu", b.returncode == 0,
          f"{time.time() - t0:.1f} s {b.stderr[-200:]}")
    if b.returncode:
        (out / "verify_native.json").write_text(json.dumps(results, indent=1))
        return 1
    lib = sh([sys.executable, "-c", "from tuiprof.native.build import build; b = build(); "
              "print(b.path, b.cuda_h, b.cupti.source, b.cupti.version, b.cupti.lib)"])
    results["library"] = lib.stdout.strip() or lib.stderr.strip()[-300:]
    print("injection library:", results["library"])
    alone = sh([binary, str(args.steps)], timeout=120)
    names, fig = program_line(alone.stdout)
    results["program_alone"] = fig
    print("program:", fig)

    if "steps" in only:
        proc, doc = tuiprof(out / "steps.json", binary, str(args.steps),
                            options=("--ring-tokens", str(args.steps + 8)))
        (out / "steps_stdout.txt").write_text(proc.stdout[-6000:] + "\n" + proc.stderr[-3000:])
        if doc is None:
            check(results, "auto: snapshot", False, proc.stderr[-400:])
        else:
            results["auto_steps"] = doc["meta"].get("auto_steps")
            results["native_meta"] = doc["meta"].get("native")
            steps_checks(results, doc, names, args.steps, "auto", "auto")
            auto = doc["meta"].get("auto_steps") or {}
            check(results, "auto: confidence high, host-gap boundary",
                  auto.get("confidence_label") == "high"
                  and auto.get("boundary") == "host gap before each step",
                  f"{auto.get('confidence')} {auto.get('confidence_label')}; {auto.get('boundary')}")
            check(results, "exit status and output kept", proc.returncode == 0
                  and any("decode_like: {" in x for x in doc.get("output", [])),
                  f"status {proc.returncode}")
            ids = [f["id"] for f in doc.get("findings", [])]
            check(results, "finding grid-too-small applies", "grid-too-small" in ids, ids)
            if "nsys" in only and args.nsys:
                nsys_compare(results, args, binary, args.steps, doc, out)
    if "nvtx" in only:
        proc, doc = tuiprof(Path("/tmp/tuiprof_native_nvtx.json"), binary, str(args.steps),
                            "--nvtx",
                            options=("--ring-tokens", str(args.steps + 8), "--step-range",
                                     "decode", "--step-range", "prefill"))
        if doc is None:
            check(results, "nvtx: snapshot", False, proc.stderr[-400:])
        else:
            steps_checks(results, doc, names, args.steps, "nvtx", "nvtx")
    if "overhead" in only:
        overhead(results, args, binary, out)
    if "live" in only and args.tmux:
        live(results, args, binary, out)
    failed = [k for k, v in results["checks"].items() if not v["ok"]]
    results["failed"] = failed
    (out / "verify_native.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\n{len(results['checks']) - len(failed)} of {len(results['checks'])} checks passed"
          + (f"; failed: {failed}" if failed else ""))
    shutil.rmtree("/tmp/tuiprof_native_nsys", ignore_errors=True)
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
