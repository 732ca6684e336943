"""Live feeds: a session's data handed, while it runs, to the tools a fleet already has
(Prometheus scrapes ``--metrics``, an OpenTelemetry collector receives ``--otlp``).

Every feed is one row of :data:`FEEDS`: the option every session kind takes (``tuiprof run``,
``record``, ``serve``, a program, ``--detach``), how it is checked in the terminal before
anything starts (one line, nothing started), and the module that runs it. A feed runs in the
process that holds the session (the live app, a headless run, a detached session's keeper)
and only reads: it asks its :class:`Source` for the views of every process when it needs
them (a scrape, a poll), never touching the session's hot path. Its module has
``check(value) -> parsed`` (raise ``TuiprofError``) and ``start(parsed, source) -> running``
where ``running`` has ``close()``, ``stats() -> dict`` (what the snapshot's
``meta["feeds"]`` and the status line say) and optionally ``notice() -> str | None``.
Modules and their packages (the ``fleet`` extra) load only when the option is given.
"""
from __future__ import annotations

import argparse
import importlib
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import TuiprofError


@dataclass(frozen=True)
class Feed:
    """One live feed."""

    name: str          # its key in ``meta["feeds"]``
    module: str        # under tuiprof.export: check(value), start(parsed, source)
    flag: str
    metavar: str
    help: str


FEEDS: tuple[Feed, ...] = (
    Feed("metrics", "metrics", "--metrics", "HOST:PORT",
         "serve Prometheus/OpenMetrics metrics of every process at http://HOST:PORT/metrics "
         "(needs the fleet extra; docs/fleet.md)"),
    Feed("otlp", "otlp", "--otlp", "URL",
         "send a span per request (queued/prefill/decode) and sampled step spans to an "
         "OpenTelemetry collector over OTLP/HTTP, e.g. http://127.0.0.1:4318 (needs the fleet "
         "extra; docs/fleet.md)"),
)


def add_feed_arguments(p: argparse.ArgumentParser) -> None:
    """Every feed's option (each session kind's parser calls this once)."""
    g = p.add_argument_group("feeds for a fleet's tools (docs/fleet.md)")
    for f in FEEDS:
        g.add_argument(f.flag, metavar=f.metavar, default=None, dest=f"feed_{f.name}",
                       help=f.help)


def _module(feed: Feed) -> Any:
    return importlib.import_module(f"{__package__}.{feed.module}")


def check_feeds(args: argparse.Namespace) -> dict:
    """The feeds asked for, checked here in the terminal: {name: parsed value}."""
    out = {}
    for f in FEEDS:
        value = getattr(args, f"feed_{f.name}", None)
        if value:
            out[f.name] = _module(f).check(value)
    return out


class Source:
    """What a feed reads: every process's :class:`~tuiprof.store.StoreView` now (``views``),
    with raw records of the last ``raw_tokens`` traced steps when asked. ``of`` wraps any
    holder: a process set (the live app, a keeper), tensor-parallel ranks, one remote session
    process or a store in this process."""

    def __init__(self, views: Callable[[int], list], host: str | None = None) -> None:
        self._views = views
        self.host = host or socket.gethostname()
        self.notice: Callable[[str], None] | None = None

    def views(self, raw_tokens: int = 0) -> list:
        return self._views(raw_tokens)

    @classmethod
    def of(cls, holder: Any) -> "Source":
        ranks = getattr(holder, "ranks", None)   # tensor-parallel ranks: a control each
        if hasattr(holder, "views"):        # every process (or rank)
            def views(raw_tokens: int) -> list:
                if raw_tokens:
                    out = list(holder.views(raw=True, raw_tokens=raw_tokens).views)
                else:
                    out = list(holder.views(raw=False).views)
                if isinstance(ranks, (list, tuple)) and len(ranks) == len(out):
                    for r, (v, ctl) in enumerate(zip(out, ranks)):
                        _known(v, ctl, rank=r)   # before a rank's first pull: its labels
                return out
        else:                               # one store, here or mirrored
            def views(raw_tokens: int) -> list:
                if raw_tokens:
                    v = holder.view(raw=True, raw_tokens=raw_tokens)
                else:
                    v = holder.view(raw=False)
                return [_known(v, holder)]
        src = cls(views)
        if hasattr(holder, "notice"):
            src.notice = holder.notice
        return src


def _known(view: Any, ctl: Any, rank: int | None = None) -> Any:
    """``view`` with what its holder knows of the process even before its first pull (its
    pid, its rank), so that its series keep the same labels from the first scrape on (the
    view's meta is its own copy)."""
    meta = view.meta
    pid = getattr(ctl, "pid", None)
    if isinstance(meta, dict):
        if isinstance(pid, int) and not isinstance(pid, bool):
            meta.setdefault("pid", pid)
        if rank is not None:
            meta.setdefault("rank", rank)
    return view


