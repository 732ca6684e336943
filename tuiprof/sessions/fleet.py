"""One UI over the sessions of many hosts: ``tuiprof attach HOST1:PORT HOST2:PORT …``.

Each address is a detached session's keeper: TCP with its token (``--listen``), or a Unix
socket (the session's ``s.sock``, forwarded from another machine with ``ssh -L``). For each
one a :class:`Host` holds an :class:`~tuiprof.sessions.attached.AttachedSession` (a viewer per
process, as a single ``tuiprof attach`` does) and a connection of its own that measures the
host's clock. :class:`FleetSession` is one :class:`~tuiprof.sessions.process_set.ProcessSet` over all
of them: host is a dimension above the process, so ``g`` and ``a`` (the all-processes view,
with each torch.distributed job's all-ranks comparison) span hosts.

Clocks. Every :data:`CLOCK_EVERY_S` the fleet asks each keeper for its ``CLOCK_REALTIME``
(:data:`CLOCK_SAMPLES` round trips, the protocol's ``clock`` request) and estimates the
host's offset as NTP does: ``t_remote - (t_send + t_recv) / 2`` of the sample with the
shortest round trip among the last :data:`CLOCK_KEEP` ones; that sample's half round trip
bounds the error (the *residual* shown per host). The offset is applied to the clock pairs
the sessions' processes record (``meta["clock_sync"]``: a rank's session clock against its
host's realtime, when it joins a job), so the cross-rank analysis
(:func:`~tuiprof.store.rank_set.clock_alignment`) shifts the ranks of another host onto this
host's clock.

A host that goes away (its keeper ended, was killed, or the network or the ``ssh -L`` went)
reads as such, with how long ago; what its processes sent so far stays (their mirrors are
kept). The fleet tries it again, waiting :data:`BACKOFF_S` between tries (capped), and
attaches again when a session answers there: the same session (a dropped connection) is
picked up where its mirrors are; a new one is listed beside the old one, whose data stays.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from typing import Any, Callable

from ..control import SourceStatus
from ..text import printable
from . import protocol
from .attached import AttachedSession
from .process_set import MAX_PROCESSES, ProcessEntry, ProcessSet

CLOCK_EVERY_S = 10.0      # how often each host's clock offset is measured again
CLOCK_SAMPLES = 4         # round trips per measurement
CLOCK_KEEP = 32           # samples kept per host (the best of them is used: ~80 s of them)
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)   # waits between tries to reach a lost host
MAX_SESSIONS = 4          # sessions kept per host (a host whose session was replaced)
ATTACH_TIMEOUT_S = 10.0   # a keeper answers its first requests within this


# ============================================================================ clocks
@dataclasses.dataclass(frozen=True)
class ClockSample:
    rtt_ns: int
    offset_ns: int         # remote - local
    at: float              # time.monotonic() when taken


class ClockEstimate:
    """A host's clock offset from round trips: the sample with the shortest round trip among
    the last :data:`CLOCK_KEEP` (its error is at most half its round trip)."""

    def __init__(self, keep: int = CLOCK_KEEP) -> None:
        self.samples: deque = deque(maxlen=keep)
        self.unsupported = False      # the keeper is older: it has no clock request
        self.measurements = 0
        self._lock = threading.Lock()

    def add(self, t_send_ns: int, t_remote_ns: int, t_recv_ns: int) -> ClockSample:
        s = ClockSample(max(0, t_recv_ns - t_send_ns),
                        t_remote_ns - (t_send_ns + t_recv_ns) // 2, time.monotonic())
        with self._lock:
            self.samples.append(s)
        return s

    def best(self) -> ClockSample | None:
        with self._lock:
            return min(self.samples, key=lambda s: s.rtt_ns) if self.samples else None

    @property
    def offset_ns(self) -> int | None:
        b = self.best()
        return b.offset_ns if b is not None else None

    @property
    def uncertainty_ns(self) -> int | None:
        b = self.best()
        return b.rtt_ns // 2 if b is not None else None

    def measure(self, client: protocol.Client, n: int = CLOCK_SAMPLES) -> None:
        """``n`` round trips on ``client`` (a control connection to a keeper)."""
        if self.unsupported:
            return
        for _ in range(n):
            t0 = time.time_ns()
            try:
                remote = client.request("clock", timeout=5.0)
            except protocol.RemoteError:
                self.unsupported = True   # an older keeper: "unknown request"
                return
            t1 = time.time_ns()
            if isinstance(remote, int) and not isinstance(remote, bool):
                self.add(t0, remote, t1)
        self.measurements += 1

    def text(self) -> str:
        """``clock +0.012 ms ± 0.030 ms`` (offset of the host's clock from this one's)."""
        if self.unsupported:
            return "clock: not measured (an older tuiprof there)"
        b = self.best()
        if b is None:
            return "clock: not measured yet"
        return f"clock {b.offset_ns / 1e6:+.3f} ms ± {b.rtt_ns / 2e6:.3f} ms"


# ============================================================================ addresses
@dataclasses.dataclass(frozen=True)
class Address:
    """Where a host's session listens: a Unix socket path, or TCP with a token."""

    name: str
    path: str | None = None
    host: str | None = None
    port: int | None = None
    token: str | None = None

    @property
    def where(self) -> str:
        return self.path if self.path is not None else f"{self.host}:{self.port}"

    def connect(self, role: str, **facts: Any) -> protocol.Client:
        if self.path is not None:
            return protocol.Client.unix(self.path, role=role, timeout=ATTACH_TIMEOUT_S, **facts)
        return protocol.Client.tcp(self.host, self.port, self.token or "", role=role,
                                   timeout=ATTACH_TIMEOUT_S, **facts)


