"""Long-running sessions, each with real processes: ``tuiprof run --detach`` (a keeper in a
session of its own), ``tuiprof ls``, two UIs attached at once (their keys), the real ``tuiprof
attach`` on a pseudo-terminal (q detaches; SIGKILL; a closed terminal), SIGHUP to the keeper,
periodic snapshots (a failed write keeps the previous one), ``tuiprof stop``, a session that
ends with its program, a dead keeper, TCP with a wrong token, and a 1,000-attach soak with the
keeper's and the session process's memory flat."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuiprof.sessions import protocol, runtime
from tuiprof.sessions.attached import AttachedSession

from ._helpers import PtyProcess, runtime_dir
from .relay import Relay

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "tests" / "programs"


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _tuiprof(*argv: str, timeout: float = 120, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuiprof", *argv], capture_output=True,
                          text=True, timeout=timeout, env=_env(), cwd=cwd)


def _detach(tmp: Path, *program: str, options: tuple = ()) -> str:
    out = _tuiprof("run", "--detach", "--no-cupti", "--no-nvml", "--export-dir", str(tmp),
                   *options, "--", "python", *program)
    assert out.returncode == 0, out.stderr
    sid = out.stdout.strip().splitlines()[-1]
    assert f"session {sid} started" in out.stderr and "\n" not in sid
    return sid


def _info(sid: str) -> dict:
    return runtime.read_info(runtime.runtime_root() / sid) or {}


def _ask(sid: str, op: str):
    c = protocol.Client.unix(str(runtime.runtime_root() / sid / "s.sock"), role="control")
    try:
        return c.request(op, timeout=20)
    finally:
        c.close(bye=True)


def _until(pred, seconds: float = 60.0, what: str = "") -> None:
    t_end = time.monotonic() + seconds
    while not pred():
        assert time.monotonic() < t_end, f"timed out: {what}"
        time.sleep(0.1)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _end_all() -> None:
    """No keeper, session process or program outlives the tests (by pid only)."""
    root = runtime.runtime_root()
    for d in root.iterdir():
        info = runtime.read_info(d) or {}
        if info.get("state") in runtime.LIVE_STATES and runtime.pid_alive(info.get("holder_pid")):
            _tuiprof("stop", d.name, timeout=120)
        for key in ("holder_pid", "pid"):
            pid = info.get(key)
            if pid and runtime.pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


@pytest.fixture(scope="module")
def rt():
    mp = pytest.MonkeyPatch()
    runtime_dir(mp)
    try:
        yield
    finally:
        _end_all()
        mp.undo()


@pytest.fixture(scope="module")
def running(rt, tmp_path_factory):
    """A detached program marking steps forever (tests leave it running)."""
    tmp = tmp_path_factory.mktemp("running")
    sid = _detach(tmp, str(PROGRAMS / "steps_forever.py"))
    _until(lambda: (_ask(sid, "info").get("steps") or 0) > 5, 60, "steps")
    return sid, tmp


def _attached(sid: str) -> AttachedSession:
    path = str(runtime.runtime_root() / sid / "s.sock")
    ctl = AttachedSession(lambda role, **f: protocol.Client.unix(path, role=role, **f), sid)
    ctl.start()
    return ctl


def _attach_then_q(cwd, *argv: str) -> None:
    """``tuiprof attach ARGV`` on a terminal: the session on screen, q, the line it leaves."""
    app = PtyProcess([sys.executable, "-m", "tuiprof", "attach", *argv], _env(), cwd=cwd)
    try:
        app.wait_for("steps_forever.py", 60)
        app.wait_for("steps ", 30)
        before = set(Path(cwd).glob("tuiprof-*.json"))
        app.type(b"e")                                   # a snapshot from the attached UI
        _until(lambda: set(Path(cwd).glob("tuiprof-*.json")) - before, 30, "e")
        app.type(b"q")
        app.proc.wait(30)
        assert app.proc.returncode == 0
        app.wait_for("detached from session", 10)
    finally:
        app.close()


def _steps(ctl) -> int:
    return ctl.store.view(raw=False).counters.get("tokens", 0)


def _pulled(ctl, n: int = 2) -> None:
    main = ctl.main_ctl
    start = main.pulls
    _until(lambda: main.pulls >= start + n, 30, "pulls")


def test_detach_ls_two_uis_their_keys_and_q_leaves_it_running(running):
    sid, tmp = running
    ls = _tuiprof("ls")
    row = next(ln for ln in ls.stdout.splitlines() if ln.startswith(sid))
    assert "steps_forever.py" in row and "running" in row and "[live app]" not in row
    a, b = _attached(sid), _attached(sid)            # two UIs at once
    try:
        _pulled(a)
        _pulled(b)
        assert _steps(a) > 0 and _steps(b) > 0
        # both press space at the same moment: one pause, not a pause and a resume
        a.toggle_pause()
        b.toggle_pause()
        _until(lambda: a.status.state == "paused" and b.status.state == "paused", 30, "paused")
        time.sleep(0.5)
        _pulled(a)
        n = _steps(a)
        time.sleep(0.6)
        _pulled(a)
        assert _steps(a) == n                             # held at one step
        assert "a key from another UI came first" in a.status.message + b.status.message
        b.toggle_pause()                                   # one resume: it goes on
        _until(lambda: (_pulled(a) or _steps(a)) > n + 3, 30, "resumed")
    finally:
        a.close()
        b.close()
    # the real attach on a terminal: it shows the session, q detaches, the session goes on
    _attach_then_q(tmp, sid)
    before = _ask(sid, "info")["steps"]
    _until(lambda: _ask(sid, "info")["steps"] > before, 20, "still running")
    assert _info(sid)["state"] == "running"


def test_a_killed_or_hung_up_ui_and_a_sighup_leave_the_session_running(running):
    sid, tmp = running
    base = _ask(sid, "info")["connections"]
    app = PtyProcess([sys.executable, "-m", "tuiprof", "attach", sid], _env(), cwd=tmp)
    try:
        app.wait_for("steps ", 60)
        os.kill(app.proc.pid, signal.SIGKILL)              # an attached UI killed
        app.proc.wait(10)
    finally:
        app.close()
    app = PtyProcess([sys.executable, "-m", "tuiprof", "attach", sid], _env(), cwd=tmp)
    try:
        app.wait_for("steps ", 60)
        app.hang_up()                                       # its terminal closed: SIGHUP
        app.proc.wait(30)
    finally:
        app.close()
    keeper = _info(sid)["holder_pid"]
    os.kill(keeper, signal.SIGHUP)                          # the keeper ignores it
    time.sleep(0.5)
    before = _ask(sid, "info")
    _until(lambda: _ask(sid, "info")["steps"] > before["steps"] + 5, 30, "still going")
    assert runtime.pid_alive(keeper) and _info(sid)["state"] == "running"
    _until(lambda: _ask(sid, "info")["connections"] <= base, 30, "connections closed")


def test_a_thousand_attaches_leave_memory_flat(running):
    sid, tmp = running
    info = _info(sid)
    keeper, session = info["holder_pid"], info["pid"]
    path = str(runtime.runtime_root() / sid / "s.sock")

    def attach_once(i: int) -> None:
        """What `tuiprof attach` does to connect: the session's facts, its processes, one
        viewer each (relayed to the process's own server); every 10th fetches the whole
        mirror, as a UI's first refresh does (the others a cheap relayed request)."""
        c = protocol.Client.unix(path, role="control")
        c.request("info")
        procs = c.request("procs")
        v = protocol.Client.unix(path, role="viewer", proc=procs[0]["index"])
        if i % 10 == 0:
            status, delta = v.request("pull", 0, True)
            assert delta["full"] and status.live
        else:
            assert v.request("busy") is False
        v.close(bye=True)
        c.close(bye=True)

    for i in range(100):                 # warm up (allocator pools, first-time imports)
        attach_once(i)
    rss = (_rss_kib(keeper), _rss_kib(session))
    threads = len(os.listdir(f"/proc/{keeper}/task"))
    for i in range(1000):
        attach_once(i)
    time.sleep(0.5)
    grown = (_rss_kib(keeper) - rss[0], _rss_kib(session) - rss[1])
    assert grown[0] < 3 * 1024 and grown[1] < 3 * 1024, grown     # KiB
    assert len(os.listdir(f"/proc/{keeper}/task")) <= threads + 1
    assert _info(sid)["state"] == "running"


def test_attach_through_a_forwarded_socket(running, tmp_path):
    """ssh -L LOCAL.sock:REMOTE/s.sock, then tuiprof attach --connect LOCAL.sock."""
    sid, tmp = running
    import tempfile
    local = os.path.join(tempfile.mkdtemp(prefix="fw-", dir="/tmp"), "tp.sock")
    # what ssh -L LOCAL.sock:REMOTE.sock does (ssh runs as the same user on both ends)
    fw = Relay(str(runtime.runtime_root() / sid / "s.sock"), listen=local).up()
    try:
        _attach_then_q(tmp, "--connect", local)
    finally:
        fw.down()
    assert _info(sid)["state"] == "running"


def test_tcp_needs_the_token(rt, tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token_file = tmp_path / "token"
    sid = _detach(tmp_path, str(PROGRAMS / "steps_forever.py"),
                  options=("--listen", f"127.0.0.1:{port}", "--token-file", str(token_file)))
    assert token_file.stat().st_mode & 0o777 == 0o600
    wrong = tmp_path / "wrong"
    wrong.write_text("x" * 32)
    out = _tuiprof("attach", "--connect", f"127.0.0.1:{port}", "--token-file", str(wrong))
    assert out.returncode == 2 and "wrong token" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    token = token_file.read_text().strip()
    ctl = AttachedSession(lambda role, **f: protocol.Client.tcp("127.0.0.1", port, token,
                                                                role=role, **f), sid)
    ctl.start()
    try:
        _pulled(ctl)
        assert ctl.store.view(raw=False).meta["program"]["name"] == "steps_forever.py"
    finally:
        ctl.close()
    out = _tuiprof("stop", sid)
    assert out.returncode == 0


def test_periodic_snapshots_stop_and_the_stopped_session(rt, tmp_path):
    sid = _detach(tmp_path, str(PROGRAMS / "steps_forever.py"),
                  options=("--snapshot-every", "0.02"))         # every 1.2 s
    _until(lambda: _info(sid).get("snapshot"), 30, "first snapshot")
    snap = Path(_info(sid)["snapshot"])
    first = snap.stat().st_mtime_ns
    _until(lambda: snap.stat().st_mtime_ns > first, 30, "second snapshot")
    out = _tuiprof("stop", sid)
    assert out.returncode == 0 and out.stdout.strip() == \
        f"tuiprof: session {sid} stopped; snapshot: {snap}"
    info = _info(sid)
    assert info["state"] == "stopped" and info["exit_status"] == 130      # Ctrl-C, then ended
    log = Path(info["log"]).read_text()
    assert "serving" in log and "shutting down" in log                    # it shut down cleanly
    doc = json.loads(snap.read_text())
    assert len(doc["tokens"]) > 10 and doc["meta"]["program"]["exit_status"] == 130
    ls = _tuiprof("ls").stdout
    assert "stopped (exit 130)" in next(ln for ln in ls.splitlines() if ln.startswith(sid))
    out = _tuiprof("stop", sid)                                            # forget it
    assert out.returncode == 0 and "removed from the list" in out.stdout
    assert sid not in _tuiprof("ls").stdout


def test_a_session_ends_with_its_program(rt, tmp_path):
    sid = _detach(tmp_path, str(PROGRAMS / "steps_forever.py"), "40")
    _until(lambda: _info(sid).get("state") == "ended", 60, "ended")
    info = _info(sid)
    assert info["exit_status"] == 0 and info["steps"] >= 40
    doc = json.loads(Path(info["snapshot"]).read_text())
    assert len([t for t in doc["tokens"] if t["phase"] == "decode"]) == 40
    _until(lambda: not runtime.pid_alive(info["holder_pid"]), 20, "keeper gone")
    app = PtyProcess([sys.executable, "-m", "tuiprof", "attach", sid], _env(), cwd=tmp_path)
    try:   # attach to an ended session: its final snapshot, read-only
        app.wait_for("has ended (exit status 0)", 30)
        app.wait_for("read-only", 30)
        app.type(b"q")
        app.proc.wait(30)
    finally:
        app.close()


def test_ls_counts_a_servers_requests(rt, tmp_path):
    """A detached server's requests reach `tuiprof ls` and the session's info (the column
    read "–" over 898 requests of a transformers serve session)."""
    sid = _detach(tmp_path, str(PROGRAMS / "api_server.py"))
    _until(lambda: _info(sid).get("state") == "ended", 60, "ended")
    assert _info(sid)["requests"] == 6
    row = next(ln for ln in _tuiprof("ls").stdout.splitlines() if ln.startswith(sid))
    header = _tuiprof("ls").stdout.splitlines()[0]
    at = header.index("REQUESTS")
    assert row[at - 2:at + len("REQUESTS")].split() == ["6"], (header, row)


def test_a_dead_keeper_is_said_plainly(rt, tmp_path):
    sid = _detach(tmp_path, str(PROGRAMS / "steps_forever.py"))
    info = _info(sid)
    os.kill(info["holder_pid"], signal.SIGKILL)
    _until(lambda: not runtime.pid_alive(info["pid"]), 30, "session process orphaned, ended")
    row = next(ln for ln in _tuiprof("ls").stdout.splitlines() if ln.startswith(sid))
    assert row.rstrip().endswith("dead")
    out = _tuiprof("attach", sid)
    assert out.returncode == 2 and "is not running (dead)" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    orphan = list(tmp_path.glob("tuiprof-*-orphan-*.json"))
    assert orphan, "the session process wrote what it had measured"
    assert _tuiprof("stop", sid).returncode == 0 and sid not in _tuiprof("ls").stdout


def test_a_failed_snapshot_write_keeps_the_previous_one(rt, tmp_path, monkeypatch):
    from tuiprof.export import _atomic
    from tuiprof.sessions.keeper import snapshot_path, write_snapshot

    from ._helpers import held_program

    def check(held) -> None:
        if held.info.get("checked") or held.totals()["steps"] < 3:
            return
        held.info["checked"] = True
        assert write_snapshot(held, "periodic")
        path = snapshot_path(held)
        before = path.read_bytes()

        def full(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(_atomic.os, "fsync", full)
        assert write_snapshot(held, "periodic") is None
        monkeypatch.undo()
        assert path.read_bytes() == before                      # the previous one, whole
        assert "the disk is full" in held.info["snapshot_error"]
        assert "previous one is kept" in held.notices[-1][1]
        assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]

    held, rv, snap = held_program(tmp_path, ["python", str(PROGRAMS / "steps_forever.py"), "30"],
                                  on_running=check)
    assert held.info["checked"]


def test_a_model_runs_detached(rt, tmp_path):
    out = _tuiprof("--model", "qwen3-tiny", "--device", "cpu", "--no-cupti", "--no-nvml",
                   "--max-new-tokens", "8", "--export-dir", str(tmp_path), "--detach")
    assert out.returncode == 0, out.stderr
    sid = out.stdout.strip().splitlines()[-1]
    _until(lambda: (_ask(sid, "info").get("steps") or 0) > 3, 120, "tokens")
    row = next(ln for ln in _tuiprof("ls").stdout.splitlines() if ln.startswith(sid))
    assert "qwen3-tiny" in row and "running" in row
    out = _tuiprof("stop", sid)
    assert out.returncode == 0
    doc = json.loads(Path(_info(sid)["snapshot"]).read_text())
    assert doc["meta"]["model"] == "qwen3-tiny" and len(doc["tokens"]) > 3
