"""Errors that reach the user as one line that says what to do, and the one place where text
from files and programs is made safe to put in such a line."""
from __future__ import annotations

QUOTE_LIMIT = 60      # characters of one quoted value (a record, a key, a file's line)
MESSAGE_LIMIT = 600   # characters of a whole message


def _escape(c: str) -> str:
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def safe_text(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``value`` as one printable line: control characters escaped (``\\x0a``), at most
    ``limit`` characters (``…`` marks a cut). Use it for anything read from a file or printed by
    a program before it goes into a message, a status line or the screen."""
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:  # a hostile __str__
        text = f"<{type(value).__name__}>"
    if len(text) > limit * 4:  # escaping only grows the text: cut the bulk first
        text = text[: limit * 4]
    if not text.isprintable():  # control characters, line separators, bidi overrides,
        # lone surrogates (a JSON "\\ud800" escape read back): each breaks a line or a terminal
        text = "".join(c if c.isprintable() else _escape(c) for c in text)
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def safe_tree(obj: object, limit: int = 4096, depth: int = 0) -> object:
    """``obj`` (decoded JSON) with every string and key made printable by :func:`safe_text`
    (each at most ``limit`` characters): a document read from a file may carry escape
    sequences in any free-form field that a pane later shows."""
    if isinstance(obj, str):
        return safe_text(obj, limit)
    if depth > 64:  # the loaders cap nesting long before this
        return None
    if isinstance(obj, dict):
        return {safe_text(k, limit) if isinstance(k, str) else k: safe_tree(v, limit, depth + 1)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [safe_tree(v, limit, depth + 1) for v in obj]
    return obj


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as one short, safe status-bar line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return exc.__class__.__name__
    # "Validation error for field 'x':" says nothing without the line that follows it
    text = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]
    return safe_text(text, limit)


class TuiprofError(Exception):
    """A failure the user can act on; the CLI prints ``tuiprof: <message>`` and exits 2.

    The message is made safe here (see :func:`safe_text`), whatever was interpolated into it:
    a message is always one line of at most ``MESSAGE_LIMIT`` characters."""

    exit_code = 2

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(safe_text(message, MESSAGE_LIMIT), *args)
