"""bench/verify/verify_native.py's comparison with nsys, on the CSV that ``nsys stats`` printed on the
H100 for decode_like (data/h100_nsys_kern_sum.csv, nsys's own lines before the report
included): like with like, every kernel printed with both means."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CSV = Path(__file__).resolve().parent / "data" / "h100_nsys_kern_sum.csv"
MEAN = "nsys: kernel mean times within 1 % (kernels >= 0.5 % of GPU time)"
COUNTS = "nsys: kernel counts equal"


@pytest.fixture(scope="module")
def vn():
    spec = importlib.util.spec_from_file_location("verify_native",
                                                  REPO / "bench" / "verify" / "verify_native.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# the H100 run's nsys figures: name -> (instances, total ns); and the phases tuiprof puts
# each name's launches in (set-up in a window, the prompt's kernels in the prefill)
NSYS = {"gemv_small_grid": (4608, 327916264), "attn_decode": (1024, 9855118),
        "rmsnorm": (2560, 5453083), "argmax_token": (513, 4270091),
        "add_residual": (2048, 2177300), "embed": (512, 1478246), "silu_mul": (1024, 1310749),
        "rope": (1024, 1139968), "gemm_prefill": (3, 258279), "fill_weights": (8, 61634),
        "attn_prefill": (2, 2464)}
PHASES = {"fill_weights": "other", "gemm_prefill": "prefill", "attn_prefill": "prefill"}


def snapshot_kernels(scale=None, drop=()):
    """tuiprof's ``kernels`` section for the same run, means scaled per name by ``scale``;
    argmax_token split between the prefill (1) and the decode steps (512)."""
    out = []
    for name, (n, tot) in NSYS.items():
        if name in drop:
            continue
        tot = tot * (scale or {}).get(name, 1.003)
        parts = [(PHASES.get(name, "decode"), n)]
        if name == "argmax_token":
            parts = [("prefill", 1), ("decode", n - 1)]
        for phase, k in parts:
            out.append({"name": name, "demangled": name, "phase": phase, "mode": "eager",
                        "stats": {"count": k, "total": tot * k / n}})
    return out


def run(vn, kernels, csv=CSV):
    results = {"checks": {}}
    res = vn.kernel_table(csv, kernels)
    vn.kernel_checks(results, res)
    return res, results["checks"]


def test_the_h100_csv_is_read_and_like_is_compared_with_like(vn, capsys):
    res, checks = run(vn, snapshot_kernels())
    assert res["nsys_rows"] == 11 and res["unreadable_rows"] == 0
    # the kernels of at least 0.5 % of the GPU time; embed (0.4 %) and the rest are listed
    assert res["compared"] == ["gemv_small_grid", "attn_decode", "rmsnorm", "argmax_token",
                               "add_residual"]
    assert checks[MEAN]["ok"] and checks[COUNTS]["ok"], checks
    assert "worst |ratio-1| = 0.0030" in checks[MEAN]["detail"]
    assert "gemv_small_grid, attn_decode" in checks[MEAN]["detail"]
    printed = capsys.readouterr().out
    for name in NSYS:                       # every kernel, with both means
        assert name in printed
    line = next(x for x in printed.splitlines() if "attn_decode" in x)
    assert "9.653 us" in line and "9.624 us" in line and "1.0030" in line


def test_a_mean_off_by_2_percent_fails_and_says_which(vn):
    _, checks = run(vn, snapshot_kernels({"attn_decode": 1.02}))
    assert not checks[MEAN]["ok"]
    assert "worst |ratio-1| = 0.0200 (attn_decode)" in checks[MEAN]["detail"]


def test_a_small_kernel_is_listed_but_not_held_to_1_percent(vn):
    _, checks = run(vn, snapshot_kernels({"rope": 1.05}))          # 0.3 % of the GPU time
    assert checks[MEAN]["ok"] and checks[COUNTS]["ok"]


def test_kernels_one_side_lacks_are_named(vn):
    _, checks = run(vn, snapshot_kernels(drop=("fill_weights",)))
    assert checks[MEAN]["ok"]                # fill_weights is 0.0 % of the GPU time
    assert not checks[COUNTS]["ok"]
    assert "fill_weights tuiprof 0 nsys 8" in checks[COUNTS]["detail"]
    _, checks = run(vn, snapshot_kernels(drop=("attn_decode",)))
    assert not checks[MEAN]["ok"] and "on one side only: ['attn_decode']" in checks[MEAN]["detail"]


def test_a_csv_without_rows_fails_both_checks(vn, tmp_path):
    empty = tmp_path / "k.csv"
    empty.write_text("Generating SQLite file /tmp/x.sqlite from /tmp/x.nsys-rep\n")
    res, checks = run(vn, snapshot_kernels(), empty)
    assert res["nsys_rows"] == 0
    assert not checks[MEAN]["ok"] and "held no kernel rows" in checks[MEAN]["detail"]
    assert not checks[COUNTS]["ok"]


def test_parameter_lists_are_not_part_of_the_name(vn):
    assert vn.base_name("void k<(int)8>(const float *, int)") == "k<8>"
    assert vn.base_name("gemv_small_grid") == "gemv_small_grid"


def test_both_demanglers_template_names_read_alike(vn):
    """nsys (cu++filt) and GNU print llama.cpp's template kernels differently: the same name
    on both sides once canonical (real names from an H200 run of llama-bench)."""
    pairs = [
        ("void mul_mat_vec_q<(ggml_type)8, (int)1, (bool)1, (bool)0, (bool)0>(const void *, int)",
         "void mul_mat_vec_q<(ggml_type)8, 1, true, false, false>(void const*, int)"),
        ("void k_bin_bcast<&op_add, float, float, float, const float *>(const T2 *, T3 *)",
         "void k_bin_bcast<&_INTERNAL_b4c05585_11_binbcast_cu_6840010b::op_add, float, float, "
         "float, float const*>(float const*, float*)"),
        ("void mul_mat_q<(ggml_type)8, (int)128, (bool)0, (ggml_prec)30>(const char *)",
         "void mul_mat_q<(ggml_type)8, 128, false, (ggml_prec)30>(char const*)"),
    ]
    for theirs, ours in pairs:
        assert vn.base_name(theirs) == vn.base_name(ours), (theirs, ours)
    assert vn.base_name(pairs[0][0]) == "mul_mat_vec_q<8, 1, true, false, false>"


def _trace_csv(path, ops):
    """A ``cuda_gpu_trace`` CSV as nsys prints it (its columns; tuiprof's export writes the
    same), with nsys's own line before the report."""
    from tuiprof.export.nsys_reports import TRACE_COLUMNS

    lines = ["Generating SQLite file x.sqlite from x.nsys-rep", ",".join(TRACE_COLUMNS)]
    for start, end, name in ops:
        cells = [""] * len(TRACE_COLUMNS)
        cells[0], cells[1], cells[-1] = str(start), str(end - start), name
        lines.append(",".join(cells))
    path.write_text("\n".join(lines) + "\n")


