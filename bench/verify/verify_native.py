"""GPU verification of native programs (``tuiprof run -- ./binary``): a decode-like CUDA C++
program (tests/gpu/native/decode_like.cu) compiled with nvcc here, then

1. its steps found automatically: decode steps == the program's loop count, one prefill,
   the kernels of every step by name exactly the program's launch list;
2. the same with its NVTX ranges (``--step-range``);
3. kernel times against ``nsys profile`` of the same binary (mean per kernel name, within 1 %,
   for the kernels of at least 0.5 % of the GPU time; counts equal for every name), every
   kernel printed with both means;
4. the program's own decode time alone and under tuiprof, interleaved, medians (<= 5 % slower);
5. the live app on it in tmux (captures at 200x50 and 80x24, pause and resume, the log, q);
6. the CPU tests of the native path on this machine, their whole output printed.

    python3 bench/verify/verify_native.py --out DIR [--steps 512] [--rounds 6] [--overhead-steps 3000]
        [--tmux "TMUX COMMAND"] [--nsys NSYS --importer QDSTRM_IMPORTER --dw-lib DIR]
        [--only steps,nvtx,nsys,overhead,live,cpu]

Writes into DIR: verify_native.json (every figure and check, rewritten at each check),
steps.json (the snapshot of the auto-steps run), steps_stdout.txt, nsys_kern_sum.csv and
nsys_gpu_trace.csv (as ``nsys stats`` printed them) and native_live.txt (the tmux captures);
prints every check, then a recap of them all and the count passed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

from tuiprof.text import printable  # kernel names come from the program: sanitised on stdout
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "gpu" / "native" / "decode_like.cu"
EXTRA: list[str] = []   # --program-args


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
    json_path.unlink(missing_ok=True)   # a run that writes nothing must not read an old one
    # every step traced: the kernel totals are compared with nsys's whole run
    cmd = [sys.executable, "-m", "tuiprof", "run", "--headless", "--json", str(json_path),
           "--sample-every", "1", *options, "--", binary, *args, *EXTRA]
    proc = sh(cmd, timeout=timeout)
    doc = json.loads(json_path.read_text()) if json_path.exists() else None
    return proc, doc


JSON_OUT: Path | None = None     # verify_native.json, rewritten at every check


def save(results: dict) -> None:
    """Every figure and check so far into verify_native.json: a run cut short (the device
    call's limit, a hang) still leaves what it measured."""
    if JSON_OUT is not None:
        results["failed"] = [k for k, v in results["checks"].items() if not v["ok"]]
        JSON_OUT.write_text(json.dumps(results, indent=1, default=str))


def check(results: dict, name: str, ok: bool, detail) -> None:
    results["checks"][name] = {"ok": bool(ok), "detail": detail}
    print(f"  [{'ok' if ok else 'FAIL'}] {name}: {detail}", flush=True)
    save(results)


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
    results[f"{prefix}_kernels_per_step"] = {
        str(n): sum(1 for t in dec if t["kernels"] == n) for n in counts}
    check(results, f"{prefix}: kernels per decode step", counts == [len(names)],
          f"{counts} (program: {len(names)})")
    raw = {e["seq"]: [r for r in e["records"] if r[0] == "K"] for e in doc["raw"]}
    step_names = {t["seq"]: [r[1] for r in sorted(raw[t["seq"]], key=lambda r: r[2])]
                  for t in dec if t["seq"] in raw}
    bad = [seq for seq, got in step_names.items() if got != names]
    results[f"{prefix}_differing_steps"] = [{"seq": q, "kernels": step_names[q]}
                                            for q in bad[:3]]
    seen = len(step_names)
    check(results, f"{prefix}: kernel names of every step, in order", not bad and seen == len(dec),
          f"{seen} steps compared, {len(bad)} differ" + (f" (first: seq {bad[0]})" if bad else ""))


MEAN_TOL = 0.01      # kernel mean times: |tuiprof / nsys - 1| at most this
# %globaltimer's step on the H100 (every in-kernel span read there is a multiple of it): two
# own-clock medians closer than this are not told apart, whatever 1 % of the kernel is
CLOCK_NS = 32
MIN_SHARE = 0.005    # ... for kernels of at least this share of the GPU time (either side's)


# nsys's demangler (cu++filt) casts template values, ``k<(int)1, (bool)1, (ggml_type)8>``, where
# GNU's prints ``k<1, true, (ggml_type)8>``; and it drops the per-file namespace of an internal
# symbol (``&op_add`` for GNU's ``&_INTERNAL_b4c05585_11_binbcast_cu_6840010b::op_add``)
_CAST = re.compile(r"\(([A-Za-z_][\w:]*(?: [A-Za-z_]\w*)*)\)(-?\d+)")
_INTERNAL = re.compile(r"_INTERNAL_[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+::")
_INT_SUFFIX = re.compile(r"\b(\d+)(?:ull|ul|ll|u|l)\b")


def canonical(name: str) -> str:
    """A template name as both demanglers print it: values without casts, booleans as
    ``true``/``false``, no internal per-file namespaces, ``T const*`` pointers."""
    name = _CAST.sub(lambda m: ("false" if m.group(2) == "0" else "true")
                     if m.group(1) == "bool" else m.group(2), name)
    name = _INT_SUFFIX.sub(r"\1", _INTERNAL.sub("", name))
    name = re.sub(r"\bconst ([\w:]+) \*", r"\1 const*", name)   # const float * -> float const*
    name = re.sub(r"(\w) \*", r"\1*", name)
    return name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")


def base_name(name: str) -> str:
    """A kernel's name without its parameter list (nsys prints ``k(const float *, int)``,
    tuiprof's demangler ``k(float const*, int)``), in :func:`canonical` form; decode_like's
    kernels are extern "C", so both sides print the plain name anyway."""
    name = canonical(name.strip())
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i].strip()
                break
    return name[5:] if name.startswith("void ") else name


