"""Hostile outputs and inputs at the edges of a run: CSV cells that try to leave their cell,
output paths that are devices or FIFOs, a program that removes its working directory or stops
itself, a token file anyone can read. Each test runs the real command (a subprocess) or the
real writer and reader."""
from __future__ import annotations

import csv
import json
import os
import select
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tuiprof.export.check_nsys import read_nsys_csv
from tuiprof.export.snapshot import read_snapshot, write_snapshot

from .conftest import REPO, cli_env, hostile_catalogue

# a kernel name that closes its cell and opens a formula in the next one when quotes inside a
# cell are not doubled
BREAKOUT = 'gemm",=HYPERLINK("http://x/?"&A1;"click"),"'
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
PROGRAMS = REPO / "tests" / "programs"
CATALOGUE = hostile_catalogue()


def _cli(*args: str, cwd: Path, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuiprof", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=cli_env(**env))


def _assert_no_formula(rows: list[list[str]], where: str) -> None:
    for row in rows:
        for cell in row:
            assert not (cell.startswith(FORMULA_START) and not CATALOGUE.is_number(cell)), (where, cell)


# ------------------------------------------------------------------ CSV cells stay cells
def test_a_quote_in_a_kernel_name_cannot_open_a_formula_cell_in_the_nsys_csvs(eager_path,
                                                                            tmp_path):
    snap = CATALOGUE.write_hostile_snapshot(eager_path, tmp_path / "breakout.json",
                                             catalogue=(BREAKOUT, "plain", "x,y", '"q"'))
    proc = _cli("export", str(snap), "--nsys", str(tmp_path / "nsys"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kern = tmp_path / "nsys" / "tuiprof_cuda_gpu_kern_sum.csv"
    rows = list(csv.reader(kern.read_text().splitlines()))
    header = rows[0]
    assert header[-1] == "Name" and len(rows) > 1
    assert all(len(r) == len(header) for r in rows), [r for r in rows if len(r) != len(header)]
    _assert_no_formula(rows, kern.name)
    names = {r[-1] for r in rows[1:]}
    assert BREAKOUT in names, names           # the name back whole, as one cell
    assert "x,y" in names and '"q"' in names
    for p in sorted((tmp_path / "nsys").glob("*.csv")):
        got = list(csv.reader(p.read_text().splitlines()))
        assert all(len(r) == len(got[0]) for r in got), p.name
        _assert_no_formula(got, p.name)
        # the project's own nsys-format reader (check_nsys) reads the same cells
        h, body = read_nsys_csv(p)
        assert [h, *body] == got, p.name


def test_the_nsys_reader_still_reads_nsys_own_dialect(tmp_path):
    """nsys quotes a last column with commas and never doubles quotes inside it."""
    p = tmp_path / "nsys_kern.csv"
    p.write_text('Time (%),Total Time (ns),Name\n'
                 '60.0,600,"void f<(char)"a", 2>(int)"\n'
                 '40.0,400,"q"x\n')
    header, rows = read_nsys_csv(p)
    assert header == ["Time (%)", "Total Time (ns)", "Name"]
    assert rows == [["60.0", "600", 'void f<(char)"a", 2>(int)'], ["40.0", "400", '"q"x']]


# ------------------------------------------------------------------ devices and FIFOs
@pytest.fixture(scope="module")
def small_snapshot(tmp_path_factory, eager_view) -> Path:
    return write_snapshot(eager_view, tmp_path_factory.mktemp("snap") / "snap.json")


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_an_export_to_a_character_device_leaves_it_a_device(small_snapshot, tmp_path):
    dev = tmp_path / "n"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))     # what /dev/null is
    sq = tmp_path / "n.sqlite"
    os.mknod(sq, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    proc = _cli("export", str(small_snapshot), "--trace", str(dev), "--steps-csv", str(dev),
                "--sqlite", str(sq), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for p in (dev, sq):
        st = os.stat(p)
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3), p
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n", "n.sqlite"]   # no temp left


def _fifo_reader(path: Path, got: bytearray, deadline: float) -> None:
    """Read the FIFO until its writer has come and gone (or the deadline): opened without
    waiting, so the test never hangs when nothing writes to it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        poll = select.poll()
        poll.register(fd, select.POLLIN | select.POLLHUP)
        while time.monotonic() < deadline:
            if not poll.poll(200):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return        # the writer closed it
            got.extend(chunk)
    finally:
        os.close(fd)


def test_a_fifo_output_is_written_as_a_stream(small_snapshot, tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    got = bytearray()
    reader = threading.Thread(target=_fifo_reader, args=(fifo, got, time.monotonic() + 120),
                              daemon=True)
    reader.start()
    proc = _cli("export", str(small_snapshot), "--steps-csv", str(fifo), cwd=tmp_path)
    reader.join(120)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    rows = list(csv.reader(got.decode().splitlines()))
    assert rows and rows[0][0] == "seq" and len(rows) > 10, got[:200]


def test_a_fifo_nobody_reads_does_not_hang_the_run_and_the_snapshot_is_rescued(eager_path,
                                                                              tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    proc = _cli("replay", str(eager_path), "--headless", "--json", str(fifo), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rescued = list(tmp_path.glob("tuiprof-rescued-*-f"))
    assert len(rescued) == 1 and read_snapshot(rescued[0]).meta["model"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    said = [ln for ln in proc.stderr.splitlines() if "instead" in ln]
    assert said == [f"tuiprof: cannot write {fifo}: {fifo} has no reader (a FIFO) or no device "
                    f"behind it; the snapshot was written to {rescued[0]} instead"], proc.stderr


def test_a_process_substitution_gets_the_bytes(small_snapshot, tmp_path):
    """``--steps-csv >(wc -c)``: the shell hands tuiprof ``/dev/fd/N``, a pipe's end."""
    r, w = os.pipe()
    got = bytearray()

    def read() -> None:
        while chunk := os.read(r, 1 << 16):
            got.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "tuiprof", "export", str(small_snapshot),
                               "--steps-csv", f"/dev/fd/{w}"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=180, env=cli_env(), pass_fds=(w,))
    finally:
        os.close(w)
    reader.join(60)
    os.close(r)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.reader(got.decode().splitlines()))
    assert rows and rows[0][0] == "seq" and len(rows) > 10, got[:200]


