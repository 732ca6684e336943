"""The sweep: cells, tables, profiles, OOM handling and the CLI, on tiny CPU models."""

from __future__ import annotations

import argparse
import csv
import json

import pytest
import torch

import workload_helpers  # noqa: F401 - puts the repository on sys.path
from tuiprof.cli.sweep import add_arguments, main, run
from tuiprof.sweep import (
    Cell,
    classify,
    env_fault_hook,
    is_oom,
    run_sweep,
)

FAST = {"warmup": 1, "iters": 2, "device": "cpu"}


@pytest.fixture(scope="module")
def gpt2_sweep():
    events = []
    result = run_sweep(["gpt2-tiny"], [8, 16], passes=("inference", "train-forward", "train-backward", "decode"),
                       attention=("plain", "sdpa"), progress=events.append, **FAST)
    return result, events


def test_sweep_cells_and_timings(gpt2_sweep):
    result, _ = gpt2_sweep
    assert len(result.cells) == 2 * 2 * 4
    assert {r.status for r in result.cells} == {"ok"}
    for r in result.cells:
        assert len(r.times_ms) == 2 and r.median_ms > 0 and r.tokens_per_s > 0
        assert r.profile is not None and r.profile.source == "cpu-ops"
        assert 0 < r.profile.gemm_fraction <= 1 and r.profile.total_ms > 0
        assert r.profile.dominant and r.profile.top_non_gemm and r.profile.top
    assert result.find("gpt2-tiny", 16, "decode", attention="plain").cell.batch == 1


def test_sweep_kernel_summary_is_real(gpt2_sweep):
    result, _ = gpt2_sweep
    prof = result.find("gpt2-tiny", 16, "train-backward", attention="sdpa").profile
    names = {op.name for op in prof.top}
    assert "aten::mm" in names
    gemm = sum(op.ms for op in prof.top if op.kind == "gemm")
    assert gemm <= prof.gemm_ms + 1e-6
    assert prof.top_non_gemm is not None and classify(prof.top_non_gemm) != "gemm"


def test_sweep_attention_split_only_on_the_plain_path(gpt2_sweep):
    result, _ = gpt2_sweep
    plain = result.find("gpt2-tiny", 16, "inference", attention="plain").profile
    sdpa = result.find("gpt2-tiny", 16, "inference", attention="sdpa").profile
    assert plain.attn_softmax_ms > 0 and plain.attn_matmul_ms > 0
    assert sdpa.attn_softmax_ms is None and sdpa.attn_matmul_ms is None
    rows = result.tables()["attention"].rows
    assert len(rows) == 8 and all(r[0] == "gpt2-tiny" for r in rows)


def test_sweep_tables_and_files(gpt2_sweep, tmp_path):
    result, _ = gpt2_sweep
    tables = result.tables()
    assert tables["time"].header[-2:] == ["L=8", "L=16"]
    assert len(tables["time"].rows) == 8  # 4 passes x 2 attention paths
    assert len(tables["kernels"].rows) == 16
    paths = result.write(tmp_path)
    rows = list(csv.DictReader(open(paths["csv"])))
    assert len(rows) == 16 and {r["status"] for r in rows} == {"ok"}
    assert float(rows[0]["gemm_fraction"]) > 0
    data = json.loads(paths["json"].read_text())
    assert data["cells"][0]["profile"]["top"][0]["ms"] > 0
    md = paths["md"].read_text()
    assert "### Time per iteration" in md and "### Plain attention: softmax vs matmul" in md
    assert (tmp_path / "kernels.csv").is_file() and (tmp_path / "attention.csv").is_file()


def test_sweep_progress(gpt2_sweep):
    _, events = gpt2_sweep
    done = [e for e in events if e.phase == "done"]
    assert [e.index for e in done] == list(range(1, 17)) and {e.total for e in events} == {16}
    assert done[-1].eta_s == 0 and done[-1].elapsed_s > 0
    assert done[0].line().startswith("[ 1/16] gpt2-tiny L=8 inference eager plain  ok ")


def test_injected_oom_is_recorded_and_the_sweep_continues():
    def hook(cell: Cell) -> None:
        if cell.model == "nanochat-tiny" and cell.seq_len == 8:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    result = run_sweep(["nanochat-tiny", "deepseek-tiny"], [8, 16], fault_hook=hook, profile=False, **FAST)
    status = {(r.cell.model, r.cell.seq_len): r.status for r in result.cells}
    assert status == {("nanochat-tiny", 8): "oom", ("nanochat-tiny", 16): "ok",
                      ("deepseek-tiny", 8): "ok", ("deepseek-tiny", 16): "ok"}
    oom = result.find("nanochat-tiny", 8)
    assert oom.median_ms is None and "OutOfMemoryError" in oom.error
    assert result.tables()["time"].rows[0][-2:] == ["OOM", f"{result.find('nanochat-tiny', 16).median_ms:.2f}"]