def kernel_table(nsys_csv: Path, kernels: list) -> dict:
    """nsys's kernel summary (``cuda_gpu_kern_sum``, CSV as ``nsys stats`` printed it) against
    a tuiprof snapshot's kernels (summed over phases and modes), per kernel name: counts, mean
    times, their ratio, each side's share of its GPU time. Every name of either side is a row;
    ``compared`` are those both sides have with a share of at least ``MIN_SHARE`` on either."""
    from tuiprof.export.check_nsys import read_nsys_csv

    header, rows = read_nsys_csv(nsys_csv)
    theirs: dict[str, list] = {}
    bad_rows = 0
    for r in rows:
        try:
            cell = dict(zip(header, r))
            c = theirs.setdefault(base_name(cell["Name"]), [0, 0.0])
            c[0] += int(float(cell["Instances"].replace(",", "")))
            c[1] += float(cell["Total Time (ns)"].replace(",", ""))
        except (KeyError, ValueError):
            bad_rows += 1
    ours: dict[str, list] = {}
    for k in kernels:
        c = ours.setdefault(base_name(k.get("demangled") or k["name"]), [0, 0.0])
        c[0] += k["stats"]["count"]
        c[1] += k["stats"]["total"]
    tot_ours = sum(v[1] for v in ours.values()) or 1.0
    tot_theirs = sum(v[1] for v in theirs.values()) or 1.0
    table = []
    for name in sorted(set(ours) | set(theirs),
                       key=lambda n: -max(ours.get(n, (0, 0))[1] / tot_ours,
                                          theirs.get(n, (0, 0))[1] / tot_theirs)):
        n, tot = ours.get(name, (0, 0.0))
        nn, ntot = theirs.get(name, (0, 0.0))
        share = max(tot / tot_ours, ntot / tot_theirs)
        mean, nmean = (tot / n if n else None), (ntot / nn if nn else None)
        ratio = mean / nmean if mean is not None and nmean else None
        table.append({"kernel": name, "tuiprof_count": n, "nsys_count": nn,
                      "tuiprof_mean_ns": mean, "nsys_mean_ns": nmean, "mean_ratio": ratio,
                      "share_of_gpu_time": share,
                      "only_in": "tuiprof" if not nn else "nsys" if not n else None,
                      "compared": ratio is not None and share >= MIN_SHARE})
    compared = [r for r in table if r["compared"]]
    worst = max(compared, key=lambda r: abs(r["mean_ratio"] - 1), default=None)
    return {"header": header, "nsys_rows": len(rows), "unreadable_rows": bad_rows,
            "table": table, "compared": [r["kernel"] for r in compared],
            "worst": worst and {"kernel": worst["kernel"],
                                "abs_ratio_minus_1": abs(worst["mean_ratio"] - 1)},
            "missing": [r["kernel"] for r in table
                        if r["only_in"] and r["share_of_gpu_time"] >= MIN_SHARE],
            "count_differs": [r["kernel"] for r in table
                              if r["tuiprof_count"] != r["nsys_count"]]}


