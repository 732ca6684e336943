"""``tuiprof run --headless -- ./binary`` as a user runs it: real processes, the injection
library built as in use, the stand-in libcupti (``TUIPROF_CUPTI_LIB``) where CUPTI would need
a GPU."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import Script, compile_native, decode_like

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    return compile_native(tmp_path_factory.mktemp("native"))


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.update(extra)
    return env


def tuiprof(tmp_path: Path, *program: str, options=(), env=None, timeout=120):
    out = tmp_path / "snap.json"
    # every step traced (the native default samples by time, and the stand-in emits its
    # records before any burst: tests/native/test_graphs_and_bursts.py covers the sampling)
    cmd = [sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml", "--json", str(out),
           "--sample-every", "1", *options, "--", *program]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env=env or _env())
    doc = json.loads(out.read_text()) if out.exists() else None
    return proc, doc


def test_a_binary_without_cuda_keeps_its_output_and_status_and_says_so(native, tmp_path):
    src = tmp_path / "hello.c"
    src.write_text('#include <stdio.h>\nint main(int c, char **v) {\n'
                   '  printf("hello %s\\n", v[1]); fprintf(stderr, "to stderr\\n");\n'
                   '  return 3;\n}\n')
    subprocess.run([native.build.compiler, "-o", str(tmp_path / "hello"), str(src)], check=True)
    proc, doc = tuiprof(tmp_path, "./hello", "world")
    assert proc.returncode == 3
    assert "hello world\n" in proc.stdout and "to stderr\n" in proc.stderr  # as it printed
    line = "tuiprof: the program made no CUDA calls: its GPU path never ran"
    assert proc.stderr.count(line) == 1 and "Traceback" not in proc.stderr
    prog = doc["meta"]["program"]
    assert (prog["exit_status"], prog["ended"], prog["name"]) == (3, "exited", "hello")
    assert prog["gpu"] == line[len("tuiprof: "):]
    assert sorted(doc["output"]) == ["hello world", "to stderr"]
    assert (tmp_path / "snap.log").read_text().count("hello world") == 1


def test_echo_runs_from_path(tmp_path):
    proc, doc = tuiprof(tmp_path, "echo", "from", "PATH")
    assert proc.returncode == 0 and doc["output"] == ["from PATH"]
    assert doc["meta"]["program"]["gpu"] == "the program made no CUDA calls: its GPU path never ran"


def test_a_decode_loop_is_found_in_its_kernels(native, tmp_path):
    s = Script()
    decode_like(s, 64)
    script = s.write(tmp_path / "s.bin")
    proc, doc = tuiprof(tmp_path, str(native.driver), "run", str(script), "2000", "0",
                        env=_env(TUIPROF_CUPTI_LIB=str(native.fake)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    auto = doc["meta"]["auto_steps"]
    assert (auto["source"], auto["decode_steps"], auto["prefill_steps"], auto["identical_steps"],
            auto["kernels_per_step"], auto["confidence_label"]) == ("auto", 64, 1, 64, 48, "high")
    assert doc["meta"]["step_source"] == "auto"
    toks = [t for t in doc["tokens"] if t["done"]]
    assert [t["phase"] for t in toks] == ["prefill"] + ["decode"] * 64
    assert {t["kernels"] for t in toks} == {48} and {t["api_calls"] for t in toks} == {49}
    # the kernels of one step, by name, exactly
    names = [k[1] for k in _raw_kernels(doc, toks[-1]["seq"])]
    _, _, step = decode_like(Script(), 0)
    assert names == step
    assert "steps from auto: 65 (64 decode, 1 prefill)" in proc.stdout
    assert "a decode loop of 48 kernels found in the kernel stream" in proc.stdout
    small = [f for f in doc["findings"] if f["id"] == "grid-too-small"]
    assert small, [f["id"] for f in doc["findings"]]           # 4-block GEMVs: grid too small
    # CUPTI runs in the binary the whole time: no sampling is claimed
    assert "tracing: every step traced" in proc.stdout and doc["meta"]["sample_every"] == 1
    profile = [f for f in doc["findings"] if f["id"] == "decode-profile"]
    assert profile and "dominates" in profile[0]["title"], [f["id"] for f in doc["findings"]]


def _raw_kernels(doc, seq):
    for entry in doc["raw"]:
        if entry["seq"] == seq:
            return [r for r in entry["records"] if r[0] == "K"]
    raise AssertionError(f"no raw records for step {seq}")


def test_nvtx_ranges_are_steps_with_step_range(native, tmp_path):
    s = Script()
    decode_like(s, 12, marker_name="decode_step")
    script = s.write(tmp_path / "s.bin")
    proc, doc = tuiprof(tmp_path, str(native.driver), "run", str(script), "2000", "0",
                        options=("--step-range", "decode_step", "--step-range", "prefill"),
                        env=_env(TUIPROF_CUPTI_LIB=str(native.fake)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert doc["meta"]["step_source"] == "nvtx"
    toks = [t for t in doc["tokens"] if t["done"]]
    assert [t["phase"] for t in toks] == ["prefill"] + ["decode"] * 12
    assert {t["kernels"] for t in toks} == {48}


def _start(tmp_path, native, mode):
    s = Script()
    decode_like(s, 10)
    script = s.write(tmp_path / "s.bin")
    out = tmp_path / "snap.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml", "--json", str(out),
         "--sample-every", "1", "--", str(native.driver), mode, str(script), "2000"], cwd=tmp_path,
        env=_env(TUIPROF_CUPTI_LIB=str(native.fake)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.stdout.readline() == "driver: waiting\n":
            return proc, out
    proc.kill()
    raise AssertionError("the program never said it was waiting")


def test_ctrl_c_goes_to_the_binary_first(native, tmp_path):
    proc, out = _start(tmp_path, native, "wait")
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 5                        # the binary's own status after SIGINT
    assert "driver: SIGINT" in rest and "Traceback" not in err
    doc = json.loads(out.read_text())
    assert doc["meta"]["program"]["exit_status"] == 5
    assert doc["meta"]["auto_steps"]["decode_steps"] == 10     # measured before it ended


def test_a_second_ctrl_c_stops_a_binary_that_ignores_the_first(native, tmp_path):
    proc, out = _start(tmp_path, native, "deaf")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    # the session was stopped by the second Ctrl-C: 128 + SIGINT, whatever ended the binary
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "the program was stopped by tuiprof (SIGINT, exit status 130)" in err
    doc = json.loads(out.read_text())
    assert doc["meta"]["program"]["ended"] == "stopped"
    assert doc["meta"]["auto_steps"]["decode_steps"] == 10


@pytest.mark.parametrize("what,says", [
    ("missing", "cannot run './missing': no such file"),
    ("plain.txt", "cannot run './plain.txt': is not executable (chmod +x it)"),
    ("adir", "cannot run './adir': is a directory"),
    ("no-such-command-xyz", "cannot run 'no-such-command-xyz': no such program"),
])
def test_what_cannot_run_is_one_line(tmp_path, what, says):
    (tmp_path / "plain.txt").write_text("x")
    (tmp_path / "adir").mkdir()
    proc, doc = tuiprof(tmp_path, what if what.startswith("no-such") else f"./{what}")
    assert proc.returncode == 2 and doc is None
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr


def test_python_only_step_options_are_refused_with_a_binary(tmp_path):
    proc, doc = tuiprof(tmp_path, "/bin/true", options=("--step-function", "m:f"))
    assert proc.returncode == 2 and doc is None
    assert proc.stderr.strip() == ("tuiprof: --step-function applies to Python programs; a "
                                   "native program's steps come from --step-range or its "
                                   "kernel stream (docs/native.md)")


def test_no_compiler_is_one_line(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    env = _env(PATH=str(bare), XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("CC", None)
    proc, doc = tuiprof(tmp_path, "/bin/true", env=env)
    assert proc.returncode == 2 and doc is None
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuiprof: no C compiler found"), proc.stderr


def test_no_cupti_headers_is_one_line(tmp_path):
    proc, doc = tuiprof(tmp_path, "/bin/true",
                        env=_env(TUIPROF_CUPTI_INCLUDE=str(tmp_path / "nothing"),
                                 XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert proc.returncode == 2 and doc is None
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUPTI headers (cupti_activity.h) found" in lines[0]


def test_no_cupti_runs_the_binary_plainly(tmp_path):
    proc, doc = tuiprof(tmp_path, "/bin/sh", "-c", "echo $CUDA_INJECTION64_PATH-none",
                        options=("--no-cupti",))
    assert proc.returncode == 0 and doc["output"] == ["-none"]
    assert "gpu" not in doc["meta"]["program"]


def test_a_binary_with_no_decode_loop_gets_windows_of_its_records(native, tmp_path):
    """A server whose steps change with every batch shows no loop: its kernels still fall into
    windows of --window-ms on the records' clock, as the stream's source promises."""
    import random

    rnd = random.Random(5)
    s = Script()
    t = 1_000_000_000
    for i in range(600):                        # 600 kernels over ~600 ms, no repeating order
        s.kernel(f"k{rnd.randrange(200)}", t, t + 500_000, i + 1)
        t += 1_000_000
    proc, doc = tuiprof(tmp_path, str(native.driver), "run", str(s.write(tmp_path / "s.bin")),
                        "2000", "0", env=_env(TUIPROF_CUPTI_LIB=str(native.fake)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert doc["meta"]["step_source"] == "windows"
    toks = [t for t in doc["tokens"] if t["done"]]
    assert 5 <= len(toks) <= 7 and sum(t["kernels"] for t in toks) == 600