def test_env_fault_injection_and_errors(monkeypatch):
    monkeypatch.setenv("TUIPROF_SWEEP_FAULT", "oom:llama-layer-tiny:16:train-backward,error:*:8:inference")
    result = run_sweep(["llama-layer-tiny"], [8, 16], passes=("inference", "train-backward"), profile=False, **FAST)
    status = {(r.cell.seq_len, r.cell.pass_name): r.status for r in result.cells}
    assert status == {(8, "inference"): "error", (8, "train-backward"): "ok",
                      (16, "inference"): "ok", (16, "train-backward"): "oom"}


def test_is_oom():
    assert is_oom(torch.cuda.OutOfMemoryError("x"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))
    assert env_fault_hook("") is None


def test_too_long_cells_are_skipped_and_unknown_models_are_errors():
    result = run_sweep(["gpt2-tiny", "no-such-model"], [64], passes=("inference", "decode"), profile=False, **FAST)
    st = [(r.cell.model, r.cell.pass_name, r.status) for r in result.cells]
    assert st == [("gpt2-tiny", "inference", "ok"), ("gpt2-tiny", "decode", "skipped"),
                  ("no-such-model", "inference", "error"), ("no-such-model", "decode", "error")]
    assert "unknown model" in result.cells[-1].error


def test_compiled_mode_runs():
    result = run_sweep(["nanochat-tiny"], [8], passes=("inference", "decode"), modes=("eager", "compiled"),
                       compile_backend="eager", profile=False, **FAST)
    assert [(r.cell.mode, r.cell.pass_name, r.status) for r in result.cells] == [
        ("eager", "inference", "ok"), ("eager", "decode", "ok"), ("compiled", "inference", "ok"),
        ("compiled", "decode", "ok")]


def test_memory_limit_is_noted_on_cpu():
    result = run_sweep(["gpt2-tiny"], [8], memory_limit_gib=1.0, profile=False, **FAST)
    assert result.notes == ["memory limit 1.0 GiB ignored on cpu"]


@pytest.mark.parametrize("name, kind", [
    ("aten::mm", "gemm"), ("aten::addmm", "gemm"), ("aten::bmm", "gemm"), ("aten::linear", "gemm"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)", "gemm"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, float, 128, 16, 4, 4, false, false>", "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4> >", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ("aten::_softmax", "other"), ("void at::native::vectorized_elementwise_kernel<4, at::native::mul>", "other"),
    ("triton_per_fused__softmax_0", "other"), ("aten::mean", "other"), ("Memcpy HtoD (Pageable -> Device)", "other"),
])
def test_classify(name, kind):
    assert classify(name) == kind


def test_cli(tmp_path, capsys, monkeypatch):
    parser = argparse.ArgumentParser()
    add_arguments("sweep", parser)
    args = parser.parse_args(["--models", "gpt2-tiny", "--seq-lens", "8,16", "--passes", "inference,decode",
                              "--mode", "eager", "--device", "cpu", "--warmup", "0", "--iters", "1",
                              "--out", str(tmp_path / "a")])
    assert args.seq_lens == [8, 16] and args.passes == ["inference", "decode"] and args.modes == ["eager"]
    assert run("sweep", args) == 0
    out = capsys.readouterr()
    assert "| gpt2-tiny | inference | eager | plain | 1 |" in out.out
    assert "[4/4] gpt2-tiny L=16 decode eager" in out.err
    assert (tmp_path / "a" / "sweep.md").is_file()
    monkeypatch.setenv("TUIPROF_SWEEP_FAULT", "oom:*:16")
    assert main(["--models", "gpt2-tiny", "--seq-lens", "8,16", "--device", "cpu", "--warmup", "0",
                 "--iters", "1", "--no-profile", "--out", str(tmp_path / "b")]) == 1
    assert main(["--models", "gpt2-tiny", "--seq-lens", "8", "--dtype", "nonsense", "--device", "cpu",
                 "--out", str(tmp_path / "c")]) == 1
    with pytest.raises(SystemExit):
        main(["--models", "gpt2-tiny", "--seq-lens", "8", "--passes", "sideways"])


