"""One UI over several hosts' sessions (``tuiprof attach HOST1:PORT HOST2:PORT``), with real
processes: a two-node ``torchrun --nnodes 2`` job (two agents, c10d rendezvous on 127.0.0.1,
gloo on the CPU, one worker each), each node under a detached ``tuiprof run --detach --listen``
session of its own (the "hosts" A and B, reached over TCP with their token). One fleet (the
attach app in a Pilot, and the merged views under it) lists both hosts' processes, compares
the job's two ranks across the hosts, and their steps of one index overlap on the aligned
clocks. Node B is then killed whole (its keeper's process group: a node that crashed): B reads
as lost with its data kept; the job restarts on both nodes, and both hosts are attached again
beside what they had. Also: the clock offset estimator against a real server whose clock is
5 s ahead, and the command line's addresses."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest

from tuiprof.sessions import protocol, runtime
from tuiprof.sessions.fleet import (Address, ClockEstimate, FleetSession, is_address,
                                  parse_addresses)
from tuiprof.store.rank_set import jobs, process_facts

from ._helpers import quit_app, runtime_dir, screen_text
from .fleet_nodes import (STEPS_FOREVER, detach, env, free_port, kill_node, listening, nodes,
                          ours)
from .relay import Relay


def _end_all(pids: set) -> None:
    """No keeper, session process, agent or worker outlives the tests (by pid only)."""
    root = runtime.runtime_root()
    for d in root.iterdir():
        info = runtime.read_info(d) or {}
        for key in ("holder_pid", "pid"):
            pid = info.get(key)
            if pid:
                pids.add(pid)
        holder = info.get("holder_pid")
        if holder and runtime.pid_alive(holder) and ours(holder):
            try:
                os.killpg(holder, signal.SIGKILL)
            except OSError:
                pass
    for pid in pids:
        if pid and runtime.pid_alive(pid) and ours(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _job(rv):
    found = [(k, j) for k, j in jobs(rv) if k.startswith("torchrun:fleet")]
    return found[-1] if found else (None, None)


def _decode_steps(view) -> dict:
    return {(t.cycle, t.step): t for t in view.tokens if t.done and t.phase == "decode"}


def _lined_up(job) -> tuple:
    """(steps both ranks have, how many of them overlap in time on the aligned clocks, the
    median step and the median end skew in ns)."""
    offsets = job.clock.offsets_ns
    a, b = (_decode_steps(v) for v in job.views)
    common = sorted(set(a) & set(b))
    overlap, skews, durations = 0, [], []
    for key in common:
        ta, tb = a[key], b[key]
        sa, ea = ta.start_ns - offsets[0], ta.end_ns - offsets[0]
        sb, eb = tb.start_ns - offsets[1], tb.end_ns - offsets[1]
        overlap += sa < eb and sb < ea
        skews.append(abs(ea - eb))
        durations.append(ea - sa)
    mid = len(common) // 2
    return (len(common), overlap, sorted(durations)[mid] if common else 0,
            sorted(skews)[mid] if common else 0)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    from tuiprof.ui.app import make_app
    from tuiprof.ui.screens.all_processes import ProcessesScreen

    mp = pytest.MonkeyPatch()
    runtime_dir(mp)
    tmp = tmp_path_factory.mktemp("fleet")
    token = tmp / "token"
    token.write_text("fleet-test-token-" + os.urandom(12).hex() + "\n")
    token.chmod(0o600)
    ports = (free_port(), free_port())
    pids: set = set()
    seen: dict = {}
    fleet = None
    try:
        first = nodes(tmp, ports, token)
        seen["first"] = first
        fleet = FleetSession(parse_addresses([f"A=127.0.0.1:{ports[0]}",
                                              f"B=127.0.0.1:{ports[1]}"],
                                             [token.read_text().strip()]))
        fleet.start()
        app = make_app(fleet, export_dir=tmp, refresh_hz=4.0)

        async def until(pred, seconds, what):
            t_end = time.monotonic() + seconds
            while not pred():
                assert time.monotonic() < t_end, (what, [h.line() for h in fleet.hosts],
                                                  screen_text(app)[-2500:])
                app.refresh_view()
                await asyncio.sleep(0.25)

        def steps_on_both(n: int, sids=None) -> bool:
            key, job = _job(fleet.views())
            if job is None:
                return False
            ok = all(len(_decode_steps(v)) > n for v in job.views)
            return ok and (sids is None or {process_facts(v)["session"] for v in job.views}
                           == set(sids))

        async def run():
            async with app.run_test(size=(200, 50)) as pilot:
                await until(lambda: all(h.state == "attached" for h in fleet.hosts), 60,
                            "attached")
                await until(lambda: steps_on_both(40), 240, "steps on both ranks")
                rv = fleet.views()
                seen["views"] = rv
                seen["hosts"] = [h.facts() for h in fleet.hosts]
                await pilot.press("g")
                seen["g"] = (app.rank, app.last_message, screen_text(app))
                await pilot.press("a")
                await until(lambda: isinstance(app.screen, ProcessesScreen)
                            and "torch.distributed job" in screen_text(app)
                            and "ms/step" in screen_text(app), 60, "a")
                seen["a"] = screen_text(app)
                # node B crashes: everything of it at once
                before = {process_facts(v)["pid"]: len(v.tokens) for v in fleet.views().views
                          if process_facts(v)["host"] == "B"}
                kill_node(first[1], list(before))
                await until(lambda: fleet.hosts[1].state == "lost"
                            and "host B: connection lost" in screen_text(app), 60, "B lost")
                seen["lost"] = screen_text(app)
                seen["lost_views"] = fleet.views()
                seen["lost_export"] = fleet.export_view()   # what e writes
                seen["before"] = before
                seen["lost_status"] = fleet.status.message
                # the job restarts on both nodes, at the same addresses
                await until(lambda: all(not runtime.pid_alive(
                    (runtime.read_info(runtime.runtime_root() / s) or {}).get("holder_pid"))
                    for s in first), 120, "the first job's sessions ended")
                await until(lambda: fleet.hosts[0].state == "lost", 30, "A's session ended")
                seen["a_ended"] = fleet.hosts[0].line()
                second = nodes(tmp, ports, token)
                seen["second"] = second
                await until(lambda: [h.sid for h in fleet.hosts] == second
                            and all(h.state == "attached" for h in fleet.hosts), 90,
                            "attached again")
                await until(lambda: steps_on_both(10, second), 240, "the new job's steps")
                seen["again"] = screen_text(app)
                seen["again_views"] = fleet.views()
                seen["notices"] = [line for _, line in fleet.notices]
                await quit_app(pilot, app)
            seen["exit"] = getattr(app, "_exit_args", None)

        asyncio.run(run())
    finally:
        if fleet is not None:
            for e in fleet.entries:
                pids.add(e.pid)
            fleet.close()
        _end_all(pids)
        mp.undo()
    return seen


def test_every_hosts_processes_in_one_selector(two_nodes):
    seen = two_nodes
    rv = seen["views"]
    by_host: dict = {}
    for v in rv.views:
        p = process_facts(v)
        by_host.setdefault(p["host"], []).append(p)
    assert sorted(by_host) == ["A", "B"]
    for host, sid in zip(("A", "B"), seen["first"]):
        procs = by_host[host]
        assert {p["session"] for p in procs} == {sid}
        assert any(p["name"] == "tp_job.py" for p in procs)    # the worker, under the agent
        assert any(p["title"].startswith(f"{host}:{p['pid']} ") for p in procs)
    rank, message, screen = seen["g"]
    assert rank != 0 and "tp_job.py rank" in message
    assert message.split(": ", 1)[1].split(" ")[0].split(":")[0] in ("A", "B")
    assert "host " in screen and "pid" in screen                 # the header says which
    text = seen["a"]
    assert "processes on 2 hosts" in text
    assert "host A: attached to session" in text and "host B: attached to session" in text
    assert "clock " in text and " ± " in text                    # the residual, per host
    assert "torch.distributed job torchrun:fleet" in text and "2 ranks" in text
    assert "ranks on 2 hosts, clocks aligned from round trips: " in text
    assert "joined the job" in text and "ms apart on the aligned clocks" in text


def test_the_ranks_steps_line_up_across_hosts(two_nodes):
    rv = two_nodes["views"]
    key, job = _job(rv)
    assert key is not None
    hosts = [process_facts(v)["host"] for v in job.views]
    assert sorted(hosts) == ["A", "B"]                          # one rank on each host
    for v in job.views:
        assert v.meta["world_size"] == 2 and v.meta["backend"] == "gloo"
        assert isinstance(v.meta["clock_uncertainty_ns"], int)
    n, overlap, step_ns, skew_ns = _lined_up(job)
    assert n > 40 and overlap == n                  # the same step runs at once on both
    assert skew_ns < step_ns                        # they end within a step of each other
    for h in two_nodes["hosts"]:
        assert h["clock_offset_ns"] is not None and h["clock_uncertainty_ns"] is not None
        # one machine, one clock: the estimate's error is within its bound
        assert abs(h["clock_offset_ns"]) <= h["clock_uncertainty_ns"] + 1_000


def test_a_hosts_offset_moves_its_ranks(two_nodes):
    """The measured offset is what aligns the hosts: had B's clock read 1 s ahead, its ranks
    are moved back by that second (the pairs each rank recorded carry it into the analysis)."""
    rv = two_nodes["views"]
    key, job = _job(rv)
    b = next(i for i, v in enumerate(job.views) if process_facts(v)["host"] == "B")
    shifted = []
    for i, v in enumerate(job.views):
        meta = dict(v.meta)
        if i == b:
            meta["clock_sync"] = [dict(p, unix_ns=p["unix_ns"] - 10**9)
                                  for p in v.meta["clock_sync"]]
        shifted.append(dataclasses.replace(v, meta=meta))
    moved = type(job)(tuple(shifted), job.meta)
    assert moved.clock.applied
    assert abs(abs(moved.clock.offsets_ns[b] - moved.clock.offsets_ns[1 - b]) - 10**9) < 10**7


def test_a_lost_host_reads_as_such_and_keeps_its_data(two_nodes):
    seen = two_nodes
    text = seen["lost"]
    assert "host B: connection lost" in text and "data so far kept" in text
    assert "host B: connection lost" in seen["lost_status"] or "host B" in seen["lost_status"]
    kept = {process_facts(v)["pid"]: v for v in seen["lost_views"].views
            if process_facts(v)["host"] == "B"}
    # A's rank failed with B's (its collectives had no peer): its session ended by itself
    assert "host A: its session ended" in seen["a_ended"] and "data so far kept" in seen["a_ended"]
    for pid, n in seen["before"].items():
        assert pid in kept and len(kept[pid].tokens) >= n      # nothing it had sent is lost
        assert process_facts(kept[pid])["state"] in ("lost", "ended", "died")
    exported = {process_facts(v)["pid"]: v for v in seen["lost_export"].views}
    for pid, n in seen["before"].items():
        assert len(exported[pid].tokens) >= n                   # and in e's snapshot


def test_hosts_that_come_back_are_attached_again(two_nodes):
    seen = two_nodes
    assert any("host B: attached again after" in line for line in seen["notices"])
    rv = seen["again_views"]
    sessions = {(process_facts(v)["host"], process_facts(v)["session"]) for v in rv.views}
    for host, old, new in zip(("A", "B"), seen["first"], seen["second"]):
        assert (host, old) in sessions and (host, new) in sessions   # the old data stays
    key, job = _job(rv)
    assert {process_facts(v)["session"] for v in job.views} == set(seen["second"])
    assert "host A: attached to session" in seen["again"]
    assert "host B: attached to session" in seen["again"]
    assert seen["exit"] and "detached from 2 hosts" in (seen["exit"]["message"] or "")


# ---------------------------------------------------------------------------- cheap ones
class _Ahead(protocol.Handler):
    def request(self, op, args):
        if op == "clock":
            return time.time_ns() + 5 * 10**9
        return super().request(op, args)


def test_the_offset_of_a_clock_5_s_ahead_is_found_within_half_a_round_trip(tmp_path):
    port = free_port()
    srv = protocol.Server(_Ahead, str(tmp_path / "s.sock"), tcp=("127.0.0.1", port),
                          token="t" * 24).start()
    try:
        c = Address("X", host="127.0.0.1", port=port, token="t" * 24).connect("control")
        est = ClockEstimate(keep=8)
        for _ in range(5):
            est.measure(c)
        c.close(bye=True)
    finally:
        srv.close()
    assert len(est.samples) == 8                                 # bounded
    best = est.best()
    assert best.rtt_ns == min(s.rtt_ns for s in est.samples)
    assert abs(est.offset_ns - 5 * 10**9) <= est.uncertainty_ns + 1
    assert "clock +5000." in est.text() and " ± " in est.text()


def test_an_older_keeper_without_clock_is_said_plainly(tmp_path):
    srv = protocol.Server(protocol.Handler, str(tmp_path / "s.sock")).start()
    try:
        c = protocol.Client.unix(str(tmp_path / "s.sock"), role="control")
        est = ClockEstimate()
        est.measure(c)
        c.close(bye=True)
    finally:
        srv.close()
    assert est.unsupported and est.offset_ns is None and "older tuiprof" in est.text()


def test_addresses_from_the_command_line():
    a = parse_addresses(["A=10.0.0.1:7777", "/tmp/b.sock", "h:1"], ["tok"])
    assert [(x.name, x.host, x.port, x.path, x.token) for x in a] == [
        ("A", "10.0.0.1", 7777, None, "tok"), ("b.sock", None, None, "/tmp/b.sock", None),
        ("h:1", "h", 1, None, "tok")]
    assert [x.token for x in parse_addresses(["a:1", "b:2"], ["t1", "t2"])] == ["t1", "t2"]
    for bad, tokens in ((["a:1"], []), (["a:x"], ["t"]), (["a:1", "b:2", "c:3"], ["1", "2"]),
                        (["x=a:1", "x=b:2"], ["t"])):
        with pytest.raises(ValueError):
            parse_addresses(bad, tokens)
    assert is_address("10.0.0.1:7777") and is_address("B=./s.sock") and not is_address("3fa9c1")


def test_unreachable_hosts_are_retried_with_a_capped_backoff(tmp_path):
    from tuiprof.sessions import fleet as fleet_mod

    f = FleetSession([Address("Z", path=str(tmp_path / "nobody.sock"))])
    f.start()
    try:
        t_end = time.monotonic() + 20
        while f.hosts[0].attempts < 2 and time.monotonic() < t_end:
            time.sleep(0.1)
        h = f.hosts[0]
        assert h.state == "connecting" and h.attempts >= 2 and h.next_try is not None
        assert "host Z: connecting to" in h.line() and "tries" in h.line()
        assert f.status.state == "loading" and "host Z" in f.status.message
    finally:
        f.close()
    assert max(fleet_mod.BACKOFF_S) <= 30


def test_two_nodes_started_in_one_second_into_one_directory_each_get_their_log(tmp_path):
    """The nodes of a job on one machine start their sessions at the same second with one
    export directory: each program's output goes to a log of its own."""
    from tuiprof.sessions.launch import _new_log

    logs = [_new_log(tmp_path, "tuiprof-tp_job-20261129-050855") for _ in range(3)]
    assert [p.name for p in logs] == ["tuiprof-tp_job-20261129-050855.log",
                                      "tuiprof-tp_job-20261129-050855-2.log",
                                      "tuiprof-tp_job-20261129-050855-3.log"]
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in logs)


