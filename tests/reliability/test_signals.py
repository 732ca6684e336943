"""Ctrl-C, SIGTERM and a closed terminal (SIGHUP) at each phase of a real ``python -m tuiprof``.

Every scenario is a real subprocess running qwen3-tiny on the CPU; they all run at once (one
module fixture) so the file costs about as much as its slowest scenario. What is checked: the
exit code (128 + signal), one ``tuiprof:`` line saying what happened and no traceback, and that
the snapshot was written and reads back as a valid snapshot.

* headless, signal while the model loads / while it decodes / while ``torch.compile`` runs
  (a cold inductor cache, so the compile is still going: it cannot be interrupted, the process
  ends once the data is written);
* the live app in a pseudo-terminal: the terminal closes (the master side is closed, so the
  kernel sends SIGHUP, as on an SSH drop), or SIGTERM arrives.
"""
from __future__ import annotations

import os
import re
import select
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tuiprof.export.snapshot import read_snapshot

from .conftest import pty_cli, read_pty, start_cli, wait_for_line

pytestmark = pytest.mark.slow

HEADLESS = ["--model", "qwen3-tiny", "--headless", "--max-new-tokens", "5000"]


def _headless(tmp: Path, name: str, sig: int, when: str, extra=(), env=None) -> dict:
    out = tmp / f"{name}.json"
    proc = start_cli([*HEADLESS, *extra, "--json", str(out)], tmp, **(env or {}))
    t0 = time.monotonic()
    try:
        seen = wait_for_line(proc, when)
        proc.send_signal(sig)
        stdout, rest = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return {"rc": proc.returncode, "stderr": "".join(seen) + rest, "stdout": stdout,
            "snapshot": out, "seconds": time.monotonic() - t0}


def _app_in_pty(tmp: Path, name: str, how: str) -> dict:
    """The live app on a real pseudo-terminal; ``how``: "close" (SIGHUP) or "SIGTERM"."""
    outdir = tmp / name
    outdir.mkdir()
    pid, fd = pty_cli(["--model", "qwen3-tiny", "--export-dir", str(outdir)], 40, 120)
    screen = bytearray()
    decoding = re.compile(rb"m decode \x1b")   # the status line's state badge
    end = time.monotonic() + 90
    while time.monotonic() < end and not decoding.search(screen[-20000:]):
        chunk = read_pty(fd, 0.2)
        if chunk is None:
            break
        screen += chunk
    assert decoding.search(screen), screen[-2000:]
    time.sleep(0.5)
    if how == "close":
        os.close(fd)        # the terminal goes away: the kernel hangs up the session
    else:
        os.kill(pid, getattr(signal, how))
    status = None
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if how != "close" and select.select([fd], [], [], 0.05)[0]:
            try:
                screen += os.read(fd, 65536)
            except OSError:
                pass
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError(f"the app did not exit after {how}")
    if how != "close":
        while chunk := read_pty(fd, 0.1):
            screen += chunk
        os.close(fd)
    return {"rc": os.waitstatus_to_exitcode(status), "screen": bytes(screen),
            "snapshots": sorted(outdir.glob("tuiprof-*.json"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("signals")
    cold = {"TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor-cold"),   # a compile that takes a while
            "TORCHINDUCTOR_COMPILE_THREADS": "1"}                    # without a worker pool
    jobs = {
        "int-loading": lambda: _headless(tmp, "int-loading", signal.SIGINT, "loading"),
        "term-loading": lambda: _headless(tmp, "term-loading", signal.SIGTERM, "loading"),
        "int-decode": lambda: _headless(tmp, "int-decode", signal.SIGINT, "generating"),
        "term-decode": lambda: _headless(tmp, "term-decode", signal.SIGTERM, "generating"),
        "int-compiling": lambda: _headless(tmp, "int-compiling", signal.SIGINT, "compiling",
                                           ["--mode", "compiled"], cold),
        "app-hangup": lambda: _app_in_pty(tmp, "app-hangup", "close"),
        "app-term": lambda: _app_in_pty(tmp, "app-term", "SIGTERM"),
    }
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {k: pool.submit(fn) for k, fn in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


def _check_headless(r: dict, sig: int) -> list:
    name = signal.Signals(sig).name
    err = r["stderr"]
    assert "Traceback" not in err + r["stdout"], err
    assert r["rc"] == 128 + sig, (r["rc"], err)
    said = [ln for ln in err.splitlines() if f"{name}: stopping" in ln]
    assert len(said) == 1, err
    assert all(ln.startswith("tuiprof: ") for ln in err.splitlines()), err
    assert f"snapshot written to {r['snapshot']}" in err
    view = read_snapshot(r["snapshot"])   # valid: schema-checked and rebuilt
    return [t for t in view.tokens if t.done]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["int", "term"])
def test_signal_while_loading_stops_and_writes_snapshot(runs, sig):
    r = runs[f"{signal.Signals(sig).name[3:].lower()}-loading"]
    tokens = _check_headless(r, sig)
    assert tokens == []                   # stopped before generating: the engine never starts
    assert "generating" not in r["stderr"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["int", "term"])
def test_signal_during_decode_keeps_the_tokens(runs, sig):
    r = runs[f"{signal.Signals(sig).name[3:].lower()}-decode"]
    tokens = _check_headless(r, sig)
    assert tokens[0].phase == "prefill" and sum(t.phase == "decode" for t in tokens) >= 1
    assert "decode steps" in r["stdout"]  # the summary was printed too


def test_signal_during_compile_exits_with_the_data(runs):
    """``torch.compile`` cannot be interrupted: the session stops, writes its snapshot, and the
    process ends without waiting for the compile (before the fix it aborted in C++ at exit)."""
    r = runs["int-compiling"]
    tokens = _check_headless(r, signal.SIGINT)
    assert tokens[0].phase == "prefill"   # compiled mode compiles beside eager decode steps,
    assert all(t.compiling for t in tokens[1:])   # each marked as decoded beside the compile
    assert "terminate called" not in r["stderr"]


def test_terminal_closed_writes_the_auto_snapshot(runs):
    r = runs["app-hangup"]
    assert r["rc"] == 128 + signal.SIGHUP, r
    assert len(r["snapshots"]) == 1, r["snapshots"]
    view = read_snapshot(r["snapshots"][0])
    assert sum(t.done and t.phase == "decode" for t in view.tokens) >= 1
    assert view.collectors["cupti"]["ok"] is False   # degraded on this CPU, and recorded so


def test_sigterm_to_the_app_quits_like_q(runs):
    r = runs["app-term"]
    assert r["rc"] == 128 + signal.SIGTERM, r["screen"][-1500:]
    assert len(r["snapshots"]) == 1
    text = r["screen"].decode("utf-8", "replace")
    assert "Traceback" not in text
    line = f"tuiprof: SIGTERM: session stopped; snapshot written to {r['snapshots'][0]}"
    # the terminal wraps it at 120 columns, anywhere in the path: compared without whitespace
    assert "".join(line.split()) in "".join(text.split()), text[-800:]
    read_snapshot(r["snapshots"][0])
