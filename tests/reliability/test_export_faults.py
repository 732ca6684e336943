"""Exports to a path that cannot be written, or onto a full disk: one-line TuiprofError, and
nothing half-written (no temp file left, an existing file at the target untouched).

A full disk is simulated by making the write raise ``OSError(ENOSPC)``: either in the middle of
writing the temp file, or at ``fsync`` (where a full disk shows with delayed allocation).
"""
from __future__ import annotations

import errno
import io
import os
import tempfile
from pathlib import Path

import pytest

from tuiprof.export.recording import write_recording
from tuiprof.errors import TuiprofError
from tuiprof.export import _atomic
from tuiprof.export.nsys_reports import write_nsys_reports
from tuiprof.export.nsys_sqlite import write_nsys_sqlite
from tuiprof.export.snapshot import write_snapshot
from tuiprof.export.trace import write_trace

WRITERS = {
    "snapshot": (write_snapshot, "out.json"),
    "trace": (write_trace, "out.trace.json"),
    "sqlite": (write_nsys_sqlite, "out.sqlite"),
    "nsys": (write_nsys_reports, "nsys"),          # a directory of CSVs
    "recording": (write_recording, "out.json.gz"),
}


@pytest.fixture(scope="module")
def small_view(eager_path):
    """The eager H100 fixture replayed with a ring of 4 raw tokens (keeps the exports quick)."""
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=4)
    replay_into(load_recording(eager_path), store)
    return store.view()


def _one_line(exc: TuiprofError) -> str:
    msg = str(exc)
    assert msg and "\n" not in msg and "Traceback" not in msg, msg
    return msg


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.rglob("*") if p.name.startswith(".") or ".tmp" in p.name)


@pytest.mark.parametrize("what", WRITERS)
def test_full_disk_at_fsync(what, small_view, tmp_path, monkeypatch):
    fn, name = WRITERS[what]
    target = tmp_path / name
    if what != "nsys":
        target.write_bytes(b"OLD")                      # an earlier export at the same path

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(TuiprofError) as info:
        fn(small_view, target)
    msg = _one_line(info.value)
    assert msg.startswith("cannot write") and ("disk is full" in msg or "No space left" in msg), msg
    assert _leftovers(tmp_path) == []
    if what != "nsys":
        assert target.read_bytes() == b"OLD"
    print(what, "->", msg)


@pytest.mark.parametrize("what", ["snapshot", "trace", "nsys"])
def test_full_disk_in_the_middle_of_a_write(what, small_view, tmp_path, monkeypatch):
    """Half the bytes go to the temp file, then the device is full."""
    fn, name = WRITERS[what]
    target = tmp_path / name
    real_open = open

    class Full(io.FileIO):
        def write(self, b):
            super().write(bytes(b)[: len(b) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fake_open(file, mode="r", *a, **k):
        if "w" in mode and Path(file).name.startswith("."):
            return Full(file, "w")
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(_atomic, "open", fake_open, raising=False)
    with pytest.raises(TuiprofError) as info:
        fn(small_view, target)
    assert "the disk is full" in _one_line(info.value)
    assert _leftovers(tmp_path) == []
    if what != "nsys":
        assert not target.exists()


def _unwritable(kind: str, tmp_path: Path, monkeypatch) -> Path:
    if kind == "parent-is-a-file":
        (tmp_path / "afile").write_text("x")
        return tmp_path / "afile"
    if kind == "missing-dir":
        return tmp_path / "no" / "such"
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    if os.geteuid() == 0:  # root writes anyway: the kernel's EACCES is injected instead
        def mkstemp(*a, **k):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    return d


@pytest.mark.parametrize("kind", ["parent-is-a-file", "missing-dir", "read-only-dir"])
@pytest.mark.parametrize("what", ["snapshot", "sqlite", "trace", "recording"])
def test_unwritable_path(what, kind, small_view, tmp_path, monkeypatch):
    fn, name = WRITERS[what]
    d = _unwritable(kind, tmp_path, monkeypatch)
    with pytest.raises(TuiprofError) as info:
        fn(small_view, d / name)
    msg = _one_line(info.value)
    assert msg.startswith("cannot write"), msg
    want = {"parent-is-a-file": ("not a directory", "Not a directory"),
            "missing-dir": ("no such directory", "No such file"),
            "read-only-dir": ("permission denied", "Permission denied")}[kind]
    assert any(w in msg for w in want), msg
    assert _leftovers(tmp_path) == []


def test_nsys_into_a_file_path(small_view, tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(TuiprofError) as info:
        write_nsys_reports(small_view, tmp_path / "afile")
    assert _one_line(info.value).startswith("cannot write")


def test_cli_export_unwritable_is_one_line(small_view, tmp_path, capsys):
    from tuiprof.cli import main

    snap = write_snapshot(small_view, tmp_path / "s.json")
    for flag, dest in (("--sqlite", "x.sqlite"), ("--trace", "t.json"), ("--nsys", "dir")):
        rc = main(["export", str(snap), flag, str(tmp_path / "missing" / "deeper" / dest)
                   if flag != "--nsys" else str(tmp_path / "s.json" / dest)])
        err = capsys.readouterr().err
        assert rc == 2, (flag, err)
        assert err.count("\n") == 1 and err.startswith("tuiprof: cannot write"), err


def test_ctrl_c_while_exporting_leaves_nothing(small_view, tmp_path, capsys, monkeypatch):
    """Ctrl-C (or SIGTERM) in the middle of an export: no partial file, one line, 128 + signal."""
    import signal

    from tuiprof import cli
    from tuiprof.export import nsys_sqlite

    snap = write_snapshot(small_view, tmp_path / "s.json")
    real = nsys_sqlite.fill_database

    def interrupted(con, view, window=None):
        real(con, view, window)
        raise cli.Interrupted(signal.SIGTERM)

    monkeypatch.setattr(nsys_sqlite, "fill_database", interrupted)
    rc = cli.main(["export", str(snap), "--sqlite", str(tmp_path / "x.sqlite")])
    err = capsys.readouterr().err
    assert rc == 128 + signal.SIGTERM and err == "tuiprof: SIGTERM: interrupted\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


def test_app_export_failure_is_shown_and_the_app_goes_on(small_view, tmp_path, monkeypatch):
    """``e`` onto a full disk: a one-line notification; the next ``e`` works."""
    import asyncio

    from tuiprof.ui.app import make_app, view_control

    app = make_app(view_control(small_view), export_dir=tmp_path, refresh_hz=0)
    real_fsync = os.fsync

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    async def main():
        async with app.run_test(size=(120, 40)) as pilot:
            monkeypatch.setattr(os, "fsync", fsync)
            await pilot.press("e")
            await app.workers.wait_for_complete()
            await pilot.pause()
            failed = app.last_message
            monkeypatch.setattr(os, "fsync", real_fsync)
            await pilot.press("e")
            await app.workers.wait_for_complete()
            await pilot.pause()
            return failed, app.last_message

    failed, ok = asyncio.run(main())
    assert failed.startswith("snapshot export failed: TuiprofError: cannot write"), failed
    assert failed.endswith("the disk is full") and "\n" not in failed
    assert ok.startswith("snapshot written: "), ok
    assert len(list(tmp_path.glob("tuiprof-*.json"))) == 1
    assert _leftovers(tmp_path) == []