def test_a_dropped_link_picks_up_the_same_session(tmp_path):
    """Two hosts, mixed: A over a Unix socket (the session's own, as ``ssh -L`` forwards it),
    B over TCP through a link that drops and comes back (the session itself goes on): B reads
    as lost with its steps kept, then is attached again to the same session, its process
    listed once, its steps going on from where they were."""
    mp = pytest.MonkeyPatch()
    runtime_dir(mp)
    token = tmp_path / "token"
    port = free_port()
    sids: list = []
    f = None
    link = None
    try:
        for options in ((), listening(port, token)):
            sids.append(detach(tmp_path, ["python", STEPS_FOREVER], *options))
        link = Relay(port).up()
        sock = str(runtime.runtime_root() / sids[0] / "s.sock")
        f = FleetSession(parse_addresses([f"A={sock}", f"B=127.0.0.1:{link.port}"],
                                         [token.read_text().strip()]))
        f.start()

        def b_steps() -> int:
            vs = [v for v in f.views().views if process_facts(v)["host"] == "B"]
            return max((len(v.tokens) for v in vs), default=0)

        def wait(pred, seconds, what):
            t_end = time.monotonic() + seconds
            while not pred():
                assert time.monotonic() < t_end, (what, [h.line() for h in f.hosts])
                time.sleep(0.2)

        wait(lambda: all(h.state == "attached" for h in f.hosts) and b_steps() > 20, 60,
             "both attached, B stepping")
        assert [h.sid for h in f.hosts] == sids
        link.down()
        wait(lambda: f.hosts[1].state == "lost", 30, "B lost")
        kept = b_steps()
        assert kept > 20 and "host B: connection lost" in f.status.message
        assert f.hosts[0].state == "attached"            # A is not touched
        link.up()
        wait(lambda: f.hosts[1].state == "attached", 60, "B again")
        assert f.hosts[1].sid == sids[1]
        assert any("host B: attached again after" in line and "the same session" in line
                   for _, line in f.notices)
        assert b_steps() >= kept                          # from its mirror, then the store's
        wait(lambda: b_steps() > kept + 10, 30, "B's steps go on")
        assert len([e for e in f.entries if e.host.name == "B"]) == 1
        assert len(f.entries) == 2
    finally:
        if f is not None:
            f.close()
        if link is not None:
            link.down()
        _end_all(set())
        mp.undo()


def test_no_host_answering_is_one_line(tmp_path):
    token = tmp_path / "token"
    token.write_text("x" * 32)
    out = subprocess.run([sys.executable, "-m", "tuiprof", "attach",
                          f"A={tmp_path / 'nobody.sock'}", f"B=127.0.0.1:{free_port()}",
                          "--token-file", str(token)], capture_output=True, text=True,
                         timeout=120, env=env())
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot attach to any host: A: cannot connect" in lines[0]
    assert "; B: cannot connect to 127.0.0.1:" in lines[0]
