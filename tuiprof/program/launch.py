"""``-- python SCRIPT.py ARGS`` / ``-- python -m MODULE ARGS``: parse it, run it here.

The program runs in tuiprof's own interpreter, on the calling thread, with ``runpy``'s
semantics: its own ``sys.argv``, ``sys.path[0]`` (the script's directory, or the working
directory for ``-m``), ``__name__ == "__main__"``, the working directory and environment as
they are. That is what lets the collectors start before its first CUDA call. Only a Python
interpreter is accepted as the launcher: any name or path that looks like one (``python``,
``python3.12``, ``/usr/bin/python3``, ``sys.executable``); the interpreter named is not
started, so its version and packages are tuiprof's.
"""
from __future__ import annotations

import os
import re
import runpy
import shutil
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TuiprofError
from ..text import printable

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?[a-z]?(\.exe)?$")
IGNORED_OPTIONS = ("-u", "-B", "-E", "-s", "-q")   # meaningless or harmless here
TRACEBACK_LINES = 8


@dataclass(frozen=True)
class ProgramSpec:
    """What to run: ``kind`` is ``path`` or ``module`` (Python, run here) or ``native`` (any
    other executable, run as a child: ``target`` is its resolved path, ``launcher`` the word
    given)."""

    kind: str
    target: str
    args: tuple[str, ...] = ()
    launcher: str = "python"
    note: str = ""     # one line about the launcher (another interpreter was named)
    label: str = ""    # the display name when the command is not python (``torchrun x.py``)

    @property
    def name(self) -> str:
        """A short display name: the script's or binary's file name, or ``-m module``."""
        if self.label:
            return self.label
        if self.kind in ("path", "native"):
            return Path(self.target if self.kind == "path" else self.launcher).name
        return f"-m {self.target}"

    @property
    def argv(self) -> list[str]:
        """The command as given (for the snapshot's meta; paths are scrubbed there)."""
        if self.kind == "native":
            return [self.launcher, *self.args]
        flag = ["-m"] if self.kind == "module" else []
        return [Path(self.launcher).name, *flag, self.target, *self.args]


@dataclass
class ProgramResult:
    """How the program ended."""

    status: int                    # the exit status ``python`` (or a shell) would have returned
    how: str                       # exited | raised | interrupted | stopped | signaled | failed
                                   # | os._exit
    error: str = ""                # ``ValueError: bad input`` (one line) when it raised; the
                                   # signal's name (signaled) or why it could not start (failed)
    traceback: list[str] = field(default_factory=list)  # its last lines

    def line(self) -> str:
        """One line for the status line and the terminal."""
        if self.how == "raised":
            return f"the program raised {self.error} (exit status {self.status})"
        if self.how == "interrupted":
            return (f"the program was interrupted ({self.error or 'KeyboardInterrupt'}, exit "
                    f"status {self.status})")
        if self.how == "stopped":
            return f"the program was stopped by tuiprof (exit status {self.status})"
        if self.how == "os._exit":
            return f"the program ended its process with os._exit({self.status})"
        if self.how == "signaled":
            return f"the program was killed by {self.error} (exit status {self.status})"
        if self.how == "failed":
            return f"the program could not start: {self.error} (exit status {self.status})"
        return f"the program exited with status {self.status}"


class SessionStop(BaseException):
    """Raised in the program's thread to end it: a second Ctrl-C, SIGTERM or SIGHUP."""


def parse_program(argv: list[str]) -> ProgramSpec:
    """``["python", "x.py", ...]`` into a :class:`ProgramSpec`; a one-line
    :class:`TuiprofError` for anything tuiprof cannot run."""
    if not argv:
        raise TuiprofError("nothing to run after '--': tuiprof run -- python SCRIPT.py [ARGS...]")
    launcher, rest = argv[0], list(argv[1:])
    if Path(launcher).name == "torchrun":
        # torchrun is `python -m torch.distributed.run`: its agent runs here, its workers are
        # processes of the program (followed like any other)
        return _torchrun(launcher, rest)
    if not _is_python(launcher):
        return _native(launcher, rest)
    while rest and rest[0] in IGNORED_OPTIONS:
        rest.pop(0)
    if not rest:
        raise TuiprofError("no script after the interpreter: tuiprof run -- python SCRIPT.py "
                           "[ARGS...] (or -m MODULE)")
    first = rest.pop(0)
    note = _launcher_note(launcher)
    if first == "-c":  # the one code path that would exec() a string: a file is as easy
        raise TuiprofError("python -c is not supported under tuiprof run: put the code in a "
                           "file and give its path (or -m MODULE)")
    if first == "-m":
        if not rest:
            raise TuiprofError("python -m needs a module name")
        return ProgramSpec("module", rest[0], tuple(rest[1:]), launcher, note)
    if first.startswith("-") and first != "-":
        raise TuiprofError(f"python option {_shown(first)} is not supported under tuiprof run; "
                           f"give the script (or -m MODULE) right after the interpreter")
    path = Path(first)
    if not path.is_file():
        raise TuiprofError(f"no such Python script: {_shown(first)}")
    return ProgramSpec("path", first, tuple(rest), launcher, note)


