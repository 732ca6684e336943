"""The tuiprof Textual app.

Data flow (docs/ui.md#refresh-model-and-cost): the app never receives data from a thread
(widgets are not thread-safe, and a thread posting per record would flood the event loop). One timer
(``refresh_hz``, default 4 Hz; 0 = no timer, for tests) pulls an immutable ``StoreView`` from
``control.store.view()`` and hands it to the visible panes inside ``batch_update()``. Actions go
to the session only through :class:`~tuiprof.control.SessionControl`. Slow or blocking work
(findings analysis, exports, stopping the session) runs in thread workers that hand results back
with ``post_message``.

``make_app`` builds the app (CLI and tests); ``run_app`` runs it and returns an exit code.
"""
from __future__ import annotations

import datetime as _dt
import re
import signal
import time
from pathlib import Path
from typing import Any, Iterable

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.worker import Worker, WorkerState

from ..control import SessionControl
from ..errors import one_line
from ..text import printable
from ..analysis.requests import story
from ..store.rank_set import RanksView, is_process_set, is_rank_set
from . import adapters
from .actions import ACTIONS
from .derive import view_signature
from .screens.compare import CompareScreen
from .screens.detail import KernelDetailScreen
from .screens.request import RequestDetailScreen
from .screens.help import HelpScreen
from .screens.log import LogScreen
from .screens.main import WIDE_AT, MainScreen
from .screens.all_ranks import RanksScreen
from .screens.all_processes import ProcessesScreen
from ..export.registry import get as get_export
from . import registry as pane_table
from .signals import SignalQuit
from .static import StaticProcessesControl, StaticRanksControl, StaticViewControl
from .widgets.base import Pane, RefreshContext
from .widgets.findings_pane import FindingsPane
from .widgets.header import HeaderPane
from .widgets.kernels_pane import KernelsPane
from .widgets.requests_pane import RequestsPane
from .widgets.statusline import StatusLine

FINDINGS_RAW_TOKENS = 16     # findings read the raw records of the last N traced tokens
DARK, LIGHT = "textual-dark", "textual-light"


