"""Every process of a profiled program (``a``), refreshed by the app's timer while shown.

One row per process the program started (pid, parent, what it runs, its GPU, its rank when it
joined a torch.distributed job, steps, tokens/s, kernels, how it ended); processes that do no
CUDA work and mark no steps are listed dim (``g`` skips them). Below, each torch.distributed
job among them gets the all-ranks comparison of ``--tp`` sessions (compute, communication and
idle per step, NCCL share, skew, the slowest rank), its ranks in rank order.
"""
from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ...text import printable
from ...store.rank_set import is_active, jobs, process_facts
from .. import adapters
from ..derive import header_numbers
from .all_ranks import SetScreen, _no_kernels, render_ranks


def _tok_s(view: Any) -> str:
    """The header's tokens/s of the process (decode, its mode now)."""
    try:
        tok_s = header_numbers(view, str(view.meta.get("mode") or "eager")).tok_s
    except Exception:
        return "–"
    return f"{tok_s:,.1f}" if tok_s else "–"


COLUMNS = (("#", "right", 0), ("host", "left", 0), ("pid", "right", 0), ("parent", "right", 100),
           ("process", "left", 0), ("state", "left", 100), ("GPU", "left", 120),
           ("rank", "right", 0), ("steps", "right", 0), ("tok/s", "right", 0),
           ("kernels", "right", 100))   # (title, justify, shown from this many columns)


def render_processes(rv: Any, selected: int, width: int = 200) -> Any:
    """The table of processes (one row each); narrow screens drop the parent, state, GPU and
    kernels columns."""
    hosts = any(process_facts(v).get("host") for v in rv.views)
    cols = [c for c in COLUMNS if width >= c[2] and (hosts or c[0] != "host")]
    t = Table(expand=False, show_edge=False, pad_edge=False)
    for head, just, _ in cols:
        t.add_column(head, justify=just, no_wrap=True)
    for i, v in enumerate(rv.views):
        p = process_facts(v)
        active = is_active(v)
        style = "bold" if i == selected else ("" if active else "dim")
        rank = v.meta.get("rank")
        world = v.meta.get("world_size")
        gpu = str(v.meta.get("device") or ("cuda" if v.meta.get("cuda") else "–"))
        cells = {"#": ("▶" if i == selected else "") + str(i), "pid": str(p.get("pid", "–")),
                 "host": printable(p.get("host") or "", 12 if width >= 100 else 6),
                 "parent": str(p.get("ppid", "–")),
                 "process": printable(p.get("name") or v.meta.get("model"),
                                      28 if width >= 100 else 20),
                 "state": printable(p.get("state", "running"), 8), "GPU": printable(gpu, 10),
                 "rank": f"{rank}/{world}" if isinstance(rank, int) else "–",
                 "steps": f"{int(v.counters.get('tokens', 0) or 0):,}", "tok/s": _tok_s(v),
                 "kernels": f"{int(v.counters.get('kernels', 0) or 0):,}"}
        t.add_row(*(cells[c[0]] for c in cols), style=style)
    return t


def hosts_line(rv: Any) -> str:
    """For a job whose ranks run on several hosts (a fleet): how well their clocks are
    aligned, from the round trips (each host's residual) and from the job itself (how far
    apart its ranks left ``init_process_group`` on the aligned clocks: a rendezvous, not a
    barrier, so an upper bound); "" otherwise."""
    hosts: dict = {}
    for v in rv.views:
        h = v.meta.get("host")
        if h is not None:
            hosts.setdefault(h, v.meta.get("clock_uncertainty_ns"))
    if len(hosts) < 2:
        return ""
    res = " / ".join(f"{printable(h, 12)} ± {u / 1e6:.3f} ms" if isinstance(u, int)
                     else f"{printable(h, 12)} unmeasured" for h, u in hosts.items())
    spread = rv.clock.barrier_spread_ns
    joined = (f"; its ranks joined the job {spread / 1e6:.1f} ms apart on the aligned clocks"
              if isinstance(spread, int) else "")
    return f"ranks on {len(hosts)} hosts, clocks aligned from round trips: {res}{joined}"


class ProcessesScreen(SetScreen):
    TITLE = "all processes"
    PARTS = ("procs-table", "procs-jobs")
    MEMBER = "process"

    def show(self, analysis: Any, views: Any, selected: int) -> None:
        """``analysis``: {job: (summary, findings)} from raw records (or None yet)."""
        parts = self.parts()
        if parts is None:
            return
        table, below = parts
        hosts = (views.meta or {}).get("hosts") or []
        where = f" on {len(hosts)} hosts" if hosts else ""
        head = Text(f"{views.world_size} processes{where} · g: next active process · dim: no "
                    f"CUDA work, no steps", "dim")
        notices = (views.meta or {}).get("notices") or []
        parts: list = [head]
        for h in hosts:   # each host: state, clock offset ± residual, traffic (or how lost)
            line = printable(h.get("line") or h.get("name"), 300)
            parts.append(Text(line, "yellow" if h.get("state") != "attached" else ""))
        parts.append(render_processes(views, selected, self.app.size.width))
        for line in notices[-4:]:
            parts.append(Text(printable(line, 300), "yellow"))
        table.update(Group(*parts))
        blocks: list = []
        analysis = analysis if isinstance(analysis, dict) else {}
        for key, rv in jobs(views):
            split, cross = analysis.get(key, (None, None))
            pick = next((r for r, v in enumerate(rv.views)
                         if process_facts(v).get("index") == selected), -1)
            blocks.append(Text(f"torch.distributed job {printable(key, 60)}: "
                               f"{rv.world_size} ranks", "bold"))
            blocks.append(render_ranks(adapters.ranks_summary(rv), split, pick, _no_kernels(rv)))
            line = hosts_line(rv)
            if line:
                blocks.append(Text(line, "dim"))
            if cross is None:
                cross, _ = adapters.rank_findings(rv)
            for f in cross or []:
                blocks.append(Text(f"● {f.title}", "bold"))
                blocks.append(Text(f"  {f.evidence}", "dim"))
        below.update(Group(*blocks) if blocks else Text(
            "no torch.distributed job among these processes", "dim"))
