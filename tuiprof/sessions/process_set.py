"""The processes of one session as a UI reads them: one entry per process (index 0: the session
process), each mirrored by a :class:`~tuiprof.sessions.client.RemoteControl`, served to the
panes as one :class:`~tuiprof.control.SessionControl` (a process picked, or all of them). The
live app's holder (:mod:`tuiprof.sessions.holder`), a UI attached to a keeper
(:mod:`tuiprof.sessions.attached`) and a fleet of hosts (:mod:`tuiprof.sessions.fleet`) are
sets of processes."""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable

from ..analysis.requests import ENGINE_SOURCES, join_processes
from ..control import SessionControl, SourceStatus
from ..store import SessionStore
from ..store.rank_set import PROCESSES, RanksView, cycle_active, is_active
from .client import RemoteControl


MAX_PROCESSES = 256        # processes kept; quiet ones that ended go first past this


@dataclasses.dataclass
class ProcessEntry:
    """One process of the session."""

    index: int
    pid: int | None
    ppid: int | None = None
    argv: list = dataclasses.field(default_factory=list)
    name: str = "python"
    main: bool = False
    started_ns: int = 0
    forked_from: int | None = None
    socket: str | None = None
    ctl: RemoteControl | None = None
    state: str = "running"          # running | ended | died | orphan
    line: str = ""                  # how it ended (one line)
    note: str = ""                  # e.g. why it is not profiled
    exit_status: int | None = None

    def facts(self) -> dict:
        """What a snapshot and ``procs`` say about it (plain data)."""
        return {"index": self.index, "pid": self.pid, "ppid": self.ppid, "argv": list(self.argv),
                "name": self.name, "main": self.main, "forked_from": self.forked_from,
                "state": self.state, "line": self.line, "note": self.note,
                "exit_status": self.exit_status, "serving": self.socket is not None}

    @property
    def label(self) -> str:
        return f"pid {self.pid} ({self.name})"


def _empty_view(meta: dict) -> Any:
    store = SessionStore(ring_tokens=1, series_len=1, meta=meta)
    return store.view(raw=False)


class _Quiet:
    """The store of a process that serves none (it never imported torch): empty, named."""

    def __init__(self, entry: ProcessEntry) -> None:
        self.entry = entry

    @property
    def meta(self) -> dict:
        return {"model": self.entry.name, "source": "program",
                "process": self.entry.facts()}

    def view(self, raw: bool = True, raw_tokens: int | None = None, batch: Any = None) -> Any:
        return _empty_view(self.meta)

    def reset(self) -> None:
        pass


class _Labelled:
    """A process's store whose views say which process they are (the header's label); an
    engine process's requests joined with the API process's (``front``: its requests)."""

    def __init__(self, inner: Any, entry: ProcessEntry, count: int,
                 front: Callable[[], Any] | None = None) -> None:
        self.inner, self.entry, self.count, self.front = inner, entry, count, front

    @property
    def meta(self) -> dict:
        return self.inner.meta

    def view(self, raw: bool = True, raw_tokens: int | None = None, batch: Any = None) -> Any:
        v = self.inner.view(raw, raw_tokens, batch=batch)
        proc = dict(v.meta.get("process") or {})
        proc.update(self.entry.facts(), count=self.count)
        v.meta["process"] = proc
        if self.front is not None and v.requests and any(
                k in ENGINE_SOURCES for k in v.requests.sources):
            try:
                v = join_processes([_Front(self.front()), v])[1]
            except Exception:   # the API process's mirror is gone: the engine's own record
                pass
        return v

    def reset(self) -> None:
        self.inner.reset()


@dataclasses.dataclass
class _Front:
    requests: Any


