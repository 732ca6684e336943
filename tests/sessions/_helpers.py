"""What the remote-session tests share: waiting on a live app, reading its screen."""
from __future__ import annotations

import asyncio
import time


async def until(pred, app, seconds: float = 60.0) -> None:
    """Refresh ``app`` until ``pred()`` holds; fail after ``seconds``."""
    t_end = time.monotonic() + seconds
    while not pred():
        assert time.monotonic() < t_end, "timed out"
        app.refresh_view()
        await asyncio.sleep(0.1)


async def quit_app(pilot, app) -> None:
    """``q``, then wait for what it started (the app writes its snapshot on a worker)."""
    await pilot.press("q")
    await app.workers.wait_for_complete()
    await pilot.pause()


def screen_text(app) -> str:
    """The current screen as plain text."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in s) for s in strips)


def runtime_dir(monkeypatch) -> str:
    """A private runtime directory for the sessions of one test (short: socket paths)."""
    import os
    import tempfile

    d = tempfile.mkdtemp(prefix="tprt-", dir="/tmp")
    os.chmod(d, 0o700)
    monkeypatch.setenv("TUIPROF_RUNTIME_DIR", d)
    return d


def held_program(tmp_path, program: list, options: tuple = (), seconds: float = 240.0,
                 on_running=None):
    """``tuiprof run [options] -- PROGRAM`` held by this process as the live app holds it
    (no screen): runs until the program's main process ends; returns (the held session, every
    process's view with raw records, the snapshot written)."""
    from tuiprof.cli import parse_args
    from tuiprof.cli.program import live_control
    from tuiprof.cli.sessions import hold

    args = parse_args(["run", "--no-nvml", "--export-dir", str(tmp_path), *options, "--",
                       *program])
    main, name, stem = live_control(args)
    held = hold(args, main, name=name, kind="program", stem=stem)
    held.start()
    try:
        t_end = time.monotonic() + seconds
        while not held.program_ended:
            assert time.monotonic() < t_end, [e.facts() for e in held.entries]
            if on_running is not None:
                on_running(held)
            time.sleep(0.2)
        held.stop()
        rv = held.export_view()
        snap = held.write_snapshot(tmp_path / "snap.json")
    finally:
        held.close()
    return held, rv, snap


class PtyProcess:
    """A command on a pseudo-terminal of its own (its controlling terminal), as a user runs a
    full-screen app in an SSH login: what it draws is read back, keys are typed, and closing
    the terminal sends it SIGHUP."""

    def __init__(self, argv: list, env: dict, cwd=None, cols: int = 120, rows: int = 40) -> None:
        import fcntl
        import os
        import struct
        import subprocess
        import termios
        import threading

        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

        def controlling_tty():
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        env = dict(env, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                     cwd=cwd, start_new_session=True,
                                     preexec_fn=controlling_tty)
        os.close(slave)
        self.master = master
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        import os
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self._lock:
                self._buf += chunk
                del self._buf[:-(1 << 20)]

    def text(self) -> str:
        import re
        with self._lock:
            raw = bytes(self._buf).decode("utf-8", "replace")
        return re.sub(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07]*\x07|[@-Z\\-_])", " ", raw)

    def wait_for(self, text: str, seconds: float = 60.0) -> None:
        t_end = time.monotonic() + seconds
        while text not in " ".join(self.text().split()):
            assert self.proc.poll() is None or text in self.text(), \
                f"exited {self.proc.returncode}: {self.text()[-1500:]}"
            assert time.monotonic() < t_end, f"no {text!r} on screen: {self.text()[-1500:]}"
            time.sleep(0.1)

    def type(self, keys: bytes) -> None:
        import os
        os.write(self.master, keys)

    def hang_up(self) -> None:
        """The terminal goes away (a dropped SSH connection): SIGHUP to the app."""
        import os
        try:
            os.close(self.master)
        except OSError:
            pass

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.hang_up()
