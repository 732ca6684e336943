"""Every export, one row each: the ``tuiprof export`` flags, the app's keys and the UI's
writer all read :data:`EXPORTS`, so a new export is a module with a writer and one row here
(docs/extending.md).

A writer is ``write(view, path)`` over a :class:`~tuiprof.store.StoreView` or a
:class:`~tuiprof.store.rank_set.RanksView` (every rank); it writes atomically (creating a directory export's
directory) and returns the path it wrote, or the list of files for a directory export. Modules load on first use, so
importing this table costs nothing.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Export:
    """One export format."""

    name: str                 # its id: ``tuiprof.ui`` asks for it by name
    writer: str               # "module:function" under tuiprof.export
    target: str               # "file" or "dir": what the path names
    suffix: str               # the app's file name suffix ("" for a directory)
    help: str                 # the CLI flag's and the help screen's text
    flag: str | None = None   # ``tuiprof export SNAPSHOT --flag PATH`` (None: not a flag)
    key: str | None = None    # the app's key (None: CLI only)
    label: str = ""           # the footer's word for the key
    prefix: str = "tuiprof"   # the app's file name prefix


EXPORTS: tuple[Export, ...] = (
    Export("snapshot", "snapshot:write_snapshot", "file", ".json",
           "a JSON snapshot of the session (reopen with `tuiprof view`)", key="e",
           label="export"),
    Export("nsys", "nsys_reports:write_nsys_reports", "dir", "",
           "nsys stats-style CSVs and console tables", flag="--nsys", key="n", label="nsys",
           prefix="tuiprof-nsys"),
    Export("sqlite", "nsys_sqlite:write_nsys_sqlite", "file", ".sqlite",
           "an Nsight Systems-schema .sqlite", flag="--sqlite"),
    Export("trace", "trace:write_trace", "file", ".trace.json",
           "a Chrome/Perfetto trace JSON", flag="--trace"),
    Export("steps_csv", "steps_csv:write_steps_csv", "file", ".steps.csv",
           "every step as a CSV row (phase, mode, batch, host and GPU ms, traced kernels)",
           flag="--steps-csv"),
)


def get(name: str) -> Export:
    for e in EXPORTS:
        if e.name == name:
            return e
    raise KeyError(f"no export named {name!r}")


def with_flags() -> tuple[Export, ...]:
    """The exports ``tuiprof export`` offers, in table order."""
    return tuple(e for e in EXPORTS if e.flag)


def with_keys() -> tuple[Export, ...]:
    """The exports the app has a key for, in table order."""
    return tuple(e for e in EXPORTS if e.key)


def writer(name: str):
    module, fn = get(name).writer.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), fn)


def write(name: str, view: Any, path: str | Path) -> Any:
    """Write export ``name`` of ``view`` at ``path`` (a directory export creates it, with a
    one-line error when it cannot)."""
    return writer(name)(view, Path(path))