def kernel_checks(results: dict, res: dict) -> None:
    """The two nsys checks from :func:`kernel_table`'s result, and the table printed."""
    print(f"    {'kernel':<22} {'tuiprof mean':>13} {'count':>7} {'nsys mean':>13} {'count':>7} "
          f"{'ratio':>7} {'share':>6}")
    for r in res["table"]:
        def us(v):
            return "-" if v is None else f"{v / 1e3:.3f} us"
        ratio = "-" if r["mean_ratio"] is None else f"{r['mean_ratio']:.4f}"
        note = ("" if r["compared"] else f"  (only in {r['only_in']})" if r["only_in"]
                else f"  (< {MIN_SHARE:.1%} of GPU time: not compared)")
        print(f"    {printable(r['kernel'], 22):<22} {us(r['tuiprof_mean_ns']):>13} {r['tuiprof_count']:>7} "
              f"{us(r['nsys_mean_ns']):>13} {r['nsys_count']:>7} {ratio:>7} "
              f"{r['share_of_gpu_time']:>6.1%}{note}")
    worst = res["worst"]
    if not res["nsys_rows"]:
        detail = f"nsys's CSV held no kernel rows (header {res['header']}): see nsys_kern_sum.csv"
    elif not res["compared"]:
        detail = "no kernel of at least 0.5 % of the GPU time on both sides"
    else:
        detail = (f"worst |ratio-1| = {worst['abs_ratio_minus_1']:.4f} ({worst['kernel']}) over "
                  f"{len(res['compared'])} kernels: {', '.join(res['compared'])}")
    if res["missing"]:
        detail += f"; on one side only: {res['missing']}"
    check(results, "nsys: kernel mean times within 1 % (kernels >= 0.5 % of GPU time)",
          bool(res["compared"]) and worst["abs_ratio_minus_1"] <= MEAN_TOL
          and not res["missing"], detail)
    differ = [f"{r['kernel']} tuiprof {r['tuiprof_count']} nsys {r['nsys_count']}"
              for r in res["table"] if r["kernel"] in res["count_differs"]]
    check(results, "nsys: kernel counts equal", bool(res["nsys_rows"]) and not differ,
          f"{len(res['table'])} kernel names, every one's count equal" if not differ
          else f"differ: {differ}")


IDLE_NS = 2_000   # a kernel after at least this much GPU idle time counts as "after idle"


def ops_from_raw(doc: dict) -> list:
    """(start, end, kernel name, or "" for a copy or memset) of every device operation in a
    tuiprof snapshot's raw records (tuiprof/store/records.py's layout), by start."""
    ops = set()
    for tok in doc.get("raw") or []:
        for r in tok["records"]:
            if r[0] == "K":
                ops.add((r[2], r[3], base_name(r[1])))
            elif r[0] == "C":
                ops.add((r[3], r[4], ""))
            elif r[0] == "S":
                ops.add((r[2], r[3], ""))
    return sorted(ops)