class TuiprofApp(SignalQuit, App):
    """Live profiler UI over one :class:`SessionControl`."""

    CSS_PATH = "tuiprof.tcss"
    BINDINGS = [Binding(a.key, a.action, a.label, show=a.show, priority=a.priority, id=a.id,
                        tooltip=a.help) for a in ACTIONS]

    class FindingsReady(Message):
        def __init__(self, found: list, message: str, token: int, summary: Any = None) -> None:
            super().__init__()
            self.found, self.message, self.token = found, message, token
            self.summary = summary

    class ExportDone(Message):
        def __init__(self, what: str, path: str | None, error: str | None) -> None:
            super().__init__()
            self.what, self.path, self.error = what, path, error

    class Stopped(Message):
        def __init__(self, snapshot: str | None, error: str | None) -> None:
            super().__init__()
            self.snapshot, self.error = snapshot, error

    def __init__(self, control: SessionControl, *, title: str = "tuiprof",
                 export_dir: Path | str = ".", auto_snapshot: bool = False,
                 refresh_hz: float = 4.0, deterministic: bool = False,
                 start_control: bool = False, findings_interval: float = 2.0,
                 wide_at: tuple[int, int] = WIDE_AT, theme: str = DARK,
                 handle_signals: bool = False) -> None:
        super().__init__()
        self.control = control
        self.title = title
        self.export_dir = Path(export_dir)
        self.auto_snapshot = auto_snapshot
        self.refresh_hz = float(refresh_hz)
        self.deterministic = deterministic
        self.start_control = start_control
        self.findings_interval = findings_interval
        self.wide_at = wide_at
        self.theme = theme
        self.handle_signals = handle_signals
        self._signalled: list[int] = []
        self._old_hup: Any = None
        self.refresh_stats: dict = {"count": 0, "mean_ms": 0.0, "max_ms": 0.0, "last_ms": 0.0,
                                    "total_ms": 0.0, "hz": self.refresh_hz,
                                    "hidden": deterministic}
        self.last_message = ""          # last action answer (also notified)
        self._timer = None
        self._frozen = False
        self._sig: tuple | None = None
        self._findings_sig: tuple | None = None
        self._findings_at = -1e9
        self._findings_busy = False
        self._findings_token = 0
        self._quitting = False
        self._exit_args: dict | None = None   # the stop worker's result, for the exit
        self._main: MainScreen | None = None
        self.view: Any = None
        self._program_ended = False
        self._keys = {k: a.action for a in ACTIONS for k in a.key.split(",")}
        self.rank = 0                   # the rank every pane shows (sessions of several ranks)
        # (summary, findings) across ranks (findings worker): the latest that had steps traced
        # on every rank, kept while newer pulls have none (bursts come every few seconds)
        self.rank_analysis: Any = None

    # ------------------------------------------------------------------ lifecycle
    def get_default_screen(self) -> Screen:
        self._main = MainScreen(self.wide_at)
        return self._main

    @property
    def main(self) -> MainScreen:
        assert self._main is not None
        return self._main

    @property
    def ranks(self) -> Any:
        """The control when it is a session of several ranks (a RankSet), else None."""
        return self.control if is_rank_set(self.control) else None

    @property
    def store(self) -> Any:
        """The store the panes read: the selected rank's in a session of several ranks."""
        ranks = self.ranks
        return ranks.rank_store(self.rank) if ranks is not None else self.control.store

    @property
    def procs(self) -> Any:
        """The control when its ranks are a program's processes (``cycle``s them), else None."""
        ranks = self.ranks
        return ranks if ranks is not None and callable(getattr(ranks, "cycle", None)) else None

    def _export_view(self) -> Any:
        """What exports write: every rank of a session of several ranks, with raw records."""
        export = getattr(self.control, "export_view", None)
        if callable(export):   # a session of processes: all of them once there are several
            return export()
        ranks = self.ranks
        return ranks.views(raw=True) if ranks is not None else self.store.view(raw=True)

    def on_mount(self) -> None:
        if self.handle_signals:
            self._install_signal_handlers()
        if self.start_control:
            try:
                self.control.start()
            except Exception as exc:
                self.control.status.state = "error"
                self.control.status.message = f"could not start: {one_line(exc)}"
        if self.refresh_hz > 0:
            self._timer = self.set_interval(1.0 / self.refresh_hz, self.refresh_view)
        # Findings are computed synchronously only for deterministic tests: for a session
        # process still starting, that would hold the screen until it answers.
        if self.deterministic:
            self.call_after_refresh(self.refresh_now)
        else:
            self.call_after_refresh(self.refresh_view, True)

    def pause_refresh(self) -> None:
        """Stop the pull timer (tests, ``f``); the session keeps running."""
        self._frozen = True
        if self._timer is not None:
            self._timer.pause()

    def resume_refresh(self) -> None:
        self._frozen = False
        if self._timer is not None:
            self._timer.resume()
        self.refresh_view(force=True)

    # ------------------------------------------------------------------ refresh
    def show_header(self) -> None:
        """The header alone (model, device, start-up progress), before the first full refresh."""
        status = self.control.status
        self.main.query_one(HeaderPane).show(
            self.control.store.view(raw=False),
            RefreshContext(status=status, mode=status.mode, deterministic=self.deterministic))

    def refresh_now(self) -> None:
        """One full refresh, findings computed synchronously (deterministic; for tests)."""
        self.refresh_view(force=True, sync_findings=True)

    def refresh_view(self, force: bool = False, sync_findings: bool = False) -> None:
        """The pull: read one StoreView, update what is visible. Timed into ``refresh_stats``."""
        if self._main is None or not self._main.is_mounted:
            return
        t0 = time.perf_counter()
        status = self.control.status
        view = self.store.view(raw=False)
        self.view = view
        sig = view_signature(view)
        changed = force or sig != self._sig
        self._sig = sig
        ctx = RefreshContext(status=status, mode=status.mode, deterministic=self.deterministic,
                             changed=changed, **self._rank_context())
        screen = self.screen
        main = self.main
        try:
            header, status_line = main.query_one(HeaderPane), main.query_one(StatusLine)
        except NoMatches:  # mounted, but its panes are being taken down (the app is quitting)
            return
        if changed and main.place(view):  # an optional pane has data now: into the grid
            ctx.changed = True
        with self.batch_update():
            header.show(view, ctx)
            if isinstance(screen, LogScreen):
                screen.show(view, status)
            if isinstance(screen, CompareScreen):
                if changed:
                    screen.show(view)
            elif isinstance(screen, RanksScreen):
                screen.show(self.rank_analysis, self.ranks.views(raw=False), self.rank)
            elif isinstance(screen, ProcessesScreen):
                screen.show(self.rank_analysis, self.ranks.views(raw=False), self.rank)
            elif screen is main or isinstance(screen, ModalScreen):
                if screen is main or force:
                    for pane in main.visible_panes():
                        pane.show(view, ctx)
            status_line.show(view, ctx, refresh_stats=self.refresh_stats, frozen=self._frozen)
        self._maybe_findings(sig, sync_findings)
        self._notice_program_end(status)
        dt = (time.perf_counter() - t0) * 1000.0
        rs = self.refresh_stats
        rs["count"] += 1
        rs["total_ms"] += dt
        rs["last_ms"] = dt
        rs["mean_ms"] = rs["total_ms"] / rs["count"]
        rs["max_ms"] = max(rs["max_ms"], dt)

    def _rank_context(self) -> dict:
        """What the panes get of the cross-rank analysis (a session of several ranks)."""
        ranks = self.ranks
        if ranks is None:
            return {}
        analysis = self.rank_analysis
        if isinstance(analysis, dict):   # processes: the job of the one shown, its rank there
            meta = self.view.meta if self.view is not None else {}
            rank, job = meta.get("rank"), analysis.get(meta.get("job"))
            if job is None or not isinstance(rank, int):
                return {"ranks": 1, "rank": 0, "comm_split": None}
            return {"ranks": int(meta.get("world_size") or 1), "rank": rank,
                    "comm_split": adapters.comm_split(job[0], rank)}
        summary = analysis[0] if analysis is not None else None
        return {"ranks": ranks.world_size, "rank": self.rank,
                "comm_split": adapters.comm_split(summary, self.rank)}

    def _analyse(self) -> tuple[list, str, Any]:
        """Findings of the selected rank (and across ranks) and the cross-rank summary."""
        ranks = self.ranks
        if ranks is None:
            found, msg = adapters.findings(self.store.view(raw=True,
                                                           raw_tokens=FINDINGS_RAW_TOKENS))
            return found, msg, None
        rv = ranks.views(raw=True, raw_tokens=FINDINGS_RAW_TOKENS)
        found, msg = adapters.findings(rv[min(self.rank, rv.world_size - 1)])
        if self.procs is not None:   # each torch.distributed job among the processes
            per_job = adapters.job_findings(rv)
            cross = [f for _, _, fs, _ in per_job for f in fs]
            old = self.rank_analysis if isinstance(self.rank_analysis, dict) else {}
            return cross + found, msg, {k: newer_rank_analysis(old.get(k), (s, fs))
                                        for k, _, fs, s in per_job if s is not None}
        cross, summary = adapters.rank_findings(rv)
        kept = newer_rank_analysis(self.rank_analysis,
                                   (summary, cross) if summary is not None else None)
        return (kept[1] if kept is not None else []) + found, msg, kept

    def _maybe_findings(self, sig: tuple, sync: bool) -> None:
        if sync:
            found, msg, self.rank_analysis = self._analyse()
            self._findings_sig = sig
            self._findings_at = time.monotonic()
            self.main.query_one(FindingsPane).set_findings(found, msg)
            return
        now = time.monotonic()
        if (self._findings_busy or sig == self._findings_sig
                or now - self._findings_at < self.findings_interval):
            return
        self._findings_busy = True
        self._findings_sig = sig
        self._findings_at = now
        self._findings_token += 1
        self._run_findings(self._findings_token)

    @work(thread=True, exit_on_error=False, group="findings", description="findings")
    def _run_findings(self, token: int) -> None:
        # The raw view is taken here, off the UI thread: for a session in another process it
        # is a request that waits for its answer.
        found, msg, summary = self._analyse()
        self.post_message(self.FindingsReady(found, msg, token, summary))

    def on_tuiprof_app_findings_ready(self, m: "TuiprofApp.FindingsReady") -> None:
        self._findings_busy = False
        if m.token == self._findings_token:
            self.rank_analysis = newer_rank_analysis(self.rank_analysis, m.summary)
            self.main.query_one(FindingsPane).set_findings(m.found, m.message)

    def _notice_program_end(self, status: Any) -> None:
        """Once, when the profiled program ends: how, and its traceback's last lines."""
        prog = (status.extra or {}).get("program")
        if self._program_ended or not prog or prog.get("running") is not False:
            return   # running, or not started yet (None)
        self._program_ended = True
        tail = prog.get("traceback") or []
        text = "\n".join(printable(x, 300) for x in [status.message or "the program ended",
                                                     *tail[-3:]])
        self.notify(text, severity="error" if prog.get("exit_status") else "information",
                    timeout=10, markup=False)

    # ------------------------------------------------------------------ availability
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Keys a session cannot serve are shown disabled (None); ``l`` and Ctrl-C exist only
        for a profiled program, ``g`` and ``a`` only with several ranks (False: hidden, and
        Ctrl-C keeps Textual's own meaning)."""
        if action in ("show_log", "interrupt"):
            return self.control.has_output()
        if action in ("next_rank", "all_ranks"):  # only a session of several ranks has them
            return self.ranks is not None
        if action in self.control.disabled_actions():
            return None
        return True

    def on_key(self, event: Any) -> None:
        """A disabled key says why it is disabled."""
        reason = self.control.disabled_actions().get(self._keys.get(event.key, ""))
        if reason:
            self._say(reason, "warning")

    # ------------------------------------------------------------------ session actions
    def _say(self, msg: str, severity: str = "information") -> None:
        self.last_message = msg
        if msg:
            self.notify(printable(msg, 400), severity=severity, timeout=3, markup=False)

    def action_toggle_mode(self) -> None:
        self._say(self.control.toggle_mode())
        self.refresh_view(force=True)

    def action_pause(self) -> None:
        self._say(self.control.toggle_pause())
        self.refresh_view(force=True)

    def action_batch_up(self) -> None:
        self._say(self.control.change_batch(up=True))
        self.refresh_view(force=True)

    def action_batch_down(self) -> None:
        self._say(self.control.change_batch(up=False))
        self.refresh_view(force=True)

    def action_reset(self) -> None:
        self._say(self.control.reset())
        self._findings_sig = None
        self.refresh_view(force=True)

    def action_compare(self) -> None:
        if isinstance(self.screen, CompareScreen):
            self.pop_screen()
            return
        scr = CompareScreen()
        self.push_screen(scr, callback=lambda _=None: self.refresh_view(force=True))
        # a timer, not call_after_refresh: the screen and its placeholder paint first
        self.set_timer(0.05, lambda: scr.is_mounted and scr.show(self.store.view(raw=False)))

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
            return
        self.push_screen(HelpScreen(lambda: self.refresh_stats, self.control.disabled_actions()))

    def action_show_log(self) -> None:
        if isinstance(self.screen, LogScreen):
            self.pop_screen()
            return
        scr = LogScreen()
        self.push_screen(scr)
        self.call_after_refresh(lambda: scr.is_mounted and scr.show(
            self.control.store.view(raw=False), self.control.status))

    def action_interrupt(self) -> None:
        """Ctrl-C: first to the program, then (or once it has ended) stop the session."""
        msg = self.control.interrupt()
        if msg is None:
            self.action_quit()
            return
        self._say(msg, "warning")

    def action_toggle_theme(self) -> None:
        self.theme = LIGHT if self.theme == DARK else DARK
        self._say(f"theme {self.theme}")

    def action_freeze(self) -> None:
        if self._frozen:
            self.resume_refresh()
            self._say("display live")
        else:
            self.pause_refresh()
            self.refresh_view(force=True)
            self._say("display frozen (collection continues)")

    # ------------------------------------------------------------------ ranks
    def action_next_rank(self) -> None:
        ranks = self.ranks
        if ranks is None:
            return
        procs = self.procs
        if procs is not None:   # the processes that do GPU work or mark steps
            self.rank = procs.cycle(self.rank)
            procs.selected = self.rank
        else:
            self.rank = (self.rank + 1) % ranks.world_size
        self._findings_sig = None
        self._findings_at = -1e9
        if procs is not None:
            e = procs.entries[self.rank]
            title = getattr(e, "title", None)   # a fleet's: host:pid role rank
            self._say(f"showing process {self.rank} of {ranks.world_size}: "
                      + (printable(title, 60) if title else f"pid {e.pid} {printable(e.name, 40)}")
                      + " (g: next, a: all processes)")
        else:
            self._say(f"showing rank {self.rank} of {ranks.world_size} (g: next, a: all ranks)")
        self.refresh_view(force=True)

    def action_all_ranks(self) -> None:
        if self.ranks is None:
            return
        if isinstance(self.screen, (RanksScreen, ProcessesScreen)):
            self.pop_screen()
            return
        scr = ProcessesScreen() if self.procs is not None else RanksScreen()
        self.push_screen(scr, callback=lambda _=None: self.refresh_view(force=True))
        self._findings_at = -1e9   # a fresh cross-rank analysis for the screen
        self.call_after_refresh(lambda: scr.is_mounted and scr.show(
            self.rank_analysis, self.ranks.views(raw=False), self.rank))

    # ------------------------------------------------------------------ panes
    def action_show_pane(self, n: int) -> None:
        if self.screen is not self.main:
            return
        self.main.set_active(int(n))
        for p in self.main.panes:
            if p.PANE_KEY == str(n):
                p.focus_main()
                # A pane hidden until now has not been refreshed: bring it up to date as soon
                # as it has been laid out (its size is known only then).
                self.call_after_refresh(self._show_one, p)

    def _show_one(self, p: Pane) -> None:
        view = self.view if self.view is not None else self.store.view(raw=False)
        p.show(view, RefreshContext(status=self.control.status, mode=self.control.status.mode,
                                    deterministic=self.deterministic, changed=True,
                                    **self._rank_context()))

    def action_next_pane(self) -> None:
        self._step_pane(1)

    def action_prev_pane(self) -> None:
        self._step_pane(-1)

    def _step_pane(self, by: int) -> None:
        keys = pane_table.keys()
        i = keys.index(str(self.main.active)) if str(self.main.active) in keys else 0
        self.action_show_pane(int(keys[(i + by) % len(keys)]))

    def action_pane(self, pane: str, name: str) -> None:
        """A key a pane owns (its ``KEYS``): run by that pane's ``action_<name>`` (``pane``: its
        id), what it returns told to the user. In the narrow layout the pane is shown first,
        unless the pane shown has an action of that name itself (enter on the requests pane)."""
        if self.screen is not self.main:
            return
        target = self.main.query_one(f"#{pane}", Pane)
        if self.main.narrow and str(self.main.active) != target.PANE_KEY:
            shown = next((p for p in self.main.panes if p.PANE_KEY == str(self.main.active)), None)
            if shown is not None and hasattr(shown, f"action_{name}"):
                target = shown
            else:
                self.action_show_pane(int(target.PANE_KEY))
        said = getattr(target, f"action_{name}")()
        if said is not None:
            self._say(said)

    def on_kernels_pane_open_detail(self, m: KernelsPane.OpenDetail) -> None:
        self.push_screen(KernelDetailScreen(m.row, self.view))

    def on_requests_pane_open_request(self, m: RequestsPane.OpenRequest) -> None:
        self.open_request(m.rid)

    def open_request(self, rid: Any) -> None:
        """One request's story, from a view with the raw records of its traced steps."""
        if rid is None:
            return
        s = story(self.store.view(raw=True, raw_tokens=FINDINGS_RAW_TOKENS), rid)
        if s is None:
            self._say("that request has left the store (only the last ones are kept whole)",
                      "warning")
            return
        self.push_screen(RequestDetailScreen(s))

    # ------------------------------------------------------------------ exports
    def _stamp_name(self, prefix: str, suffix: str) -> Path:
        meta = self.view.meta if self.view is not None else {}
        model = re.sub(r"[^A-Za-z0-9.]+", "-", str(meta.get("model") or "session")).strip("-")[:40]
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        tp = (f"-{'procs' if self.procs is not None else 'tp'}{self.ranks.world_size}"
              if self.ranks is not None else "")
        base = f"{prefix}-{model}{tp}-{self.control.status.mode}-{stamp}"
        path = self.export_dir / f"{base}{suffix}"
        n = 1
        while path.exists():  # two exports in one second must not overwrite each other
            n += 1
            path = self.export_dir / f"{base}-{n}{suffix}"
        return path

    def action_export(self, name: str) -> None:
        """An export of the export table (``e`` the snapshot, ``n`` the nsys reports, …)."""
        spec = get_export(name)
        path = self._stamp_name(spec.prefix, spec.suffix)
        self._say(f"writing {name} {path.name}{'/' if spec.target == 'dir' else ''}…")
        self._export_worker(name, path)

    @work(thread=True, exit_on_error=False, group="export", description="export")
    def _export_worker(self, what: str, path: Path) -> None:
        try:
            view = self._export_view()
            path.parent.mkdir(parents=True, exist_ok=True)
            res = adapters.export(what, view, path)
            out = str(res) if isinstance(res, (str, Path)) else str(path)
            if isinstance(res, (list, tuple)):
                out += f" ({len(res)} files)"
            self.post_message(self.ExportDone(what, out, None))
        except Exception as exc:
            self.post_message(self.ExportDone(what, None, f"{type(exc).__name__}: {exc}"))

    def on_tuiprof_app_export_done(self, m: "TuiprofApp.ExportDone") -> None:
        if m.error:
            self._say(f"{m.what} export failed: {m.error}", "error")
        else:
            self._say(f"{m.what} written: {m.path}")

    # ------------------------------------------------------------------ quit
    def action_quit(self) -> None:
        if self._quitting:           # a second q quits without waiting
            self.exit(return_code=0)
            return
        self._quitting = True
        if self._timer is not None:
            self._timer.pause()
        if getattr(self.control, "detaches", False):
            self._say("detaching: the session goes on (tuiprof attach to come back)")
        else:
            self._say("stopping the session…" + (" (writing snapshot)" if self.auto_snapshot
                                                  else ""))
        self._stop_worker()

    @work(thread=True, exit_on_error=False, group="quit", description="stop")
    def _stop_worker(self) -> None:
        error = None
        try:
            self.control.stop()
        except Exception as exc:
            error = f"stop failed: {type(exc).__name__}: {exc}"
        snapshot, snap_error = self._final_snapshot()
        self.post_message(self.Stopped(snapshot, snap_error or error))

    def _final_snapshot(self) -> tuple[str | None, str | None]:
        """Write the automatic snapshot (when enabled): (path, None) or (None, error)."""
        if not self.auto_snapshot:
            return None, None
        try:
            path = self._stamp_name("tuiprof", ".json")
            path.parent.mkdir(parents=True, exist_ok=True)
            res = adapters.export("snapshot", self._export_view(), path)
            return (str(res) if isinstance(res, (str, Path)) else str(path)), None
        except Exception as exc:
            return None, f"auto snapshot failed: {type(exc).__name__}: {exc}"

    def on_tuiprof_app_stopped(self, m: "TuiprofApp.Stopped") -> None:
        self.quit_result = m
        msg = ""
        if m.snapshot:
            msg = f"tuiprof: snapshot written to {m.snapshot}"
        if m.error:
            msg = (msg + "\n" if msg else "") + f"tuiprof: {m.error}"
        detached = getattr(self.control, "detach_line", "")
        if detached and not m.error:
            msg = (msg + "\n" if msg else "") + f"tuiprof: {detached}"
        if self._signalled:
            name = signal.Signals(self._signalled[0]).name
            msg = f"tuiprof: {name}: session stopped" + (f"; {msg[9:]}" if msg else "")
        code = 128 + self._signalled[0] if self._signalled else 0
        self._exit_args = dict(result=m.snapshot, return_code=code, message=msg or None)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Quit once the stop worker has finished, not when its message arrives: the message
        is posted from the worker's thread before the worker is done, and exiting then
        cancels it."""
        if (event.worker.group == "quit" and event.state in (WorkerState.SUCCESS,
                                                             WorkerState.ERROR)
                and self._exit_args is not None):
            self.exit(**self._exit_args)

    # ------------------------------------------------------------------ palette
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for a in ACTIONS:
            if a.id in ("help", "quit") or not self.check_action(a.action, ()):
                continue
            yield SystemCommand(a.help.split(" (")[0],
                                f"key: {a.shown_key or a.key}", self._palette_callback(a.action))

    def _palette_callback(self, action: str):
        def run() -> None:
            self.run_action(action)
        return run


def make_app(control: SessionControl, *, title: str = "tuiprof", export_dir: Path | str = ".",
             auto_snapshot: bool = False, refresh_hz: float = 4.0, deterministic: bool = False,
             start_control: bool = False, **kw: Any) -> TuiprofApp:
    """Build the app (shared by the CLI and the tests).

    ``refresh_hz``: pull rate of the store (2–4 Hz is plenty; 0 = no timer, refresh by
    calling ``app.refresh_now()``). ``deterministic``: hide timings, overhead and clocks (for
    snapshot tests). ``start_control``: call ``control.start()`` on mount (default off: the
    caller starts the control, as ``tuiprof.cli`` does). The app always stops it on ``q``.
    """
    return TuiprofApp(control, title=title, export_dir=export_dir, auto_snapshot=auto_snapshot,
                      refresh_hz=refresh_hz, deterministic=deterministic,
                      start_control=start_control, **kw)


def run_app(control: SessionControl, *, title: str = "tuiprof", export_dir: Path | str = ".",
            auto_snapshot: bool = False, **kw: Any) -> int:
    """Run the UI until the user quits; the control (started by the caller, or pass
    ``start_control=True``) is always stopped. Returns the exit code (0 on a normal quit).
    """
    kw.setdefault("handle_signals", True)
    app = make_app(control, title=title, export_dir=export_dir, auto_snapshot=auto_snapshot, **kw)
    try:
        app.run()
    finally:
        app.restore_signal_handlers()
        try:
            control.stop()
        except Exception:
            pass
        try:
            control.close()
        except Exception:
            pass
    return int(app.return_code or 0)


def newer_rank_analysis(old: Any, new: Any) -> Any:
    """The cross-rank analysis to show: ``new`` unless it has no step traced on every rank
    while ``old`` (of the same mode) has: the ranks' raw records of a burst leave their stores
    after a while, and the split of the latest burst stays the one to show until the next."""
    if new is None:
        return old
    if isinstance(new, dict):   # per job of a session of processes: each kept already
        return new
    if old is None or isinstance(old, dict) or new[0].steps or old[0].mode != new[0].mode or not old[0].steps:
        return new
    return old


def is_rank_set_view(view: Any) -> bool:
    return isinstance(view, RanksView)


def view_control(view: Any, source: str = "snapshot") -> SessionControl:
    """A read-only control over one StoreView, or over every rank of a RanksView
    (``tuiprof view SNAPSHOT.json``)."""
    if is_rank_set_view(view):
        if is_process_set(view):
            return StaticProcessesControl(view, source)
        return StaticRanksControl(view, source)
    return StaticViewControl(view, source)
