"""Runs lost at the edges, and arguments accepted silently: each case failed before the fix.

* an export into a directory that holds another session's export replaces the whole set;
* output paths are checked before a run starts (missing directory, read-only file system, an
  existing directory) and a path that fails at the end falls back to a named location;
* negative or zero counts are refused, ``--max-new-tokens`` past the cache says it is capped,
  ``--tp`` beyond the model's KV heads is refused in under a second, leaving no file;
* a program that ends its process itself (``os._exit``), is killed or crashes loses nothing:
  the snapshot, the summary and its output in the log;
* the second Ctrl-C stops a program that ignores SIGINT; exit codes are 128 + the signal.
"""
from __future__ import annotations

import contextlib
import copy
import json
import time
from pathlib import Path

import pytest

from tuiprof.cli import main
from tuiprof.export.snapshot import dumps, read_snapshot, snapshot_dict


@pytest.fixture(scope="module")
def small_doc(eager_path) -> dict:
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=4)
    replay_into(load_recording(eager_path), store)
    return snapshot_dict(store.view(), findings=[])


# ------------------------------------------------------------------ exports are complete sets
def test_an_export_replaces_the_other_sessions_set_and_nothing_else(small_doc, tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(dumps(small_doc))
    no_mem = copy.deepcopy(small_doc)      # a session without kernel or memory records
    for key in ("kernels", "memcpy", "memset"):
        no_mem[key] = []
    b.write_bytes(dumps(no_mem))
    out = tmp_path / "nsys"
    out.mkdir()
    mine = {"notes.csv": "mine\n", "all_cuda_gpu_kern_sum.csv": "from nsys stats -o all\n",
            "tuiprof_notes.txt": "mine too\n"}
    for name, text in mine.items():
        (out / name).write_text(text)
    assert main(["export", str(a), "--nsys", str(out)]) == 0
    first = {p.name for p in out.iterdir()} - set(mine)
    assert "tuiprof_cuda_gpu_kern_sum.csv" in first and "tuiprof_cuda_gpu_mem_time_sum.csv" in first
    capsys.readouterr()
    assert main(["export", str(b), "--nsys", str(out)]) == 0
    written = {Path(line).name for line in capsys.readouterr().out.split()}
    second = {p.name for p in out.iterdir()} - set(mine)
    # only b's files: a's kern_sum and mem_* CSVs are gone, not left beside b's
    assert second == written | {"tuiprof_export.json"}
    assert not {"tuiprof_cuda_gpu_kern_sum.csv", "tuiprof_cuda_gpu_mem_time_sum.csv",
                "tuiprof_cuda_gpu_mem_size_sum.csv"} & second
    assert {n: (out / n).read_text() for n in mine} == mine       # not tuiprof's: untouched
    manifest = json.loads((out / "tuiprof_export.json").read_text())
    assert manifest["files"] == sorted(written)


def test_an_export_over_an_older_export_without_a_manifest(small_doc, tmp_path, capsys):
    a = tmp_path / "a.json"
    no_mem = copy.deepcopy(small_doc)
    for key in ("kernels", "memcpy", "memset"):
        no_mem[key] = []
    a.write_bytes(dumps(no_mem))
    out = tmp_path / "nsys"
    out.mkdir()
    (out / "tuiprof_cuda_gpu_kern_sum.csv").write_text("an older tuiprof's\n")
    (out / "tuiprof_cuda_gpu_mem_time_sum.csv").write_text("an older tuiprof's\n")
    assert main(["export", str(a), "--nsys", str(out)]) == 0
    assert not (out / "tuiprof_cuda_gpu_kern_sum.csv").exists()
    assert not (out / "tuiprof_cuda_gpu_mem_time_sum.csv").exists()
    capsys.readouterr()


# ------------------------------------------------------------------ helpers
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


def _run(args: list[str], cwd: Path, timeout: float = 120, **env: str):
    import subprocess
    import sys

    from .conftest import cli_env

    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tuiprof", *args], cwd=cwd,
                          env=dict(cli_env(), **env), capture_output=True, text=True,
                          timeout=timeout)
    return proc, time.monotonic() - t0


def _program(tmp_path: Path, *program: str, out: str = "snap.json"):
    return _run(["run", "--headless", "--no-nvml", "--json", str(tmp_path / out), "--",
                 "python", *program], tmp_path)


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("tuiprof: ")]