def ops_from_trace_csv(path: Path) -> list:
    """The same from nsys's ``cuda_gpu_trace`` CSV (Start, Duration, Name; a copy or memset
    is named ``[CUDA memcpy …]`` / ``[CUDA memset]``)."""
    from tuiprof.export.check_nsys import read_nsys_csv

    header, rows = read_nsys_csv(path)
    ops = []
    for r in rows:
        cell = dict(zip(header, r))
        try:
            start = int(float(cell["Start (ns)"].replace(",", "")))
            dur = int(float(cell["Duration (ns)"].replace(",", "")))
        except (KeyError, ValueError):
            continue
        name = cell.get("Name", "")
        ops.append((start, start + dur, "" if name.startswith("[CUDA") else base_name(name)))
    return sorted(ops)


def idle_table(ours: list, theirs: list) -> list:
    """Per kernel, on each side: how long the GPU sat idle before it (its start minus the end
    of every operation before it), and its median duration after idle (>= ``IDLE_NS``) and
    after none. A kernel whose duration differs between two tools only where it follows idle
    time is slowed by the idle time each tool's host overhead leaves, not mis-measured."""
    def per_kernel(ops):
        out: dict[str, list] = {}
        busy_to = None
        for start, end, name in ops:
            idle = 0 if busy_to is None else max(0, start - busy_to)
            busy_to = end if busy_to is None else max(busy_to, end)
            if name:
                out.setdefault(name, []).append((end - start, idle))
        return out

    def med(xs):
        return statistics.median(xs) if xs else None

    a, b = per_kernel(ours), per_kernel(theirs)
    rows = []
    for name in sorted(set(a) & set(b), key=lambda n: -sum(d for d, _ in b[n])):
        row = {"kernel": name}
        for side, got in (("tuiprof", a[name]), ("nsys", b[name])):
            row[side] = {"n": len(got), "median_ns": med([d for d, _ in got]),
                         "idle_before_median_ns": med([i for _, i in got]),
                         "median_after_idle_ns": med([d for d, i in got if i >= IDLE_NS]),
                         "median_after_none_ns": med([d for d, i in got if i < IDLE_NS])}
        rows.append(row)
    return rows


def print_idle_table(rows: list) -> None:
    def us(v):
        return "-" if v is None else f"{v / 1e3:.3f}"
    print(f"    {'kernel':<18} {'idle before, us (tuiprof / nsys)':>33} "
          f"{'after idle, us':>17} {'after none, us':>17}")
    for r in rows:
        t, n = r["tuiprof"], r["nsys"]
        print(f"    {printable(r['kernel'], 18):<18} {us(t['idle_before_median_ns']):>16} / "
              f"{us(n['idle_before_median_ns']):<14} {us(t['median_after_idle_ns']):>8} / "
              f"{us(n['median_after_idle_ns']):<8} {us(t['median_after_none_ns']):>8} / "
              f"{us(n['median_after_none_ns']):<8}")


