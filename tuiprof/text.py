"""The one sanitiser for untrusted text: every string that came from outside tuiprof (kernel,
NVTX, API, module, process and model names, a program's output, paths, a snapshot's fields)
passes through here before it reaches a terminal, stdout, a text report or a CSV cell.

* :func:`printable`: one line a terminal shows as it is: control and escape characters
  (C0, C1, ``\\x1b``, line and paragraph separators), bidi overrides and isolates, and lone
  surrogates written visibly (``\\x1b``, ``\\u202e``), optionally capped (``…``).
* :func:`markup`: :func:`printable`, then escaped for Rich and Textual markup (``\\[``), for the
  few places that build markup strings; a widget handed a ``rich.text.Text`` needs no escape.
* :func:`csv_cell`: :func:`printable`, and a cell that a spreadsheet would read as a formula
  (first character ``=``, ``+``, ``-``, ``@``, tab or carriage return) prefixed with ``'``
  (OWASP's advice against CSV injection).
* :func:`csv_text`: rows written through the ``csv`` module (a quote inside a cell doubled, a
  cell with a comma quoted), every text cell :func:`csv_cell` first: what a reader parses back
  is the cell as written, so a name cannot close its cell and open a formula in the next one.
* :func:`output_line`: a line a program printed: its colour escapes removed (they are the
  program's formatting, not text), a ``\\r`` redraw reduced to its last state, the home
  directory written ``~``, then :func:`printable`.

Names stay exact where they are data (JSON snapshots and traces, SQLite): only what is shown
or printed is sanitised. Nothing here imports more than the standard library's ``re``, ``csv``
and ``io``.
"""
from __future__ import annotations

import csv
import io
import os
import re

QUOTE_LIMIT = 60      # characters of one quoted value (a record, a key, a file's line)
OUTPUT_LIMIT = 400    # characters kept of one line a program printed

# Characters a terminal or a reader must not get as they are, beyond str.isprintable():
# bidi embeddings/overrides/isolates and marks are "printable" format characters that reorder
# the text around them (a name that reads backwards, "Trojan Source").
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_BIDI_SET = frozenset(_BIDI)
_FORMULA = ("=", "+", "-", "@", "\t", "\r")
_MARKUP = re.compile(r"(\\*)\[")
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _escape(c: str) -> str:
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def _safe(c: str) -> bool:
    return c.isprintable() and c not in _BIDI_SET


def printable(value: object, limit: int | None = None) -> str:
    """``value`` as one line a terminal shows as it is (see the module's docstring), at most
    ``limit`` characters (``…`` marks a cut; None: no cap)."""
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:  # a hostile __str__
        text = f"<{type(value).__name__}>"
    if limit is not None and len(text) > limit * 4:  # escaping only grows it: cut the bulk
        text = text[: limit * 4]
    if not text.isprintable() or any(c in _BIDI_SET for c in text):
        text = "".join(c if _safe(c) else _escape(c) for c in text)
    if limit is None or len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + "…"


def markup(value: object, limit: int | None = None) -> str:
    """:func:`printable`, escaped for Rich/Textual markup: ``[tag]`` is shown, not applied."""
    return _MARKUP.sub(lambda m: m.group(1) * 2 + "\\[", printable(value, limit))


def csv_cell(value: object) -> str:
    """A text cell for a CSV file: :func:`printable`, and never read as a formula."""
    text = printable(value)
    return "'" + text if text.startswith(_FORMULA) else text


_NUMBER = re.compile(r"-?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def csv_value(value: object) -> object:
    """One cell of :func:`csv_text`: None empty, a number as it is, a string that reads as a
    number (``-1.5``: a spreadsheet takes it as one, never as a formula) as it is, any other
    text :func:`csv_cell`."""
    if value is None:
        return ""
    if isinstance(value, (bool, int, float)):
        return value
    text = value if isinstance(value, str) else printable(value)
    if _NUMBER.fullmatch(text):
        return text
    return csv_cell(text)


def csv_text(rows, header=None) -> str:
    """CSV text (``\\n`` line ends) of ``rows`` (sequences of cells), ``header`` first: written
    by the ``csv`` module with minimal quoting, each cell :func:`csv_value`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    if header is not None:
        w.writerow([csv_value(c) for c in header])
    for row in rows:
        w.writerow([csv_value(c) for c in row])
    return buf.getvalue()


def output_line(text: str, home: str | None = None, limit: int = OUTPUT_LIMIT) -> str:
    """One line a program printed, made safe for a screen and a shared snapshot: terminal
    escapes removed, a carriage-return redraw reduced to its last state, the home directory
    written ``~``, any control character left shown visibly, at most ``limit`` characters."""
    text = _ANSI.sub("", text)
    if "\r" in text:
        parts = [p for p in text.split("\r") if p]
        text = parts[-1] if parts else ""
    text = _CONTROL.sub("", text.replace("\t", "    "))
    home = os.path.expanduser("~") if home is None else home
    if home and home not in ("/", "~"):
        text = text.replace(home, "~")
    return printable(text, limit)


def printable_tree(obj: object, limit: int = 4096, depth: int = 0) -> object:
    """``obj`` (decoded JSON) with every string and key made :func:`printable` (each at most
    ``limit`` characters)."""
    if isinstance(obj, str):
        return printable(obj, limit)
    if depth > 64:  # the loaders cap nesting long before this
        return None
    if isinstance(obj, dict):
        return {printable(k, limit) if isinstance(k, str) else k: printable_tree(v, limit, depth + 1)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [printable_tree(v, limit, depth + 1) for v in obj]
    return obj


def has_hostile(text: str) -> bool:
    """Whether ``text`` holds a character :func:`printable` would escape."""
    return not text.isprintable() or any(c in _BIDI_SET for c in text)