def test_a_full_device_is_one_line(small_snapshot, tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    proc = _cli("export", str(small_snapshot), "--trace", "/dev/full", cwd=tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.strip() == "tuiprof: cannot write /dev/full: no space left on /dev/full"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_a_program_run_with_its_snapshot_to_a_device_keeps_the_device(tmp_path):
    dev = tmp_path / "null"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (tmp_path / "scratch").mkdir()    # the program removes it after its step
    proc = _cli("run", "--headless", "--no-nvml", "--json", str(dev), "--", "python",
                str(PROGRAMS / "removes_its_output_dir.py"), str(tmp_path / "scratch"),
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(os.stat(dev).st_mode)
    # the program's log goes where tuiprof started (not "null.log" beside a device)
    assert (tmp_path / "tuiprof-removes_its_output_dir.log").read_text().startswith("working")
    assert f"snapshot written to {dev}" in proc.stderr


def test_a_snapshot_to_dev_stdout_is_written_to_stdout(eager_path, tmp_path):
    proc = _cli("replay", str(eager_path), "--headless", "--json", "/dev/stdout", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc, end = json.JSONDecoder().raw_decode(proc.stdout)
    assert doc["meta"]["model"] and "decode steps" in proc.stdout[end:]   # then the summary
    assert os.path.islink("/dev/stdout") or not os.path.isfile("/dev/stdout")


# ------------------------------------------------------------------ a removed working directory
def test_the_snapshot_survives_a_program_that_removes_its_working_directory(tmp_path):
    work = tmp_path / "d"
    work.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _cli("run", "--headless", "--no-nvml", "--json", "rel.json", "--", "python",
                str(PROGRAMS / "removes_its_cwd.py"), cwd=work, TMPDIR=str(tmp))
    assert not work.exists()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    rescued = list(tmp.glob("tuiprof-rescued-*-rel.json"))
    assert len(rescued) == 1, (list(tmp.iterdir()), proc.stderr)
    snap = read_snapshot(rescued[0])
    assert snap.meta["program"]["exit_status"] == 0 and snap.counters["tokens"] >= 2
    said = [ln for ln in proc.stderr.splitlines() if "instead" in ln]
    assert said == [f"tuiprof: cannot write {work / 'rel.json'}: no such directory; the "
                    f"snapshot was written to {rescued[0]} instead"], proc.stderr


# ------------------------------------------------------------------ a program that stops itself
def _state(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text[text.rindex(")") + 2:].split(" ", 1)[0]


def _until(pred, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("how,said", [
    ("once", "continued it (SIGCONT)"),
    ("again", "killed it (SIGKILL)")])
def test_a_program_that_stops_itself_does_not_hold_the_snapshot(tmp_path, how, said):
    snap, marker = tmp_path / "out.json", tmp_path / "pid"
    argv = [sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml", "--json",
            str(snap), "--", "python", str(PROGRAMS / "stops_itself.py"), str(marker)]
    argv += ["again"] if how == "again" else []
    err = tmp_path / "stderr"
    with open(err, "w") as fh:
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=fh,
                                stdin=subprocess.DEVNULL, env=cli_env())
    pid = None
    try:
        assert _until(marker.exists, 180), err.read_text()
        pid = int(marker.read_text())
        assert _until(lambda: _state(pid) == "T", 60), _state(pid)     # it is stopped
        proc.send_signal(2)           # Ctrl-C: to the program (pending while it is stopped)
        time.sleep(1.0)
        proc.send_signal(2)           # the second: stop the session
        # from tuiprof's copy, whatever the program's process does (before: 65 s, or never)
        assert _until(snap.exists, 20), err.read_text()
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if pid is not None and _state(pid) not in ("", "Z"):
            os.kill(pid, 9)
    lines = err.read_text().splitlines()
    assert rc == 130, lines
    # Continued, the program holds two signals at once: the Ctrl-C forwarded to it while it was
    # stopped, and tuiprof's SIGTERM. Which one Python raises first is the program's race, not
    # tuiprof's: its own KeyboardInterrupt traceback (its frames only) may be printed, as
    # `python` prints it. No traceback of tuiprof's.
    frames = [ln for ln in lines if ln.strip().startswith('File "')]
    assert all("stops_itself.py" in ln for ln in frames), lines
    assert any(said in ln and f"(pid {pid})" in ln for ln in lines), lines
    assert lines[-1] == "tuiprof: the program was stopped by tuiprof (SIGINT, exit status 130)"
    assert _state(pid) in ("", "Z")         # neither stopped nor running any more
    doc = json.loads(snap.read_text())
    assert doc["meta"]["program"]["ended"] == "stopped"
    if how == "once":    # continued, it ended: the snapshot rewritten from its last copy
        assert sum(t["phase"] == "decode" for t in doc["tokens"]) == 3