def nsys_compare(results, args, binary, steps, doc, out):
    rep = Path("/tmp/tuiprof_native_nsys")
    for p in rep.parent.glob(rep.name + ".*"):
        p.unlink()
    t0 = time.time()
    prof = sh([args.nsys, "profile", "-o", str(rep), "--force-overwrite", "true", "--trace",
               "cuda", binary, str(steps), *EXTRA], timeout=240)
    qd = rep.with_suffix(".qdstrm")
    if not qd.exists():
        check(results, "nsys: profile", False, prof.stderr[-300:] or prof.stdout[-300:])
        return
    env = dict(os.environ, LD_LIBRARY_PATH=args.dw_lib or "")
    sh([args.importer, "-i", str(qd)], timeout=240, env=env)
    stats = sh([args.nsys, "stats", "--force-export=true", "--report", "cuda_gpu_kern_sum", "--format", "csv",
                str(rep.with_suffix(".nsys-rep"))], timeout=240)
    csv_path = out / "nsys_kern_sum.csv"
    csv_path.write_text(stats.stdout)
    res = kernel_table(csv_path, doc["kernels"])
    res["seconds"] = round(time.time() - t0, 1)
    res["nsys_stats_stderr"] = stats.stderr[-2000:]
    results["nsys"] = res
    kernel_checks(results, res)
    # the GPU's idle time before each kernel on both sides (figures only, no check)
    trace = sh([args.nsys, "stats", "--force-export=true", "--report", "cuda_gpu_trace", "--format", "csv",
                str(rep.with_suffix(".nsys-rep"))], timeout=240)
    trace_path = out / "nsys_gpu_trace.csv"
    trace_path.write_text(trace.stdout)
    if "Start (ns)" not in trace.stdout:
        print("    nsys cuda_gpu_trace gave no table:", printable(trace.stderr[-300:], 300))
    rows = idle_table(ops_from_raw(doc), ops_from_trace_csv(trace_path))
    results["nsys_idle"] = {"idle_ns": IDLE_NS, "table": rows}
    print_idle_table(rows)
    in_kernel_table(results, doc, program_line(prof.stdout)[1], res)
    save(results)


def in_kernel_table(results, doc, under_nsys: dict, kern: dict) -> None:
    """The program's own clocks inside every decode kernel (median span over the decode
    launches), alone, under tuiprof and under nsys, beside each tool's CUPTI mean: where one
    tool's reading differs from the other's, do the kernel's own clocks differ the same way?"""
    under_tp = {}
    for line in doc.get("output", []):
        if line.startswith("decode_like: {"):
            under_tp = program_line(line)[1]
    runs = {"alone": results.get("program_alone") or {}, "tuiprof": under_tp,
            "nsys": under_nsys}
    means = {r["kernel"]: r for r in kern.get("table", [])} if isinstance(kern, dict) else {}
    names = [k[:-3] for k in (under_tp.get("in_kernel") or {}) if k.endswith("_ns")]
    table = []
    print("    in-kernel span (median over the decode launches), and each tool's CUPTI mean")
    print(f"    {'kernel':<18} {'own ns: alone / tuiprof / nsys':>32} {'CUPTI ns: tuiprof / nsys':>26}"
          f" {'CUPTI beyond own ns: tuiprof / nsys':>36}")
    for k in names:
        own = {w: (runs[w].get("in_kernel") or {}).get(f"{k}_ns") for w in runs}
        m = means.get(k, {})
        cupti = {"tuiprof": m.get("tuiprof_mean_ns"), "nsys": m.get("nsys_mean_ns")}
        beyond = {t: (cupti[t] - own[t] if cupti[t] is not None and own[t] else None)
                  for t in cupti}
        table.append({"kernel": k, "own_ns": own, "cupti_mean_ns": cupti, "beyond_ns": beyond})

        def f(v):
            return "-" if v is None else f"{v:.0f}"
        print(f"    {printable(k, 18):<18} {' / '.join(f(own[w]) for w in runs):>32} "
              f"{f(cupti['tuiprof']) + ' / ' + f(cupti['nsys']):>26} "
              f"{f(beyond['tuiprof']) + ' / ' + f(beyond['nsys']):>36}")
    results["in_kernel"] = table
    # each tool's reservation before the program's first buffer (tuiprof/injection/inject.c):
    # the same figure under both tools means the program's buffers land alike
    used = {w: runs[w].get("used_mib_at_start") for w in runs}
    results["used_mib_at_start"] = used
    print("    device memory in use at the program's start, MiB: "
          + " / ".join(f"{w} {'-' if v is None else f'{v:.1f}'}" for w, v in used.items()))
    if used["tuiprof"] is not None and used["nsys"] is not None:
        alone = "-" if used["alone"] is None else f"{used['alone']:.1f}"
        check(results, "nsys: the same device memory in use at the program's start (within 1 MiB)",
              abs(used["tuiprof"] - used["nsys"]) <= 1.0,
              f"tuiprof {used['tuiprof']:.1f} MiB, nsys {used['nsys']:.1f}, alone {alone}")


