"""Command line: ``tuiprof --model NAME`` opens the live app; subcommands do the rest.

Every command is one row of :data:`COMMANDS`: the module under ``tuiprof/cli/`` that adds its
arguments (``add_arguments(name, parser)``) and runs it (``run(name, args) -> exit code``).
Heavy modules (torch, textual) are imported only by the commands that need them, so
``tuiprof models`` and error messages are instant and never print a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from dataclasses import dataclass

from .. import __version__
from ..errors import TuiprofError
from .common import Interrupted, handle_signals, raise_interrupted, say

__all__ = ["COMMANDS", "Command", "Interrupted", "build_parser", "main", "parse_args",
           "split_program"]


@dataclass(frozen=True)
class Command:
    """A subcommand: ``tuiprof NAME``, served by the module ``tuiprof.cli.<module>``."""

    name: str
    module: str
    help: str


COMMANDS: tuple[Command, ...] = (
    Command("run", "run", "profile a model live (the default command), or a program of your "
                          "own: tuiprof run [options] -- python SCRIPT.py [ARGS...]"),
    Command("record", "run", "run headless and write a replayable recording"),
    Command("models", "files", "list the model registry"),
    Command("view", "files", "open a JSON snapshot read-only (no GPU needed)"),
    Command("replay", "files", "replay a recording through the live pipeline"),
    Command("export", "files", "export a snapshot to nsys-style reports, SQLite, trace"),
    Command("diff", "files", "compare two snapshots side by side"),
    Command("sweep", "sweep", "sweep models × sequence lengths, batches, TP degrees, or a "
                              "server's request rates (--serve)"),
    Command("serve", "serve", "serve a model with transformers' continuous batching under "
                              "generated load (--rate or --concurrency): per-request TTFT/ITL"),
    Command("ls", "sessions", "list the sessions: detached ones (tuiprof run --detach) and "
                              "live apps"),
    Command("attach", "sessions", "open the live app on a detached session (q detaches, the "
                                  "session goes on)"),
    Command("stop", "sessions", "end a detached session, write its snapshot and say where"),
)
SUBCOMMANDS = tuple(c.name for c in COMMANDS)


def _module(cmd: Command):
    return importlib.import_module(f"{__name__}.{cmd.module}")


def build_parser() -> argparse.ArgumentParser:
    """The full parser (subcommands); ``tuiprof --model X`` is ``tuiprof run --model X``."""
    p = argparse.ArgumentParser(prog="tuiprof", description="Live LLM inference profiler for the terminal.")
    p.add_argument("--version", action="version", version=f"tuiprof {__version__}")
    sub = p.add_subparsers(dest="command")
    for cmd in COMMANDS:
        _module(cmd).add_arguments(cmd.name, sub.add_parser(cmd.name, help=cmd.help))
    return p


def split_program(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """tuiprof's own arguments, and the program's command after the first ``--`` (or None)."""
    if "--" not in argv:
        return argv, None
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line as the commands get it (``args.program``: after ``--``; ``args.argv``:
    as given, for a detached session's keeper)."""
    given = list(argv)
    argv, program = split_program(given)
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]
    args = build_parser().parse_args(argv)
    args.program = program
    args.argv = given
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    # SIGTERM and SIGHUP end the command like Ctrl-C (one line, no traceback; exports are
    # atomic, so nothing is left half-written); a live or headless run handles them itself.
    old = handle_signals(raise_interrupted, (signal.SIGTERM, signal.SIGHUP))
    try:
        return _dispatch(args)
    except TuiprofError as exc:
        say("tuiprof: " + " ".join(str(exc).split()))  # always one line
        return exc.exit_code
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        say(f"tuiprof: {signal.Signals(signum).name}: interrupted")
        return 128 + signum
    except BrokenPipeError:
        # stdout closed by the reader (``tuiprof models | head``): nothing more to say; point
        # stdout at /dev/null so the interpreter's final flush does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _dispatch(args: argparse.Namespace) -> int:
    name = args.command
    if args.program is not None:
        if name != "run":
            raise TuiprofError(f"'tuiprof {name}' takes no program; profile one with "
                               f"tuiprof run [--headless --json OUT] -- python SCRIPT.py [ARGS...]")
        from .program import run  # noqa: PLC0415
        return run(args)
    cmd = next((c for c in COMMANDS if c.name == name), None)
    if cmd is None:
        raise TuiprofError(f"unknown command {name}")
    return _module(cmd).run(name, args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