# ------------------------------------------------------------------ nothing measured is lost
@pytest.mark.parametrize("how,rc", [("os._exit", 7), ("SIGKILL", 137), ("segfault", 139)])
def test_a_program_that_ends_its_process_loses_nothing(tmp_path, how, rc):
    proc, _ = _program(tmp_path, str(PROGRAMS / "ends_itself.py"), how)
    assert proc.returncode == rc, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    doc = json.loads((tmp_path / "snap.json").read_text())
    decode = [t for t in doc["tokens"] if t["phase"] == "decode" and t["done"]]
    assert len(decode) == 3                                       # every step measured
    prog = doc["meta"]["program"]
    assert prog["exit_status"] == rc and prog["running"] is False
    log = (tmp_path / "snap.log").read_text()
    assert log.count("step ") == 3 and f"last words before {how}" in log   # every byte
    assert f"last words before {how}" in doc["output"]
    assert "steps from api: 3 (3 decode)" in proc.stdout          # the summary
    said = _lines(proc.stderr)[-1]
    assert ("os._exit(7)" in said) if how == "os._exit" else \
        (f"killed by {'SIGKILL' if how == 'SIGKILL' else 'SIGSEGV'}" in said), said


# ------------------------------------------------------------------ output paths, before the run
@pytest.mark.parametrize("cmd", ["engine", "program", "replay", "export"])
@pytest.mark.parametrize("where", ["missing-dir", "a-directory"])
def test_an_unwritable_output_is_refused_before_the_run(tmp_path, eager_path, small_doc, cmd,
                                                        where):
    target = tmp_path / "no" / "such" / "x.json" if where == "missing-dir" else tmp_path
    snap = tmp_path / "s.json"
    snap.write_bytes(dumps(small_doc))
    args = {"engine": ["run", "--model", "qwen3-tiny", "--headless", "--max-new-tokens", "4",
                       "--json", str(target)],
            "program": ["run", "--headless", "--json", str(target), "--", "python",
                        str(PROGRAMS / "exits.py")],
            "replay": ["replay", str(eager_path), "--headless", "--json", str(target)],
            "export": ["export", str(snap), "--trace", str(target)]}[cmd]
    proc, _seconds = _run(args, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    if where == "missing-dir":
        assert f"directory {tmp_path / 'no'} does not exist" in lines[0], lines[0]
    else:
        assert "it is a directory; give a file name" in lines[0], lines[0]
        assert ".tmp" not in lines[0] and "Errno" not in lines[0]
    assert "loading" not in proc.stderr and "running" not in proc.stderr   # nothing started
    assert not list(tmp_path.glob("*.log")) and not list(tmp_path.glob("tuiprof-*"))


def _unshare() -> bool:
    import shutil
    import subprocess

    return bool(shutil.which("unshare")) and subprocess.run(
        ["unshare", "-rm", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _unshare(), reason="needs unshare -rm (a mount namespace) for a read-only mount")
def test_a_read_only_file_system_is_named_as_such(tmp_path):
    import shlex
    import subprocess
    import sys

    from .conftest import cli_env

    ro = tmp_path / "ro"
    ro.mkdir()
    cmd = (f"mount -t tmpfs -o ro tmpfs {shlex.quote(str(ro))} && exec {shlex.quote(sys.executable)}"
           f" -m tuiprof run --model qwen3-tiny --headless --json {shlex.quote(str(ro / 'x.json'))}")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], env=cli_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"tuiprof: cannot write --json {ro / 'x.json'}: {ro} is on a "
                                   f"read-only file system"), proc.stderr