def own_clock_check(beyond: dict) -> tuple[bool, str]:
    """Per kernel of at least ``MIN_SHARE`` of the GPU time (``beyond``: nsys_repeat's rows), do
    the two tools' medians of CUPTI's mean less the kernel's own span agree within ``MEAN_TOL``
    of the kernel's nsys mean, or within one step of the clock (``CLOCK_NS``)?"""
    big = [(k, r["diff_of_kernel"], abs(r["tuiprof"]["median_beyond_ns"]
                                         - r["nsys"]["median_beyond_ns"]))
           for k, r in beyond.items()
           if (r.get("share") or 0) >= MIN_SHARE and r.get("diff_of_kernel") is not None]
    if not big:
        return False, "no kernel compared"
    worst = max(big, key=lambda x: x[1])
    over = [k for k, frac, ns in big if frac > MEAN_TOL and ns > CLOCK_NS]
    return not over, (f"worst {worst[0]} {worst[1]:.2%} ({worst[2]:.0f} ns) over {len(big)} "
                      f"kernels" + (f"; beyond both: {over}" if over else ""))


def nsys_repeat(results, args, binary, out):
    """tuiprof and nsys each run ``--repeat`` times, alternating: per kernel, each tool's mean
    in every run, the spread of each tool's own runs, and the ratio of the two tools' medians.
    Two profilers cannot trace one run, so a ratio from one run of each mixes measurement with
    run-to-run change; the spread of nsys's own runs says how much of that change there is."""
    per = {"tuiprof": [], "nsys": []}
    own = {"tuiprof": [], "nsys": []}  # the program's in-kernel clocks in each run
    for r in range(args.repeat):
        for tool in (("tuiprof", "nsys") if r % 2 == 0 else ("nsys", "tuiprof")):
            if tool == "tuiprof":
                _, doc = tuiprof(Path(f"/tmp/tuiprof_native_rep_{r}.json"), binary,
                                 str(args.steps), options=("--ring-tokens", "8"))
                means = {}
                for k in (doc or {}).get("kernels", []):
                    c = means.setdefault(base_name(k.get("demangled") or k["name"]), [0, 0.0])
                    c[0] += k["stats"]["count"]
                    c[1] += k["stats"]["total"]
                per["tuiprof"].append({n: t / c for n, (c, t) in means.items() if c})
                own["tuiprof"].append(next((program_line(x)[1].get("in_kernel", {})
                                            for x in (doc or {}).get("output", [])
                                            if x.startswith("decode_like: {")), {}))
            else:
                rep = Path(f"/tmp/tuiprof_native_nsys_rep_{r}")
                for p in rep.parent.glob(rep.name + ".*"):  # the importer keeps an old report
                    p.unlink()
                prof = sh([args.nsys, "profile", "-o", str(rep), "--force-overwrite", "true",
                           "--trace", "cuda", binary, str(args.steps), *EXTRA], timeout=240)
                own["nsys"].append(program_line(prof.stdout)[1].get("in_kernel", {}))
                env = dict(os.environ, LD_LIBRARY_PATH=args.dw_lib or "")
                sh([args.importer, "-i", str(rep.with_suffix(".qdstrm"))], timeout=240, env=env)
                st = sh([args.nsys, "stats", "--force-export=true", "--report", "cuda_gpu_kern_sum", "--format", "csv",
                         str(rep.with_suffix(".nsys-rep"))], timeout=240)
                csv_path = Path(f"/tmp/tuiprof_native_nsys_rep_{r}.csv")
                csv_path.write_text(st.stdout)
                from tuiprof.export.check_nsys import read_nsys_csv
                header, rows = read_nsys_csv(csv_path)
                means = {}
                for row in rows:
                    cell = dict(zip(header, row))
                    means[base_name(cell["Name"])] = (
                        float(cell["Total Time (ns)"].replace(",", ""))
                        / float(cell["Instances"].replace(",", "")))
                per["nsys"].append(means)
    table = []
    shares = (results.get("nsys") or {}).get("table") or []
    share = {r["kernel"]: r["share_of_gpu_time"] for r in shares}
    for name in sorted({n for runs in per.values() for m in runs for n in m},
                       key=lambda n: -share.get(n, 0)):
        a = [m[name] for m in per["tuiprof"] if name in m]
        b = [m[name] for m in per["nsys"] if name in m]
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        table.append({"kernel": name, "share": share.get(name), "tuiprof_means_ns": a,
                      "nsys_means_ns": b, "tuiprof_spread": max(a) / min(a) - 1,
                      "nsys_spread": max(b) / min(b) - 1, "median_ratio": ma / mb})
    # what each tool reads beyond the kernel's own clock (CUPTI mean minus the in-kernel
    # median, per run): equal on both sides means both measure the kernel alike, whatever the
    # kernel itself did in each run
    beyond = {}
    names = sorted({k[:-3] for o in own["tuiprof"] for k in o if k.endswith("_ns")},
                   key=lambda n: -share.get(n, 0))
    for k in names:
        row = {}
        for tool in per:
            d = [m[k] - o[f"{k}_ns"] for m, o in zip(per[tool], own[tool])
                 if k in m and o.get(f"{k}_ns")]
            row[tool] = {"own_ns": [o.get(f"{k}_ns") for o in own[tool]],
                         "beyond_ns": [round(x, 1) for x in d],
                         "median_beyond_ns": statistics.median(d) if d else None}
        nm = [m[k] for m in per["nsys"] if k in m]
        a_, b_ = row["tuiprof"]["median_beyond_ns"], row["nsys"]["median_beyond_ns"]
        row["share"] = share.get(k)
        row["diff_of_kernel"] = (abs(a_ - b_) / statistics.median(nm)
                                 if a_ is not None and b_ is not None and nm else None)
        beyond[k] = row
    print(f"    {'kernel':<18} {'own ns, tuiprof runs':>22} {'own ns, nsys runs':>22} "
          f"{'beyond own: tuiprof / nsys ns':>30} {'diff / kernel':>14}")
    for k, row in beyond.items():
        def rng(v):
            v = [x for x in v if x]
            return f"{min(v)}–{max(v)}" if v else "-"
        d = row["diff_of_kernel"]
        print(f"    {printable(k, 18):<18} {rng(row['tuiprof']['own_ns']):>22} "
              f"{rng(row['nsys']['own_ns']):>22} "
              f"{row['tuiprof']['median_beyond_ns'] or 0:>14.0f} / {row['nsys']['median_beyond_ns'] or 0:<13.0f}"
              f"{'-' if d is None else f'{d:.2%}':>14}")
    ok, detail = own_clock_check(beyond)
    check(results, f"nsys x{args.repeat}: each tool's reading beyond the kernel's own clock "
                   f"agrees within 1 % of the kernel or the clock's {CLOCK_NS} ns step "
                   f"(kernels >= 0.5 % of GPU time)", ok, detail)
    results["nsys_repeat"] = {"runs": args.repeat, "table": table, "beyond_own_clock": beyond}
    print(f"    {'kernel':<18} {'share':>6} {'ratio of medians':>17} {'tuiprof spread':>15} "
          f"{'nsys spread':>12}")
    for r in table:
        print(f"    {printable(r['kernel'], 18):<18} {(r['share'] or 0):>6.1%} {r['median_ratio']:>17.4f} "
              f"{r['tuiprof_spread']:>15.2%} {r['nsys_spread']:>12.2%}")
    big = [r for r in table if (r["share"] or 0) >= MIN_SHARE]
    worst = max(big, key=lambda r: abs(r["median_ratio"] - 1), default=None)
    check(results, f"nsys x{args.repeat}: medians of repeated runs within 1 % "
                   f"(kernels >= 0.5 % of GPU time)",
          worst is not None and abs(worst["median_ratio"] - 1) <= MEAN_TOL,
          "no kernel compared" if worst is None else
          f"worst {worst['kernel']} {worst['median_ratio']:.4f} (tuiprof's own runs spread "
          f"{worst['tuiprof_spread']:.2%}, nsys's {worst['nsys_spread']:.2%})")


