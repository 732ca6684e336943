"""Every pane of the main screen, one row each: the wide grid, the number keys, the tab bar and
the help screen are all built from :data:`PANES`, so a new pane is a widget module and one row
here (docs/extending.md).

Wide layout (from about 150×40): two columns, rows filled in table order. A ``wide`` pane takes
a row of its own; two narrow panes share a row, and a narrow pane left alone spans both
columns. A row is as tall as the tallest ``height`` of its panes ("12": lines, "1fr": a share
of what is left). Narrow layout: one pane at a time, switched with tab or its number key.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class PaneSpec:
    """One pane of the main screen."""

    key: str        # its number key, "1".."9" (also its place in tab order)
    id: str         # the widget's id (and CSS id)
    widget: str     # "module:Class" under tuiprof.ui.widgets
    tab: str        # the tab bar's and the key's short name
    help: str       # one line for the help screen
    wide: bool = False   # a row of its own in the wide grid
    height: str = "1fr"  # its row's height in the wide grid
    # in the wide grid only once the session has its data (the pane's ``has_data(view)``):
    # a server's requests pane stays out of the way of a session without requests; its key
    # shows it in the narrow layout whatever
    optional: bool = False


PANES: tuple[PaneSpec, ...] = (   # grid order
    PaneSpec("1", "latency", "latency_pane:LatencyPane", "latency",
             "host and GPU ms of recent steps (prefill: yellow line; mode switch: magenta)",
             height="12"),
    PaneSpec("3", "util", "util_pane:UtilPane", "util",
             "NVML/GPM samples beside the kernel-busy share of each step", height="12"),
    PaneSpec("2", "kernels", "kernels_pane:KernelsPane", "kernels",
             "top kernels of one mode and phase (% of that phase's GPU time)", wide=True),
    PaneSpec("4", "allocs", "allocs_pane:AllocPane", "allocs",
             "cudaMalloc/cudaFree and the PyTorch caching allocator", height="11"),
    PaneSpec("5", "findings", "findings_pane:FindingsPane", "findings",
             "ranked findings from the analysis", height="11"),
    PaneSpec("6", "host", "host_pane:HostPane", "host",
             "the session process's CPU use and memory, and tuiprof's own CPU time",
             height="5"),
    PaneSpec("7", "requests", "requests_pane:RequestsPane", "requests",
             "a server's requests: TTFT/ITL/queue/e2e p50/p90/p99, req/s, tokens/s, the ones "
             "in flight (enter: one request's story)", height="12", optional=True),
)

FIRST = "2"   # the pane shown first in the narrow layout: the kernels


def by_key() -> list[PaneSpec]:
    """The panes in number-key (tab) order."""
    return sorted(PANES, key=lambda p: int(p.key))


def keys() -> list[str]:
    return [p.key for p in by_key()]


def widget_class(spec: PaneSpec):
    module, cls = spec.widget.split(":")
    return getattr(importlib.import_module(f"{__package__}.widgets.{module}"), cls)


def make(spec: PaneSpec):
    """The pane widget of ``spec``, with its key and titles from the table."""
    pane = widget_class(spec)(id=spec.id)
    pane.PANE_KEY = spec.key
    pane.TAB_TITLE = spec.tab
    return pane


def grid_rows(panes: tuple[PaneSpec, ...] = PANES) -> list[tuple[PaneSpec, ...]]:
    """The wide grid's rows: a wide pane alone, narrow panes two by two."""
    rows: list[tuple[PaneSpec, ...]] = []
    pending: list[PaneSpec] = []
    for p in panes:
        if p.wide:
            if pending:
                rows.append(tuple(pending))
                pending = []
            rows.append((p,))
        else:
            pending.append(p)
            if len(pending) == 2:
                rows.append(tuple(pending))
                pending = []
    if pending:
        rows.append(tuple(pending))
    return rows


def _height(specs: tuple[PaneSpec, ...]) -> str:
    """The row's height: the largest fixed height of its panes, or 1fr if any is flexible."""
    hs = [p.height for p in specs]
    if any(h.endswith("fr") for h in hs):
        return "1fr"
    return str(max(int(h) for h in hs))


def grid_layout(panes: tuple[PaneSpec, ...] = PANES) -> tuple[int, str, set[str]]:
    """(rows, the ``grid-rows`` value, ids of the panes that span both columns) of the wide
    grid holding ``panes`` (in table order)."""
    rows = grid_rows(panes)
    span = {r[0].id for r in rows if len(r) == 1}
    return len(rows), " ".join(_height(r) for r in rows), span