def is_address(text: str) -> bool:
    """True for ``HOST:PORT``, a socket path, or ``NAME=`` either (not a session id)."""
    body = text.split("=", 1)[1] if "=" in text else text
    return "/" in body or body.endswith(".sock") or ":" in body


def parse_addresses(texts: list, tokens: list) -> list[Address]:
    """Addresses from the command line: ``[NAME=]HOST:PORT`` (TCP: a token each, from
    ``tokens`` in order, or one for all) or ``[NAME=]PATH`` (a Unix socket). ValueError with
    one line for anything else."""
    out: list[Address] = []
    tcp = 0
    for text in texts:
        name, sep, body = text.partition("=")
        if not sep:
            name, body = "", text
        if "/" in body or body.endswith(".sock"):
            out.append(Address(name or body.rstrip("/").rsplit("/", 1)[-1], path=body))
            continue
        host, sep, port = body.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{text}: give HOST:PORT, a socket path, or NAME= before either")
        if tcp >= len(tokens) and len(tokens) != 1:
            raise ValueError(f"{text}: TCP needs the session's token (--token-file: one for "
                             f"every TCP address, or one each in order)")
        token = tokens[0] if len(tokens) == 1 else tokens[tcp]
        tcp += 1
        out.append(Address(name or body, host=host or "127.0.0.1", port=int(port), token=token))
    if len(tokens) > 1 and len(tokens) != tcp:
        raise ValueError(f"{len(tokens)} token files for {tcp} TCP addresses: give one for "
                         f"all, or one each")
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        raise ValueError("two hosts with one name: name them (NAME=HOST:PORT)")
    return out