class ProcessSet(SessionControl):
    """Every process of a session (a RankSet whose ranks are processes). Panes show one
    (``selected``, set by the app); ``g`` cycles the active ones (:meth:`cycle`)."""

    detaches = False            # q leaves the session running (an attached UI)

    def __init__(self) -> None:
        self._entries: tuple[ProcessEntry, ...] = ()
        self._lock = threading.RLock()
        self.selected = 0
        self.notices: list[tuple[float, str]] = []   # (time.monotonic(), one line), bounded
        self.dropped = 0
        self._main_msg = ("", 0.0)
        self.launcher = PROCESSES

    # ------------------------------------------------------------------ entries
    @property
    def entries(self) -> tuple[ProcessEntry, ...]:
        return self._entries

    def _add(self, entry: ProcessEntry) -> None:
        with self._lock:
            entries = list(self._entries)
            if len(entries) >= MAX_PROCESSES:
                gone = next((e for e in entries[1:] if e.state != "running" and (
                    e.ctl is None or not is_active(e.ctl.view(raw=False)))), None)
                gone = gone or next((e for e in entries[1:] if e.state != "running"), None)
                if gone is not None:
                    entries.remove(gone)
                    self.dropped += 1
            entries.append(entry)
            self._entries = tuple(entries)

    def entry(self, index: Any) -> ProcessEntry | None:
        return next((e for e in self._entries if e.index == index), None)

    def notice(self, line: str) -> None:
        with self._lock:
            self.notices.append((time.monotonic(), line))
            del self.notices[:-64]

    # ------------------------------------------------------------------ RankSet
    @property
    def world_size(self) -> int:
        return len(self._entries)

    def _store_of(self, e: ProcessEntry) -> Any:
        return e.ctl.store if e.ctl is not None else _Quiet(e)

    def rank_store(self, rank: int) -> Any:
        entries = self._entries
        i = min(rank, len(entries) - 1)
        main = entries[0]
        front = (lambda: self._store_of(main).view(raw=False).requests) if i > 0 else None
        return _Labelled(self._store_of(entries[i]), entries[i], len(entries), front)

    def rank_status(self, rank: int) -> SourceStatus:
        e = self._entries[min(rank, len(self._entries) - 1)]
        return e.ctl.status if e.ctl is not None else SourceStatus(state="quiet")

    def cycle(self, current: int, step: int = 1) -> int:
        """The next process that does GPU work or marks steps (``g``); all of them when
        none does yet."""
        return cycle_active(self.views(raw=False).views, current, step)

    def views(self, raw: bool = False, raw_tokens: int | None = None,
              pull: bool = True) -> RanksView:
        """Every process's view (``meta["process"]`` says which); ``raw=True`` waits for
        each one's records (worker threads); ``pull=False``: the copies held here as they are,
        asking no process (one that is stopped or stuck cannot hold it back)."""
        entries = self._entries
        views: list = [None] * len(entries)

        def one(i: int) -> None:
            e = entries[i]
            try:
                v = ((e.ctl.view(raw, raw_tokens) if pull else e.ctl.view(raw, raw_tokens,
                                                                           wait=False))
                     if e.ctl is not None else _empty_view(_Quiet(e).meta))
            except Exception:
                v = _empty_view(_Quiet(e).meta)
            proc = dict(v.meta.get("process") or {})
            proc.update(e.facts(), count=len(entries))
            v.meta["process"] = proc
            views[i] = v

        if raw and pull and len(entries) > 1:
            threads = [threading.Thread(target=one, args=(i,), daemon=True)
                       for i in range(len(entries))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for i in range(len(entries)):
                one(i)
        return RanksView(tuple(join_processes(views)), self.world_meta())

    def world_meta(self) -> dict:
        lines = [line for _, line in self.notices]
        return {"world_size": len(self._entries), "launcher": self.launcher,
                "failure": None, "processes_dropped": self.dropped, "notices": lines[-16:]}

    def export_view(self, raw_tokens: int | None = None) -> Any:
        """What a snapshot holds: every process (the multi-rank format) when there are
        several, else the one process's view as for a single session."""
        if len(self._entries) > 1:
            return self.views(raw=True, raw_tokens=raw_tokens)
        return self.store.view(raw=True)

    # ------------------------------------------------------------------ status
    @property
    def main_ctl(self) -> RemoteControl | None:
        entries = self._entries
        return entries[0].ctl if entries else None

    @property
    def store(self) -> Any:  # type: ignore[override]
        entries = self._entries
        return self._store_of(entries[0]) if entries else _Quiet(ProcessEntry(0, None))

    @property
    def status(self) -> SourceStatus:  # type: ignore[override]
        main = self.main_ctl
        st = main.status if main is not None else SourceStatus(state="loading", live=True)
        return self._with_notice(dataclasses.replace(st, extra=dict(st.extra)))

    def _with_notice(self, st: SourceStatus) -> SourceStatus:
        """``st`` (a copy) with the latest notice as its message when that came after the
        main process's message last changed."""
        if st.message != self._main_msg[0]:
            self._main_msg = (st.message, time.monotonic())
        if self.notices:
            at, line = self.notices[-1]
            if at >= self._main_msg[1]:
                st.message = line
        return st

    @status.setter
    def status(self, value: SourceStatus) -> None:
        pass   # the main process's status is the session's

    # ------------------------------------------------------------------ keys
    def _sel(self) -> RemoteControl | None:
        entries = self._entries
        if not entries:
            return None
        e = entries[min(self.selected, len(entries) - 1)]
        return e.ctl

    def toggle_mode(self) -> str:
        c = self._sel()
        return c.toggle_mode() if c is not None else "this process serves no session"

    def change_batch(self, up: bool) -> str:
        c = self._sel()
        return c.change_batch(up) if c is not None else "this process serves no session"

    def toggle_pause(self) -> str:
        c = self._sel()
        if c is None:
            return "this process serves no session (it never imported torch)"
        msg = c.toggle_pause()
        return msg if self.selected == 0 else f"{msg} (pid {c.pid})"

    def reset(self) -> str:
        for e in self._entries:
            if e.ctl is not None and e.state == "running":
                e.ctl.reset()
        return "statistics reset (every process)"

    def has_output(self) -> bool:
        main = self.main_ctl
        return main.has_output() if main is not None else False

    def disabled_actions(self) -> dict[str, str]:
        main = self.main_ctl
        return main.disabled_actions() if main is not None else {}

    def interrupt(self) -> str | None:
        main = self.main_ctl
        return main.interrupt() if main is not None else None

    @property
    def busy(self) -> bool:
        main = self.main_ctl
        return bool(main is not None and main.busy)

    @property
    def pid(self) -> int | None:
        main = self.main_ctl
        return main.pid if main is not None else None

    def totals(self) -> dict:
        """Steps and requests over every process (``tuiprof ls``)."""
        steps = requests = 0
        for e in self._entries:
            if e.ctl is None:
                continue
            v = e.ctl.view(raw=False)
            steps += int(v.counters.get("tokens", 0) or 0)
            reqs = getattr(v, "requests", None)    # a server's requests: those that arrived
            requests += int(reqs.counts.get("arrived", 0) if reqs is not None else 0)
        return {"steps": steps, "requests": requests}


def _quiet(fn: Callable) -> Callable:
    def run(*a: Any, **kw: Any) -> None:
        try:
            fn(*a, **kw)
        except Exception:
            pass
    return run


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