def test_a_path_that_fails_at_the_end_falls_back_and_says_where(tmp_path):
    gone = tmp_path / "out"
    gone.mkdir()
    proc, _ = _run(["run", "--headless", "--no-nvml", "--json", str(gone / "snap.json"), "--",
                    "python", str(PROGRAMS / "removes_its_output_dir.py"), str(gone)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    rescued = list(tmp_path.glob("tuiprof-rescued-*-snap.json"))
    assert len(rescued) == 1 and read_snapshot(rescued[0]).meta["program"]["exit_status"] == 0
    said = [ln for ln in _lines(proc.stderr) if "instead" in ln]
    assert said == [f"tuiprof: cannot write {gone / 'snap.json'}: no such directory; the snapshot "
                    f"was written to {rescued[0]} instead"], proc.stderr


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize("flag,value", [("--max-new-tokens", "-5"), ("--max-new-tokens", "0"),
                                        ("--prompt-len", "0"), ("--batch", "-1"),
                                        ("--ring-tokens", "0"), ("--max-len", "0"),
                                        ("--sample-every", "0"), ("--nvml-hz", "0")])
def test_counts_that_make_no_sense_are_refused(tmp_path, flag, value):
    proc, _ = _run(["run", "--model", "qwen3-tiny", "--headless", flag, value, "--json",
                    str(tmp_path / "s.json")], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"tuiprof: {flag} {value}") and "loading" not in proc.stderr
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("asked", ["100", str(10**30)])
def test_max_new_tokens_past_the_cache_says_it_is_capped(tmp_path, asked):
    proc, _ = _run(["run", "--model", "qwen3-tiny", "--headless", "--max-len", "40",
                    "--max-new-tokens", asked, "--json", str(tmp_path / "s.json")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (f"tuiprof: --max-new-tokens {asked}: capped at 25 (24 decode steps): the KV cache "
            f"holds 40 positions (--max-len 40) and the prompt takes 16") in proc.stderr
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["meta"]["max_new_tokens"] == 25
    assert sum(t["phase"] == "decode" for t in doc["tokens"]) == 24


def test_tp_beyond_the_kv_heads_is_refused_at_once_leaving_nothing(tmp_path):
    # a temporary directory of its own: tests in another worker write theirs to the shared one
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    work.mkdir()
    tmp.mkdir()
    proc, _seconds = _run(["run", "--model", "qwen3-tiny", "--device", "cpu", "--tp", "3",
                          "--headless"], work, TMPDIR=str(tmp))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("tuiprof: --tp 3 needs at least 3 KV heads; qwen3-tiny has 2: "
                                   "use --tp 2 or fewer")
    assert list(work.iterdir()) == []
    assert list(tmp.iterdir()) == []   # no rank process, no rank log (docs/reliability.md)


# ------------------------------------------------------------------ signals
def _start_program(tmp_path: Path, program: str, *args: str):
    from .conftest import start_cli

    return start_cli(["run", "--headless", "--no-nvml", "--json", str(tmp_path / "snap.json"),
                      "--", "python", str(PROGRAMS / program), *args], tmp_path)


@contextlib.contextmanager
def _stepping(tmp_path: Path, *args: str):
    """``ignores_sigint.py ARGS`` under ``tuiprof run --headless``, yielded once it steps;
    killed at the end if it is still there."""
    from .conftest import wait_for_line

    proc = _start_program(tmp_path, "ignores_sigint.py", *args)
    try:
        wait_for_line(proc, "running ignores_sigint.py")
        while "step 20" not in proc.stdout.readline():   # it is stepping now
            assert proc.poll() is None, proc.stderr.read()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("sigs,rc", [((2, 2), 130), ((15,), 143)])
def test_a_program_that_ignores_ctrl_c_is_stopped_and_the_code_follows_the_signal(tmp_path, sigs,
                                                                                   rc):
    with _stepping(tmp_path) as proc:
        for s in sigs:
            proc.send_signal(s)
            time.sleep(1.0)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == rc, err
    doc = json.loads((tmp_path / "snap.json").read_text())
    prog = doc["meta"]["program"]
    assert prog["ended"] == "stopped" and prog["exit_status"] == rc and not prog["running"]
    assert sum(t["phase"] == "decode" for t in doc["tokens"]) > 10
    assert "Traceback" not in err
    assert f"stopped by tuiprof ({'SIGINT' if rc == 130 else 'SIGTERM'}, exit status {rc})" in err


def test_the_snapshot_is_written_before_the_program_is_asked_to_end(tmp_path):
    """The second Ctrl-C: stop collecting, write, then end the program (its grace): a program
    that takes its time to end, or never does, cannot hold the snapshot back."""
    snap = tmp_path / "snap.json"
    with _stepping(tmp_path, str(snap)) as proc:
        proc.send_signal(2)
        time.sleep(1.0)
        proc.send_signal(2)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "snapshot on disk: True" in out, out[-2000:]
    doc = json.loads(snap.read_text())          # rewritten once the program ended
    assert doc["meta"]["program"]["exit_status"] == 130
    assert sum(t["phase"] == "decode" for t in doc["tokens"]) > 10