class Feeds:
    """The feeds of one session, started over its holder and closed at its end."""

    def __init__(self, parsed: dict) -> None:
        self.parsed = parsed
        self.running: dict[str, Any] = {}
        self._final: dict = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.parsed)

    def start(self, holder: Any) -> "Feeds":
        source = holder if isinstance(holder, Source) else Source.of(holder)
        for f in FEEDS:
            if f.name in self.parsed and f.name not in self.running:
                self.running[f.name] = _module(f).start(self.parsed[f.name], source)
        metrics = self.running.get("metrics")
        if metrics is not None:   # the other feeds' own figures (spans sent, dropped) scraped too
            for name, r in self.running.items():
                if name != "metrics" and hasattr(r, "metric_values"):
                    metrics.extras.append(r.metric_values)
        return self

    def summary(self) -> list:
        """One line per feed for the end of a headless run: what it served or sent, and what
        it dropped."""
        out = []
        for name, st in self.stats().items():
            if name == "metrics":
                out.append(f"metrics: served at {st.get('address')}, {st.get('scrapes', 0)} "
                           "scrapes")
            elif name == "otlp":
                out.append(f"otlp: {st.get('requests', 0)} requests and {st.get('steps', 0)} "
                           f"steps as {st.get('spans', 0)} spans to {st.get('url')}: "
                           f"{st.get('exported', 0)} exported, {st.get('dropped', 0)} dropped "
                           f"(queue full), {st.get('failed', 0)} not accepted")
        return out

    def notices(self) -> list:
        """One line per feed that has something to say (spans dropped)."""
        out = []
        for r in list(self.running.values()):
            fn = getattr(r, "notice", None)
            line = fn() if fn is not None else None
            if line:
                out.append(line)
        return out

    def stats(self) -> dict:
        """Each feed's figures (its address, what it sent, what it dropped)."""
        running = dict(self.running)
        return {name: r.stats() for name, r in running.items()} if running else dict(self._final)

    def annotate(self, view: Any) -> Any:
        """``view`` (one process, or every process) with ``meta["feeds"]``: a snapshot says
        what the session fed and what it dropped."""
        if not self.running and not self._final:
            return view
        import dataclasses  # noqa: PLC0415

        meta = dict(getattr(view, "meta", {}) or {})
        meta["feeds"] = self.stats()
        try:
            return dataclasses.replace(view, meta=meta)
        except TypeError:
            return view

    def close(self) -> None:
        with self._lock:
            running, self.running = self.running, {}
        for r in running.values():
            try:
                r.close()
            except Exception:  # a feed's end must not hide the session's own
                pass
        if running:    # closing twice keeps the first close's figures
            self._final = {n: r.stats() for n, r in running.items()}


def start_feeds(args: argparse.Namespace, holder: Any) -> Feeds:
    """The feeds ``args`` asks for, running over ``holder`` (none: an empty, inert one)."""
    feeds = Feeds(getattr(args, "feeds_parsed", None) or check_feeds(args))
    if feeds:
        try:
            feeds.start(holder)
        except BaseException:
            feeds.close()
            raise
    return feeds


def bind_address(text: str, flag: str) -> tuple[str, int]:
    """HOST:PORT of a feed's listener (IPv6 in brackets), one line if it is not one."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise TuiprofError(f"{flag} {text}: give HOST:PORT (e.g. 127.0.0.1:9400)")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def port_free(host: str, port: int, flag: str) -> None:
    """Refuse, in one line, a port another process already listens on (checked before the
    session starts; the feed binds it again when it starts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    # as the feed's own server binds: connections of an earlier session's scrapes still in
    # TIME_WAIT do not make the port "in use"; a listener there still does
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
        s.listen(1)
    except OSError as exc:
        raise TuiprofError(f"{flag} {host}:{port}: cannot listen there "
                           f"({exc.strerror or exc}); pick another port") from None
    finally:
        s.close()


def need(package: str, flag: str) -> Any:
    """Import one of the fleet extra's packages, or say in one line how to install it."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise TuiprofError(f"{flag} needs {package.split('.')[0]}: pip install "
                           f"'tuiprof[fleet]'") from None


def process_labels(view: Any, host: str) -> dict:
    """The bounded labels of one process's series: host, pid, role, rank, GPU."""
    meta = view.meta or {}
    proc = meta.get("process") or {}
    pid = proc.get("pid") or meta.get("pid") or ""
    rank = meta.get("rank")
    if proc and not proc.get("main"):
        role = "child"
    elif meta.get("source") == "program":
        role = "program"
    elif rank is not None:
        role = "rank"
    else:
        role = "engine"
    if not pid and not proc and rank is None:
        pid = os.getpid()   # a store in this process (--in-process, a headless engine run)
    gpu = meta.get("device") or ""
    return {"host": host, "pid": str(pid), "role": role,
            "rank": "" if rank is None else str(rank), "gpu": str(gpu)[:40]}