# ============================================================================ a host
class Host:
    """One address of the fleet: its sessions (the current one and up to
    :data:`MAX_SESSIONS` - 1 earlier ones, kept with their data), its clock, its state."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self.name = address.name
        self.sessions: dict[str, AttachedSession] = {}   # sid -> session, oldest first
        self.sid: str | None = None                      # the current session's
        self.state = "connecting"                        # connecting | attached | lost
        self.since = time.monotonic()                    # when the state began
        self.why = ""                                    # why it was lost, or cannot attach
        self.ended = False                               # its session ended (not a failure)
        self.attempts = 0
        self.next_try: float | None = None
        self.clock = ClockEstimate()
        self.hostname = ""
        self.dropped_sessions = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.rate_in = 0.0          # bytes/s received, over the last measuring period
        self.rate_out = 0.0
        self._rate_at = (time.monotonic(), 0, 0)
        self._bytes_lock = threading.Lock()
        self.probe: protocol.Client | None = None

    @property
    def session(self) -> AttachedSession | None:
        return self.sessions.get(self.sid) if self.sid is not None else None

    def count(self, got: int, sent: int) -> None:
        with self._bytes_lock:
            self.bytes_in += got
            self.bytes_out += sent

    def connect(self, role: str, **facts: Any) -> protocol.Client:
        """A connection to the host's keeper whose traffic counts as the host's."""
        c = self.address.connect(role, **facts)
        c.on_bytes = self.count
        return c

    def rates(self) -> None:
        now = time.monotonic()
        t, bi, bo = self._rate_at
        if now - t >= 1.0:
            self.rate_in = (self.bytes_in - bi) / (now - t)
            self.rate_out = (self.bytes_out - bo) / (now - t)
            self._rate_at = (now, self.bytes_in, self.bytes_out)

    def line(self, now: float | None = None) -> str:
        """What the host list says of it: state, processes, clock, traffic."""
        now = time.monotonic() if now is None else now
        ago = int(now - self.since)
        s = self.session
        n = len(s.entries) if s is not None else 0
        where = printable(self.address.where, 60)
        if self.state == "attached":
            head = (f"host {self.name}: attached to session {self.sid} ({n} processes, "
                    f"{where}); {self.clock.text()}; {_rate(self.rate_in)} in")
        elif self.state == "lost":
            what = "its session ended" if self.ended else "connection lost"
            retry = ""
            if self.next_try is not None:
                retry = f"; trying again in {max(0, int(self.next_try - now))} s"
            kept = "; data so far kept" if self.sessions else ""
            head = f"host {self.name}: {what} {ago} s ago{kept}{retry}"
            if self.why and not self.ended:
                head += f" ({printable(self.why, 80)})"
        else:
            head = f"host {self.name}: connecting to {where}"
            if self.attempts:
                head += f" ({self.attempts} tries: {printable(self.why, 80)})"
        return head

    def facts(self) -> dict:
        """The host as plain data (the all-processes screen, snapshots)."""
        return {"name": self.name, "address": self.address.where, "state": self.state,
                "session": self.sid, "hostname": self.hostname,
                "since_s": round(time.monotonic() - self.since, 1), "why": self.why,
                "ended": self.ended, "clock_offset_ns": self.clock.offset_ns,
                "clock_uncertainty_ns": self.clock.uncertainty_ns,
                "clock_method": ("round trips (min-RTT sample: remote - (send + receive) / 2)"
                                 if not self.clock.unsupported else "unsupported"),
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                "bytes_per_s_in": round(self.rate_in, 1), "sessions": list(self.sessions),
                "line": self.line()}


def _rate(b: float) -> str:
    return f"{b / 1e3:.1f} kB/s" if b < 1e6 else f"{b / 1e6:.2f} MB/s"


class HostEntry:
    """One process of one host's session, as the fleet lists it (index: its place in the
    fleet's list). Its process entry is looked up each time: a session attached again
    brings new entries for the same processes."""

    def __init__(self, host: Host, sid: str, proc: int) -> None:
        self.host, self.sid, self.proc = host, sid, proc
        self.index = 0

    @property
    def inner(self) -> ProcessEntry:
        s = self.host.sessions.get(self.sid)
        e = s.entry(self.proc) if s is not None else None
        return e if e is not None else ProcessEntry(self.proc, None, state="dropped")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def current(self) -> bool:
        return self.host.sid == self.sid and self.host.state == "attached"

    @property
    def state(self) -> str:
        inner = self.inner.state
        if self.current or inner != "running":
            return inner
        return "lost"     # its host went (or has a new session): it never said it ended

    @property
    def rank(self) -> int | None:
        ctl = self.inner.ctl
        r = ctl.mirror.meta.get("rank") if ctl is not None else None
        return r if isinstance(r, int) else None

    @property
    def title(self) -> str:
        """``B:1234 tp_job.py rank 1``: host, pid, role, rank."""
        e = self.inner
        rank = self.rank
        return (f"{self.host.name}:{e.pid} {printable(e.name, 40)}"
                + (f" rank {rank}" if rank is not None else ""))

    @property
    def label(self) -> str:
        e = self.inner
        return f"{self.host.name}:{e.pid} ({e.name})"

    def facts(self) -> dict:
        f = self.inner.facts()
        f.update(index=self.index, host=self.host.name, state=self.state, session=self.sid,
                 title=self.title)
        return f


# ============================================================================ the fleet
class FleetSession(ProcessSet):
    """Every process of every host (see the module docstring). ``q`` detaches from all."""

    detaches = True

    def __init__(self, addresses: list[Address], pull_every: float = 1.0) -> None:
        super().__init__()
        self.hosts = [Host(a) for a in addresses]
        self.pull_every = pull_every
        self._list: list[HostEntry] = []
        self._keys: dict[tuple, HostEntry] = {}
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self.launcher = "processes"
        names = ", ".join(h.name for h in self.hosts)
        self.detach_line = (f"detached from {len(self.hosts)} hosts ({printable(names, 120)}); "
                            f"their sessions go on")

    # ------------------------------------------------------------------ entries
    @property
    def _entries(self) -> tuple:  # type: ignore[override]
        return tuple(self._sync_entries())

    @_entries.setter
    def _entries(self, value: Any) -> None:
        pass   # the list is the hosts' (ProcessSet's constructor sets it empty)

    def _sync_entries(self) -> list[HostEntry]:
        with self._lock:
            live: set = set()
            for h in self.hosts:
                for sid, s in list(h.sessions.items()):
                    for e in s.entries:
                        key = (h.name, sid, e.index)
                        live.add(key)
                        if key not in self._keys:
                            he = HostEntry(h, sid, e.index)
                            self._keys[key] = he
                            self._list.append(he)
            if len(live) != len(self._keys):    # a host's oldest session was let go
                self._list = [he for he in self._list if (he.host.name, he.sid, he.proc) in live]
                self._keys = {k: v for k, v in self._keys.items() if k in live}
            while len(self._list) > MAX_PROCESSES:
                gone = next((he for he in self._list if he.state != "running"), self._list[0])
                self._list.remove(gone)
                self.dropped += 1
            for i, he in enumerate(self._list):
                he.index = i
            return list(self._list)

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        """Reach every host (in the background: a host that does not answer yet is tried
        again and again; the others are shown meanwhile)."""
        for h in self.hosts:
            t = threading.Thread(target=self._run, args=(h,), name=f"tuiprof-host-{h.name}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def wait_attached(self, timeout: float) -> bool:
        """True once every host is attached (for a caller that wants them all first)."""
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if all(h.state == "attached" for h in self.hosts):
                return True
            time.sleep(0.05)
        return False

    def stop(self, timeout: float = 10.0) -> None:
        """Nothing: a UI detaches, the sessions go on."""

    def close(self) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        for h in self.hosts:
            for s in list(h.sessions.values()):
                s.close()
            if h.probe is not None:
                h.probe.close(bye=True)
        for t in self._threads:
            t.join(2.0)

    # ------------------------------------------------------------------ one host
    def _run(self, h: Host) -> None:
        while not self._closing.is_set():
            if h.state != "attached":
                if self._attach(h):
                    continue
                wait = BACKOFF_S[min(h.attempts, len(BACKOFF_S)) - 1]
                h.next_try = time.monotonic() + wait
                self._closing.wait(wait)
                continue
            s = h.session
            if s is None or s.lost.wait(CLOCK_EVERY_S):
                self._lose(h, s.lost_why if s is not None else "")
                continue
            if self._closing.is_set():
                return
            try:
                h.clock.measure(h.probe)
                info = h.probe.request("info", timeout=ATTACH_TIMEOUT_S)
                h.ended = isinstance(info, dict) and info.get("state") in (
                    "stopping", "ended", "stopped")
            except protocol.ProtocolError as exc:
                self._lose(h, str(exc))
                continue
            except protocol.RemoteError:
                pass
            h.rates()

    def _attach(self, h: Host) -> bool:
        probe = None
        try:
            probe = h.connect("control")
            info = probe.request("info", timeout=ATTACH_TIMEOUT_S)
            sid = str(info.get("session") or info.get("id") or h.address.where) \
                if isinstance(info, dict) else h.address.where
            h.hostname = str(info.get("host") or "") if isinstance(info, dict) else ""
            h.clock.measure(probe)
            session = AttachedSession(h.connect, sid, pull_every=self.pull_every)
            old = h.sessions.get(sid)
            if old is not None:   # the same session again: start from what was mirrored
                session.seed = {e.index: e.ctl.mirror for e in old.entries if e.ctl is not None}
            session.start()
        except (protocol.ProtocolError, protocol.RemoteError, OSError) as exc:
            if probe is not None:
                probe.close()
            h.attempts += 1
            h.why = str(exc)[:200]
            return False
        again = h.state == "lost"
        lost_for = int(time.monotonic() - h.since)
        let_go = [old] if old is not None else []
        with self._lock:   # (closing a session waits on its connections: after, unlocked)
            h.sessions.pop(sid, None)
            h.sessions[sid] = session
            while len(h.sessions) > MAX_SESSIONS:
                let_go.append(h.sessions.pop(next(iter(h.sessions))))
                h.dropped_sessions += 1
            h.sid, h.probe = sid, probe
            h.state, h.since, h.why, h.ended = "attached", time.monotonic(), "", False
            h.attempts, h.next_try = 0, None
            if isinstance(info, dict) and info.get("state") in ("stopping", "ended", "stopped"):
                h.ended = True
        for s in let_go:
            s.close()
        what = ("the same session" if old is not None else f"session {sid}")
        self.notice(f"host {h.name}: attached again after {lost_for} s ({what})" if again
                    else f"host {h.name}: attached to session {sid}")
        return True

    def _lose(self, h: Host, why: str) -> None:
        with self._lock:
            if h.state != "attached":
                return
            h.state, h.since, h.why = "lost", time.monotonic(), why[:200]
            h.attempts = 0
            s, probe = h.session, h.probe
            h.probe = None
            if s is not None:   # what the keeper or the program said last: it had ended
                main = s.entries[0] if s.entries else None
                prog = ((main.ctl.status.extra or {}).get("program") or {}) \
                    if main is not None and main.ctl is not None else {}
                h.ended = h.ended or s.info.get("state") in ("stopping", "ended", "stopped") \
                    or (main is not None and main.state in ("ended", "died")) \
                    or prog.get("running") is False
        if s is not None:
            s.close()     # its mirrors stay: what it sent so far is shown
        if probe is not None:
            probe.close()
        what = "its session ended" if h.ended else "connection lost"
        self.notice(f"host {h.name}: {what}; data so far kept; trying again")

    # ------------------------------------------------------------------ RankSet
    def views(self, raw: bool = False, raw_tokens: int | None = None) -> Any:
        """Every process of every host; each host's clock pairs moved onto this host's clock
        by its measured offset (so the cross-rank analysis aligns ranks across hosts)."""
        rv = super().views(raw, raw_tokens)
        by_name = {h.name: h for h in self.hosts}
        for v in rv.views:
            proc = v.meta.get("process") or {}
            h = by_name.get(proc.get("host"))
            if h is None:
                continue
            off = h.clock.offset_ns
            v.meta["host"] = h.name
            v.meta["clock_offset_ns"] = off
            v.meta["clock_uncertainty_ns"] = h.clock.uncertainty_ns
            sync = v.meta.get("clock_sync")
            if off and isinstance(sync, list):
                v.meta["clock_sync"] = [
                    dict(p, unix_ns=p["unix_ns"] - off, host_offset_ns=off)
                    if isinstance(p, dict) and isinstance(p.get("unix_ns"), int) else p
                    for p in sync]
        return rv

    def world_meta(self) -> dict:
        meta = super().world_meta()
        meta["hosts"] = [h.facts() for h in self.hosts]
        return meta

    def host_lines(self) -> list[str]:
        now = time.monotonic()
        return [h.line(now) for h in self.hosts]

    # ------------------------------------------------------------------ status
    @property
    def status(self) -> SourceStatus:  # type: ignore[override]
        live = [h for h in self.hosts if h.state == "attached" and h.session is not None]
        some = live or [h for h in self.hosts if h.session is not None]
        if some:
            st = some[0].session.status
            st = dataclasses.replace(st, extra=dict(st.extra))
        else:
            st = SourceStatus(state="loading", live=True,
                              message=f"connecting to {len(self.hosts)} hosts")
        st = self._with_notice(st)
        now = time.monotonic()
        lost = [h for h in self.hosts if h.state != "attached"]
        if lost:   # a host that is away: said for as long as it is, with how long ago
            st.message = lost[0].line(now) + (f" (and {len(lost) - 1} more hosts)"
                                              if len(lost) > 1 else "")
        return st

    @status.setter
    def status(self, value: SourceStatus) -> None:
        pass

    def interrupt(self) -> str | None:
        return None   # Ctrl-C detaches an attached UI; it interrupts no host's program


def fleet(addresses: list[Address], connect_timeout: float = 0.0) -> FleetSession:
    """A started fleet (``connect_timeout`` > 0: wait that long for every host first)."""
    f = FleetSession(addresses)
    f.start()
    if connect_timeout > 0:
        f.wait_attached(connect_timeout)
    return f


__all__ = ["FleetSession", "Host", "HostEntry", "Address", "ClockEstimate", "ClockSample",
           "parse_addresses", "is_address", "fleet", "CLOCK_EVERY_S", "BACKOFF_S"]