def test_the_idle_before_each_kernel_is_told_apart_on_both_sides(vn, tmp_path, capsys):
    """Each step: embed after a host gap, gemv, argmax, a copy to the host. On nsys's side the
    gaps are longer and the kernels after them slower; the kernels after no idle time are the
    same on both sides: the table says so per kernel."""
    def steps(gap, slow):
        ops, t = [], 0
        for _ in range(5):
            t += gap
            ops.append((t, t + 2_000 + slow, "embed"))
            t += 2_000 + slow
            ops.append((t, t + 70_000, "gemv_small_grid"))
            t += 70_000
            ops.append((t, t + 7_000, "argmax_token"))
            t += 7_000
            ops.append((t, t + 1_500, "[CUDA memcpy Device-to-Host]"))
            t += 1_500
        return ops

    records = []                                             # tuiprof/store/records.py
    for a, b, name in steps(gap=10_000, slow=0):
        records.append(["C", 2, 4, a, b] if name.startswith("[") else ["K", name, a, b] + [0] * 11)
    doc = {"raw": [{"seq": 0, "records": records}]}
    assert [name for _, _, name in vn.ops_from_raw(doc)][:4] == [
        "embed", "gemv_small_grid", "argmax_token", ""]
    csv = tmp_path / "trace.csv"
    _trace_csv(csv, steps(gap=40_000, slow=150))
    theirs = vn.ops_from_trace_csv(csv)
    assert len(theirs) == 20 and theirs[3][2] == ""          # the copy is not a kernel
    rows = {r["kernel"]: r for r in vn.idle_table(vn.ops_from_raw(doc), theirs)}
    assert set(rows) == {"embed", "gemv_small_grid", "argmax_token"}
    embed = rows["embed"]
    assert embed["tuiprof"]["idle_before_median_ns"] == 10_000
    assert embed["nsys"]["idle_before_median_ns"] == 40_000
    assert embed["tuiprof"]["median_after_idle_ns"] == 2_000
    assert embed["nsys"]["median_after_idle_ns"] == 2_150
    gemv = rows["gemv_small_grid"]
    assert gemv["tuiprof"]["median_after_none_ns"] == gemv["nsys"]["median_after_none_ns"]
    assert gemv["nsys"]["median_after_idle_ns"] is None      # never after idle time
    vn.print_idle_table(list(rows.values()))
    assert "embed" in capsys.readouterr().out


def _beyond(rows):
    """nsys_repeat's own-clock rows: name -> (share, tuiprof's and nsys's median ns beyond the
    kernel's own clock, nsys's mean)."""
    return {k: {"share": sh, "tuiprof": {"median_beyond_ns": a}, "nsys": {"median_beyond_ns": b},
                "diff_of_kernel": abs(a - b) / mean} for k, (sh, a, b, mean) in rows.items()}


# the H100's fourth verification (every decode kernel timing itself, 4 runs of each tool)
H100_OWN = {"gemv_small_grid": (0.927, 32348.0, 32356.3, 73848.0),
            "attn_decode": (0.027, 2147.2, 2206.8, 9542.0),
            "rmsnorm": (0.016, 890.0, 868.8, 2246.0),
            "argmax_token": (0.013, 865.0, 903.1, 9065.0),
            "add_residual": (0.007, 794.9, 809.0, 1226.0),
            "embed": (0.004, 900.0, 903.0, 2531.0)}


def test_the_own_clock_check_takes_a_difference_below_the_clocks_step(vn):
    """add_residual's 14 ns are 1.15 % of a 1.2 µs kernel but under %globaltimer's 32 ns
    step: not told apart. embed is under 0.5 % of the GPU time: not compared."""
    ok, detail = vn.own_clock_check(_beyond(H100_OWN))
    assert ok, detail
    assert detail.startswith("worst add_residual 1.15% (14 ns) over 5 kernels")


def test_the_own_clock_check_fails_a_tool_that_reads_a_kernel_longer(vn):
    rows = dict(H100_OWN, argmax_token=(0.013, 865.0, 1003.0, 9065.0))   # 138 ns, 1.5 %
    ok, detail = vn.own_clock_check(_beyond(rows))
    assert not ok and "beyond both: ['argmax_token']" in detail
    assert vn.own_clock_check({}) == (False, "no kernel compared")