def _torchrun(launcher: str, rest: list[str]) -> ProgramSpec:
    if not rest:
        raise TuiprofError("torchrun needs a script: tuiprof run -- torchrun [OPTIONS] SCRIPT.py "
                           "[ARGS...]")
    script = next((a for a in rest if a.endswith(".py")), "")
    label = f"torchrun {Path(script).name}" if script else "torchrun"
    return ProgramSpec("module", "torch.distributed.run", tuple(rest), launcher, label=label)


def _native(launcher: str, args: list[str]) -> ProgramSpec:
    """Any other executable: a native program, run as a child
    (``tuiprof.program.binary_child``)."""
    try:
        path = resolve(launcher)
    except ValueError as exc:
        raise TuiprofError(f"cannot run '{_shown(launcher)}': {exc}") from None
    return ProgramSpec("native", path, tuple(args), launcher)


def resolve(launcher: str) -> str:
    """The executable a command word names (a path, or a name on PATH), as an absolute path;
    raises ValueError with what is wrong."""
    path = launcher if os.sep in launcher else shutil.which(launcher)
    if path is None:
        raise ValueError("no such program (not a file here, not on PATH)")
    p = Path(path)
    if not p.exists():
        raise ValueError("no such file")
    if p.is_dir():
        raise ValueError("is a directory")
    if not os.access(p, os.X_OK):
        raise ValueError("is not executable (chmod +x it)")
    return str(p.resolve())


def _is_python(launcher: str) -> bool:
    if launcher == sys.executable:
        return True
    return bool(_PYTHON.match(Path(launcher).name))


def _launcher_note(launcher: str) -> str:
    """Say so when the interpreter named is not the one tuiprof runs in."""
    found = shutil.which(launcher) if os.sep not in launcher else launcher
    try:
        same = found is not None and os.path.samefile(found, sys.executable)
    except OSError:
        same = False
    if same or launcher in ("python", "python3"):
        return ""
    return (f"note: the program runs in tuiprof's interpreter ({sys.executable}, Python "
            f"{sys.version.split()[0]}), not {_shown(launcher)}")


def _shown(text: str) -> str:
    """A command-line word for a message: printable, bounded."""
    return printable(text, 80)


# ---------------------------------------------------------------------------- run
def run_program(spec: ProgramSpec) -> ProgramResult:
    """Run the program on this thread until it ends, however it ends (never raises, except
    :class:`SessionStop` is turned into a result too). Its traceback, if any, goes to its
    stderr as ``python`` would print it, without tuiprof's frames."""
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    try:
        if spec.kind == "path":
            script = os.path.abspath(spec.target)
            sys.argv = [spec.target, *spec.args]
            _set_path0(os.path.dirname(script))
            runpy.run_path(script, run_name="__main__")
        else:
            sys.argv = [spec.target, *spec.args]  # runpy puts the module's file in argv[0]
            _set_path0(os.getcwd())
            runpy.run_module(spec.target, run_name="__main__", alter_sys=True)
        return ProgramResult(0, "exited")
    except SystemExit as exc:
        return ProgramResult(_exit_status(exc.code), "exited")
    except KeyboardInterrupt as exc:
        tail = _print_traceback(exc)
        return ProgramResult(128 + signal.SIGINT, "interrupted", "KeyboardInterrupt", tail)
    except SessionStop:
        return ProgramResult(128 + signal.SIGINT, "stopped")
    except BaseException as exc:  # noqa: BLE001 - whatever the program raises is its result
        tail = _print_traceback(exc)
        return ProgramResult(1, "raised", _one_line(exc), tail)
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0


def _set_path0(entry: str) -> None:
    if sys.path:
        sys.path[0] = entry
    else:
        sys.path.append(entry)


def _exit_status(code: object) -> int:
    """What ``python`` returns for ``sys.exit(code)`` (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr, flush=True)
    except Exception:
        pass
    return 1


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= 200 else text[:199] + "…"


_OURS = (os.path.abspath(__file__), os.path.abspath(runpy.__file__))


def _ours(filename: str) -> bool:
    return filename.startswith("<frozen runpy") or os.path.abspath(filename) in _OURS


def _print_traceback(exc: BaseException) -> list[str]:
    """Print the program's traceback to its stderr; return its last lines."""
    tb = exc.__traceback__
    while tb is not None and _ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    text = "".join(lines)
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except Exception:
        pass
    return text.rstrip("\n").splitlines()[-TRACEBACK_LINES:]