def overhead(results, args, binary, out):
    alone, under = [], []
    for r in range(args.rounds):
        for which in ("alone", "tuiprof") if r % 2 == 0 else ("tuiprof", "alone"):
            if which == "alone":
                p = sh([binary, str(args.overhead_steps), *EXTRA], timeout=120)
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


CPU_TESTS = ("tests/native", "tests/analysis/test_period.py", "tests/program/test_stream_steps.py")


def cpu_tests(results: dict) -> None:
    """The CPU tests of the native path on this machine (its compiler, CUPTI headers,
    cupti-python, real libcupti and libcuda): the result in the JSON, pytest's whole output
    printed (every failure in full, not a tail)."""
    t0 = time.time()
    try:
        p = sh([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
                *CPU_TESTS], timeout=180, cwd=REPO)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as exc:   # its output is bytes, whatever text= said
        got = exc.stdout or b""
        got = got.decode(errors="replace") if isinstance(got, bytes) else got
        text, rc = got + "\n(pytest ran past 180 s)", 124
    lines = [x for x in text.splitlines() if x.strip()]
    summary = lines[-1] if lines else "no output"
    failed = [x.split(" - ")[0] for x in lines if x.startswith(("FAILED ", "ERROR "))]
    results["cpu_tests"] = {"paths": list(CPU_TESTS), "returncode": rc, "summary": summary,
                            "failed": failed, "seconds": round(time.time() - t0, 1)}
    print(f"\n===== pytest {' '.join(CPU_TESTS)} (whole output)")
    print(text.rstrip())
    print("===== end of pytest output")
    check(results, "cpu tests of the native path pass here", rc == 0, summary)


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
    ap.add_argument("--only", default="steps,nvtx,nsys,overhead,live,cpu")
    ap.add_argument("--repeat", type=int, default=0,
                    help="also run tuiprof and nsys this many times each, alternating, and "
                         "compare the medians of their kernel means (with each one's spread)")
    ap.add_argument("--program-args", default="",
                    help="appended to every run of decode_like (alone, tuiprof, nsys), e.g. "
                         "'--pad-mb 512': its buffers placed after that much device memory")
    args = ap.parse_args()
    EXTRA[:] = shlex.split(args.program_args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(","))
    results: dict = {"checks": {}}
    global JSON_OUT
    JSON_OUT = out / "verify_native.json"
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
        return 1
    lib = sh([sys.executable, "-c", "from tuiprof.injection.build import build; b = build(); "
              "print(b.path, b.cuda_h, b.cupti.source, b.cupti.version, b.cupti.lib)"])
    results["library"] = lib.stdout.strip() or lib.stderr.strip()[-300:]
    print("injection library:", results["library"])
    alone = sh([binary, str(args.steps), *EXTRA], timeout=120)
    names, fig = program_line(alone.stdout)
    results["program_alone"] = fig
    print("program:", fig)

    if "steps" in only:
        snap = Path("/tmp/tuiprof_native_steps.json")    # its program log beside it stays
        proc, doc = tuiprof(snap, binary, str(args.steps),
                            options=("--ring-tokens", str(args.steps + 8)))
        if snap.exists():
            shutil.copy(snap, out / "steps.json")
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
                if args.repeat:
                    nsys_repeat(results, args, binary, out)
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
    if "cpu" in only:
        cpu_tests(results)
    save(results)
    failed = results["failed"]
    print("\nchecks:")
    for name, c in results["checks"].items():
        print(f"  [{'ok' if c['ok'] else 'FAIL'}] {name}")
    print(f"{len(results['checks']) - len(failed)} of {len(results['checks'])} checks passed"
          + (f"; failed: {failed}" if failed else ""))
    shutil.rmtree("/tmp/tuiprof_native_nsys", ignore_errors=True)
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
