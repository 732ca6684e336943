"""The project reads the same on any machine: no path of one machine's layout in its code,
tests, docs or benches, and figures dated by commit, not by who made them when."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCOPE = ("tuiprof", "tests", "docs", "bench", "README.md")
# raw outputs captured on the machines that made them, kept as they were written
RAW = ("bench/results/",)
MACHINE = "/" + "work" + "/"          # spelled apart so that this file does not match itself


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *SCOPE], cwd=ROOT, check=True,
                             capture_output=True).stdout.decode()
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):      # not a git checkout: every file
        names = [str(p.relative_to(ROOT)) for s in SCOPE for p in
                 ([ROOT / s] if (ROOT / s).is_file() else (ROOT / s).rglob("*")) if p.is_file()]
    files = []
    for n in names:
        if n.startswith(RAW) or not (ROOT / n).is_file():
            continue
        data = (ROOT / n).read_bytes()
        if b"\0" in data[:8192]:                       # binary (recordings, images)
            continue
        files.append(ROOT / n)
    return files


def test_no_path_of_one_machine_is_written_into_the_project():
    files = tracked_text_files()
    assert len(files) > 100
    found = [f"{p.relative_to(ROOT)}:{i}" for p in files
             for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace")
                                      .splitlines(), 1) if MACHINE in line]
    assert not found, f"machine-local paths in: {', '.join(found[:20])}"


def test_results_are_dated_by_commit_not_by_session():
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    ordinal = (r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last|this"
               r"|\d+(st|nd|rd|th))")
    bad = [line[:120] for line in text.splitlines()
           if re.search(r"session's (last )?code|session’s code", line)
           or re.search(rf"\b{ordinal} session\b", line, re.IGNORECASE)]
    assert not bad, f"docs/results.md dates figures by session: {bad[:5]}"
