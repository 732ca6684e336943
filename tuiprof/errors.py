"""Errors that reach the user as one line that says what to do (text from files and programs
is made safe by :mod:`tuiprof.text`, the one sanitiser)."""
from __future__ import annotations

from .text import QUOTE_LIMIT, printable, printable_tree

MESSAGE_LIMIT = 600   # characters of a whole message


def safe_text(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``value`` as one printable line of at most ``limit`` characters (``…`` marks a cut):
    :func:`tuiprof.text.printable`, the one sanitiser. Use it for anything read from a file or
    printed by a program before it goes into a message, a status line or the screen."""
    return printable(value, limit)


def safe_tree(obj: object, limit: int = 4096) -> object:
    """``obj`` (decoded JSON) with every string and key made printable (each at most ``limit``
    characters): a document read from a file may carry escape sequences in any free-form
    field that a pane later shows."""
    return printable_tree(obj, limit)


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
