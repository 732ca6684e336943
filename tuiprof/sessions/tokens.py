"""A detached session's TCP listener token (``--listen``, ``--token-file``): read from a file
only its user can read and checked to be hard to guess, or made (256 random bits, 0600). The
CLI checks a given file in the terminal before the session starts; the session's holder reads
it (docs/remote.md, the threat model)."""
from __future__ import annotations

import collections
import math
import os
import secrets
import stat
from pathlib import Path

from ..errors import TuiprofError
from ..text import printable


TOKEN_BITS = 80          # the least estimated entropy of a listener's token
TOKEN_CHARS = 20         # and the fewest characters (a new token: 43, 256 random bits)
MAKE_TOKEN = ("remove it and tuiprof writes a new one (0600), or: python3 -c 'import secrets; "
              "print(secrets.token_urlsafe(32))' > FILE && chmod 600 FILE")


def token_weakness(token: str) -> str | None:
    """Why ``token`` is too easy to guess (None: it is not, as far as can be told): too short;
    too few bits by its characters' frequencies (``xxxx…``, ``password123…``); a run of one
    step (``abcdef…``, ``1212…``); one class of characters only (a phrase of lower-case
    words)."""
    n = len(token)
    if n < TOKEN_CHARS:
        return f"{n} characters (at least {TOKEN_CHARS})"
    counts = collections.Counter(token)
    bits = -sum(c * math.log2(c / n) for c in counts.values())
    if bits < TOKEN_BITS:
        return f"about {max(bits, 0.0):.0f} bits of entropy by its characters (at least {TOKEN_BITS})"
    steps = collections.Counter(ord(b) - ord(a) for a, b in zip(token, token[1:]))
    if steps.most_common(1)[0][1] * 3 > n - 1:
        return "a repeating sequence of characters"
    classes = sum(any(f(ch) for ch in token) for f in (
        str.islower, str.isupper, str.isdigit, lambda ch: not ch.isalnum() and not ch.isspace()))
    if classes < 2:
        return "one class of characters only"
    return None


def read_token_file(path: Path, flag: str = "--token-file") -> str:
    """A listener's token from ``path``: a regular file owned by this user that nobody else
    may read or write, holding a token hard to guess; anything else is refused in one line
    (another local user who could read it could stop or read the session)."""
    where = f"{flag} {printable(path, 200)}"
    try:
        st = os.stat(path)
    except OSError as exc:
        raise TuiprofError(f"{where}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise TuiprofError(f"{where}: not a regular file; {MAKE_TOKEN}")
    if st.st_uid != os.geteuid():
        raise TuiprofError(f"{where}: owned by uid {st.st_uid}, not by you (uid "
                           f"{os.geteuid()}); {MAKE_TOKEN}")
    if st.st_mode & 0o077:
        raise TuiprofError(f"{where}: group or others may read or write it (mode "
                           f"{stat.S_IMODE(st.st_mode):04o}); chmod 600 it, or {MAKE_TOKEN}")
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TuiprofError(f"{where}: cannot read it: {getattr(exc, 'strerror', None) or exc}") \
            from None
    weak = token_weakness(token)
    if weak:
        raise TuiprofError(f"{where}: the token is too easy to guess: {weak}; {MAKE_TOKEN}")
    return token


def new_token_file(path: Path) -> str:
    """A new token (256 random bits) in a new file ``path``, 0600; never over an existing one."""
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise TuiprofError(f"--token-file {printable(path, 200)}: cannot create it: "
                           f"{exc.strerror or exc}") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


def listen_token(token_file: str | None, directory: Path) -> str:
    """The token of a TCP listener: from ``token_file`` when it exists (checked: a file only
    this user can read, a token hard to guess), else a new one written there (or in the
    session's directory), 0600."""
    path = Path(token_file) if token_file else directory / "token"
    if os.path.lexists(path):
        return read_token_file(path)
    return new_token_file(path)


__all__ = ["TOKEN_BITS", "TOKEN_CHARS", "MAKE_TOKEN", "token_weakness", "read_token_file",
           "new_token_file", "listen_token"]
