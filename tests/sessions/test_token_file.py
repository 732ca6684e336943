"""``run --detach --listen HOST:PORT --token-file FILE``: the token file must be a regular file
of this user that nobody else can read, holding a token hard to guess; an absent one is made
(0600) and said so. Real ``tuiprof`` commands; the listener on 127.0.0.1 only."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tuiprof.sessions import runtime

from ._helpers import runtime_dir
from .fleet_nodes import free_port

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "tests" / "programs"


def _tuiprof(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "tuiprof", *argv], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture
def rt(monkeypatch):
    d = Path(runtime_dir(monkeypatch))
    yield d
    for s in d.iterdir():          # a session a test started (old code started them all)
        info = runtime.read_info(s) or {}
        if info.get("state") in runtime.LIVE_STATES:
            _tuiprof("stop", s.name)


def _listen(tmp: Path, token_file: str, port: int | None = None) -> subprocess.CompletedProcess:
    # a port of its own each time: a session a test before stopped may still hold its port
    port = port or free_port()
    return _tuiprof("run", "--detach", "--no-cupti", "--no-nvml", "--export-dir", str(tmp),
                    "--listen", f"127.0.0.1:{port}", "--token-file", token_file, "--",
                    "python", str(PROGRAMS / "steps_forever.py"))


def _refused(out: subprocess.CompletedProcess, rt: Path, *words: str) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert "secrets.token_urlsafe" in lines[0]        # how to make a good one
    assert not list(rt.iterdir()), "a session was started"


def test_a_token_file_anyone_can_read_is_refused(rt, tmp_path):
    out = _listen(tmp_path, "/etc/passwd")
    why = "group or others" if os.geteuid() == 0 else "not by you"
    _refused(out, rt, "--token-file /etc/passwd", why)


def test_a_token_file_of_a_good_token_but_mode_0644_is_refused(rt, tmp_path):
    f = tmp_path / "tok"
    f.write_text("Zq3kV9-tR8pL2mX7wB4nC6yH1sD5fG0j\n")
    f.chmod(0o644)
    _refused(_listen(tmp_path, str(f)), rt, "mode 0644", "chmod 600")


@pytest.mark.parametrize("token", ["x" * 32, "short-Tok3n", "abcdefghijklmnopqrstuvwxyz012345"])
def test_a_token_easy_to_guess_is_refused(rt, tmp_path, token):
    f = tmp_path / "tok"
    f.write_text(token + "\n")
    f.chmod(0o600)
    _refused(_listen(tmp_path, str(f)), rt, "too easy to guess")


def test_a_token_file_that_is_not_a_regular_file_is_refused(rt, tmp_path):
    fifo = tmp_path / "tok"
    os.mkfifo(fifo, 0o600)
    _refused(_listen(tmp_path, str(fifo)), rt, "not a regular file")


def test_an_absent_token_file_is_made_0600_and_said_so(rt, tmp_path):
    f = tmp_path / "new.token"
    out = _listen(tmp_path, str(f))
    assert out.returncode == 0, out.stderr
    sid = out.stdout.strip().splitlines()[-1]
    try:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600 and f.stat().st_uid == os.geteuid()
        from tuiprof.sessions.tokens import token_weakness

        token = f.read_text().strip()
        assert token_weakness(token) is None and len(token) >= 43
        said = [ln for ln in out.stderr.splitlines() if "did not exist" in ln]
        assert said == [f"tuiprof: --token-file {f} did not exist: wrote a new token there "
                        f"(256 random bits, mode 0600); give the same file to tuiprof attach "
                        f"--connect"], out.stderr
    finally:
        assert _tuiprof("stop", sid).returncode == 0


def test_a_good_token_file_is_taken(rt, tmp_path):
    f = tmp_path / "tok"
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"Zq3kV9-tR8pL2mX7wB4nC6yH1sD5fG0j\n")
    os.close(fd)
    out = _listen(tmp_path, str(f))
    assert out.returncode == 0, out.stderr
    sid = out.stdout.strip().splitlines()[-1]
    assert _tuiprof("stop", sid).returncode == 0


def test_a_port_in_use_is_refused_before_the_run(rt, tmp_path):
    """Before: the session started, its keeper failed to listen, and the terminal said only
    "the keeper failed (keeper.log)"."""
    import socket

    token = tmp_path / "token"
    token.write_text("Zq3kV9-tR8pL2mX7wB4nC6yH1sD5fG0j\n")
    token.chmod(0o600)
    with socket.create_server(("127.0.0.1", 0)) as held:
        out = _listen(tmp_path, str(token), port=held.getsockname()[1])
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "cannot listen there" in lines[0] and "choose another port" in lines[0], lines[0]
    assert not list(rt.iterdir()), "a session was started"
