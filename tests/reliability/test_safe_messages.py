"""Text from files reaches a message escaped and capped, in one place (``tuiprof.errors``).

The fuzz tests found it by chance (a record that was the string "\\n", drawn only when another
test had imported a module holding that constant); these pin the cases down."""
from __future__ import annotations

import gzip
import json

import pytest

from tuiprof.cli import main
from tuiprof.collect.replay import validate_recording
from tuiprof.errors import MESSAGE_LIMIT, TuiprofError, one_line, safe_text
from tuiprof.export.snapshot import validate_snapshot

HOSTILE = ["\n", "a\r\nb", "\x1b[2J\x1b[31mred", "\u2028", "\x85", "\u202eevil", "\ud800", "\t"]


@pytest.mark.parametrize("text", HOSTILE)
def test_safe_text_escapes_and_caps(text):
    out = safe_text(text * 40, 30)
    assert out.isprintable() and len(out) <= 30
    assert safe_text("plain ünïcode", 30) == "plain ünïcode"


@pytest.mark.parametrize("record", HOSTILE + [["K", "\n"], ["A", "\x1b[2J"]])
def test_a_malformed_record_is_quoted_on_one_printable_line(record):
    with pytest.raises(TuiprofError) as info:
        validate_recording({"meta": {}, "marks": [], "records": [record]}, "rec.json.gz")
    msg = str(info.value)
    assert msg.startswith("rec.json.gz: malformed record") and msg.isprintable(), repr(msg)


def test_every_tuiprof_error_is_one_capped_line():
    msg = str(TuiprofError("first\nsecond " + "x" * 5000))
    assert msg.isprintable() and len(msg) <= MESSAGE_LIMIT and msg.startswith("first\\x0asecond")
    assert one_line(ValueError("\x1b[31mboom\x1b[0m\ntraceback line")) == "\\x1b[31mboom\\x1b[0m"


def test_snapshot_format_with_control_characters():
    with pytest.raises(TuiprofError) as info:
        validate_snapshot({"format": "\x1b]0;owned\x07\n", "schema_version": 1}, "s.json")
    assert str(info.value).isprintable()


def test_cli_prints_one_line_for_a_hostile_recording(tmp_path, capsys):
    p = tmp_path / "r.json.gz"
    p.write_bytes(gzip.compress(json.dumps(
        {"meta": {}, "marks": [], "records": ["\n\x1b[2J" * 50]}).encode()))
    assert main(["replay", str(p), "--headless"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("tuiprof: ")]
    assert len(lines) == 1 and "\x1b" not in err and "malformed record" in lines[0], err


def test_a_recordings_meta_reaches_the_store_printable():
    rec = validate_recording({"meta": {"model": "m\x1b[2J\x1b]0;owned\x07", "gpu": "H\u202e1"},
                              "marks": [], "records": []}, "rec.json.gz")
    assert rec.meta["model"].isprintable() and rec.meta["model"].startswith("m\\x1b[2J")
    assert rec.meta["gpu"].isprintable()


def test_a_collectors_message_is_stored_printable():
    from tuiprof.store import SessionStore

    st = SessionStore()
    st.set_collector("cupti", False, "no CUPTI: \x1b[2Jlibcuda.so.1\n" + "x" * 1000)
    msg = st.view().collectors["cupti"]["message"]
    assert msg.isprintable() and len(msg) <= 400 and msg.startswith("no CUPTI: \\x1b[2J")