def test_cancel_skips_the_remaining_cells():
    import threading

    cancel = threading.Event()

    def progress(p):
        if p.phase == "done":
            cancel.set()

    result = run_sweep(["gpt2-tiny", "nanochat-tiny"], [8, 16], progress=progress, cancel=cancel, profile=False, **FAST)
    assert [r.status for r in result.cells] == ["ok", "skipped", "skipped", "skipped"]


def test_sweep_screen_runs_headless():
    import asyncio

    pytest.importorskip("textual")
    from textual.app import App

    from tuiprof.ui.screens.sweep import SweepScreen

    done = []

    class Host(App):
        def on_mount(self) -> None:
            self.push_screen(SweepScreen({"models": ["gpt2-tiny"], "seq_lens": [8, 16], "profile": False, **FAST},
                                         on_done=done.append))

    async def drive() -> int:
        app = Host()
        async with app.run_test() as pilot:
            for _ in range(300):
                await pilot.pause(0.05)
                if done:
                    break
            from textual.widgets import DataTable

            return app.screen.query_one(DataTable).row_count

    rows = asyncio.run(drive())
    assert rows == 2 and [r.status for r in done[0].cells] == ["ok", "ok"]


def test_core_imports_no_ui():
    import subprocess
    import sys

    code = ("import sys, tuiprof.sweep, tuiprof.engine.families.deepseek, tuiprof.engine.families.nanochat, "
            "tuiprof.engine.families.cs336; print(sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=workload_helpers.ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_add_arguments_does_not_import_torch():
    import subprocess
    import sys

    code = ("import argparse, sys; from tuiprof.cli import build_parser; build_parser(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=workload_helpers.ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_batch_sweep_cells_knee_oom_and_files(tmp_path):
    """--batches on the live engine: one decode cell per batch; a batch whose KV cache does not
    fit (a real allocation failure under an OS memory limit) is an OOM cell, the sweep goes on."""
    import re
    import resource

    from tuiprof.sweep import run_batch_sweep

    with open("/proc/self/status") as fh:
        vm_data = int(re.search(r"VmData:\s+(\d+) kB", fh.read())[1]) * 1024
    huge = 1 << 15   # qwen3-tiny keeps 10 KiB of K/V per sequence here: 320 MiB
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (vm_data + 256 * 2**20, hard))
    try:
        sweep = run_batch_sweep(["qwen3-tiny"], [1, 4, huge], device="cpu", prompt_len=8,
                                warmup=1, iters=3)
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    one, four, big = sweep.cells
    assert [c.status for c in sweep.cells] == ["ok", "ok", "oom"], big.error
    assert big.error.startswith("out of memory") and "\n" not in big.error
    for r, b in ((one, 1), (four, 4)):
        s = r.summary
        assert len(r.times_ms) == 3 and s.batch == b and s.steps == 3
        assert s.tok_s == pytest.approx(b * 1000 / s.ms_step)     # every sequence counted
        assert s.mbu > 0 and s.mfu > 0
        assert s.klass == "unknown" and s.why.startswith("a CPU run")   # no GPU classes here
        assert abs(sum(r.categories.values()) - 1) < 1e-6        # shares of the profiled step
        assert s.context == 8 + 1 + 2                             # prompt + median step + 1
    assert four.summary.bytes_step > one.summary.bytes_step       # 4 sequences' KV cache
    (knee,) = sweep.knees()
    assert knee["model"] == "qwen3-tiny" and knee["predicted"] is None   # 64-wide GEMMs
    paths = sweep.write(tmp_path)
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [r["status"] for r in rows] == ["ok", "ok", "oom"] and rows[1]["mbu"]
    assert json.loads(paths["json"].read_text())["knees"][0]["model"] == "qwen3-tiny"
    md = paths["md"].read_text()
    assert "| qwen3-tiny | eager | 4 |" in md and "tokens/s" in md and "\x1b[" not in md


def test_batch_sweep_cli(tmp_path, capsys):
    assert main(["--models", "qwen3-tiny", "--batches", "1,2", "--device", "cpu", "--warmup", "1",
                 "--iters", "2", "--no-profile", "--prompt-len", "4", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "| qwen3-tiny | eager | 2 |" in out.out and "knee predicted" in out.out
    assert "qwen3-tiny eager batch 2:" in out.err and (tmp_path / "batch.md").is_file()
    assert main(["--models", "qwen3-tiny", "--batches", "1", "--seq-lens", "8"]) == 2
