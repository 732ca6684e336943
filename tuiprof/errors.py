"""Errors that reach the user as one line that says what to do."""


class TuiprofError(Exception):
    """A failure the user can act on; the CLI prints ``tuiprof: <message>`` and exits 2."""

    exit_code = 2
