"""What the commands share: one-line messages, signal handling, and a headless run's outputs
(the snapshot, the recording, the printed summary)."""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from ..phases import MODES
from ..terminal import detach_terminal
from ..text import printable


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP before a command installs its own handler (e.g. while importing torch)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def raise_interrupted(signum, frame):
    raise Interrupted(signum)


def handle_signals(handler, signals) -> dict:
    """Install ``handler`` for ``signals``; returns the previous handlers to restore.

    A SIGHUP that is ignored (``nohup tuiprof ...``) stays ignored.
    """
    old = {}
    for s in signals:
        try:
            if s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN:
                continue
            old[s] = signal.signal(s, handler)
        except (ValueError, AttributeError):  # not the main thread, or no such signal
            pass
    return old


def stop_on_signals(out: Path, on_first=None) -> tuple[list[int], dict]:
    """A headless run's signals: the first SIGINT/SIGTERM/SIGHUP stops it cleanly and keeps the
    data (``on_first``), a second one quits at once. Returns (signals seen, old handlers)."""
    stopping: list[int] = []

    def on_signal(signum, frame):
        stopping.append(signum)
        if signum == signal.SIGHUP:
            detach_terminal()
        if len(stopping) > 1:
            raise Interrupted(signum)
        say(f"tuiprof: {signal.Signals(signum).name}: stopping, writing {out} "
             f"(again to quit at once)")
        if on_first is not None:
            on_first()

    return stopping, handle_signals(on_signal, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


def say(line: str) -> None:
    """One line on stderr, made printable (it may quote a path, a name or a program's words);
    a closed terminal (SIGHUP) must not turn it into a traceback."""
    try:
        print(printable(line), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def exit_if_busy(prof, code: int) -> int:
    """A model load or a torch.compile still running after the session stopped cannot be
    interrupted, and ending the interpreter under it aborts the process ("terminate called
    without an active exception"). The data is written by now, so end the process at once."""
    if not prof.busy:
        return code
    say("tuiprof: a model load or torch.compile was still running; exiting without waiting for it")
    exit_now(code)


def exit_now(code: int) -> None:
    """End the process now, its output flushed, with no interpreter teardown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


_END_AT_ONCE: list[bool] = []


def end_at_once() -> None:
    """This command's work is done and written: the process may end without the interpreter's
    teardown (torch's modules, the CUDA context, the session's idle threads: about a second of
    a one-token headless run that a user waits for). Only ``python -m tuiprof`` acts on it
    (:func:`ending_at_once`); a caller of ``main()`` in its own process is left alone."""
    _END_AT_ONCE.append(True)


def ending_at_once() -> bool:
    return bool(_END_AT_ONCE)


def write_outputs(view, out: Path, record: str | None) -> Path:
    """Write the snapshot (and the recording); returns where the snapshot went."""
    from ..export.snapshot import write_snapshot  # noqa: PLC0415

    written = write_or_fallback(write_snapshot, view, out, "snapshot")
    say(f"tuiprof: snapshot written to {written}")
    if record:
        from ..export.recording import write_recording  # noqa: PLC0415
        rec = write_or_fallback(write_recording, view, Path(record), "recording")
        say(f"tuiprof: recording written to {rec}")
    return written


def _start_dir() -> Path | None:
    try:
        return Path(os.getcwd())
    except OSError:   # started in a directory already removed
        return None


# Where the command started and the temp directory, taken when tuiprof starts: a program may
# remove its working directory (tuiprof's too, when it is the same) before the run ends, and
# with no TMPDIR the temp directory's last choice is the current one.
START_DIR = _start_dir()
TEMP_DIR = Path(tempfile.gettempdir()).absolute()


def output_path(path: str | Path) -> Path:
    """An output path made absolute against the directory tuiprof started in, before the run:
    a program that changes or removes its working directory cannot move or lose it."""
    p = Path(path)
    return p if p.is_absolute() or START_DIR is None else START_DIR / p


def fallback_dirs() -> list[Path]:
    """Where a run's data goes when its own path fails at the end: the directory tuiprof
    started in, then the temp directory (both known before the run: never the current
    directory, which may be gone)."""
    return list(dict.fromkeys(d for d in (START_DIR, TEMP_DIR) if d is not None))


def write_or_fallback(write, view, path: Path, what: str) -> Path:
    """``write(view, path)``; if that fails at the end of a run (the disk filled, the directory
    went away), the same data to a fallback location, named in the message. Raises the
    original error only when no location can be written."""
    from ..errors import TuiprofError  # noqa: PLC0415

    try:
        write(view, path)
        return Path(path)
    except TuiprofError as exc:
        first = exc
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for d in fallback_dirs():
        alt = d / f"tuiprof-rescued-{stamp}-{Path(path).name}"
        try:
            write(view, alt)
        except TuiprofError:
            continue
        say(f"tuiprof: {first}; the {what} was written to {alt} instead")
        return alt
    raise first


def print_summary(view, prof=None) -> None:
    from ..store import PROGRAM_CONFIG  # noqa: PLC0415

    meta = view.meta
    if meta.get("weights") and meta.get("source") != "program":
        print(printable(f"model {meta.get('model')} on {meta.get('device')} ({meta.get('dtype')}), "
                        f"weights: {meta.get('weights')}"))
    for c, st in sorted(view.collectors.items()):
        if not st.get("ok"):
            print(printable(st.get("message")))
    if meta.get("source") == "program":
        print_steps(view)
    from ..export.summary import tracing_mode  # noqa: PLC0415

    print(f"tracing: {printable(tracing_mode(view), 120)}")
    for key in view.config_keys:
        sub = view.select(key)
        dec = [t for t in sub.tokens if t.phase == "decode" and t.done and not t.apart]
        for mode in MODES:
            ts = [t for t in dec if t.mode == mode]
            if not ts:
                continue
            wall = sorted(t.host_ms for t in ts)
            steps_s = len(ts) / (sum(wall) / 1e3)
            seqs = sum(t.batch for t in ts) / len(ts)
            traced = sorted(t.kernels for t in ts if t.sampled) or [0]
            k = traced[len(traced) // 2]
            ntraced = sum(1 for t in ts if t.sampled)
            per = f" ({seqs:g} seq × {steps_s:.1f} steps/s)" if seqs != 1 else ""
            batches = sorted({t.batch for t in ts})
            spread = (f" (batch {batches[0]}-{batches[-1]}, {seqs:.1f} on average)"
                      if len(batches) > 1 else "")
            where = "program" if key == PROGRAM_CONFIG else f"batch {key}"
            print(f"{printable(mode, 20):>9} {printable(where, 40)}: {len(ts)} decode steps{spread}, "
                  f"{seqs * steps_s:.1f} tokens/s{per}, {step_times(ts)}, {k} kernels/step"
                  + (f" ({ntraced} traced steps)" if ntraced < len(ts) else ""))
    if view.requests:
        print_requests(view)
    if prof is not None and prof.status.state == "error":
        print(f"tuiprof: {printable(prof.status.message)}", file=sys.stderr)
    if view.counters.get("dropped"):
        print(f"warning: {view.counters['dropped']} CUPTI records dropped", file=sys.stderr)
    if type(view.counters.get("ends_before_start")) is int and view.counters["ends_before_start"]:
        print(f"warning: {view.counters['ends_before_start']} records that end before they "
              "start were left out (no negative durations; counters.ends_before_start)",
              file=sys.stderr)


def step_times(rows) -> str:
    """The median step time of untraced and of traced steps apart: a step measured while its
    kernels were traced runs slower (``median 24.10 ms/step untraced, 43.30 traced (12)``)."""
    untraced = sorted(t.host_ms for t in rows if t.attached is False)
    # as the store's statistics: a step at a burst's edge (attached, not traced) on neither side
    traced = sorted(t.host_ms for t in rows if t.attached is True and t.sampled)
    if not untraced and not traced:   # not known (a replay, an older snapshot)
        wall = sorted(t.host_ms for t in rows)
        return f"median {wall[len(wall) // 2]:.2f} ms/step"
    parts = []
    if untraced:
        parts.append(f"median {untraced[len(untraced) // 2]:.2f} ms/step untraced")
    if traced:
        med = f"{traced[len(traced) // 2]:.2f}"
        parts.append(f"{med} traced ({len(traced)})" if untraced
                     else f"median {med} ms/step, every step measured while traced")
    return ", ".join(parts)


def print_steps(view) -> None:
    """Where a program's steps came from."""
    meta = view.meta
    src = printable(meta.get("step_source") or "none", 40)
    counts = meta.get("step_sources") or {}
    phases: dict[str, int] = {}  # over the whole run (the token stats), not the rows kept
    for (ph, _mode), ts in (view.token_stats or {}).items():
        n = sum(ts[k].count for k in ("host_ms", "compiling_ms", "rerecord_ms") if k in ts)
        phases[ph] = phases.get(ph, 0) + n
    windows = phases.pop("window", 0)
    split = ", ".join(f"{n} {printable(p, 40)}" for p, n in sorted(phases.items()))
    if meta.get("steps_elsewhere") and src in ("windows", "none"):
        print(f"steps: none in this process; they run in "
              f"{printable(meta['steps_elsewhere'], 80)}")
    elif src == "windows":
        print(f"steps: none marked by the program: {counts.get('windows', 0)} windows of "
              f"{meta.get('window_ms', 100):g} ms (see the no-step-boundaries finding)")
    elif src == "none":
        print("steps: none (the program ended before any step)")
    else:
        auto = meta.get("auto_steps") or {}
        if src == "auto" and auto.get("confidence_label") == "by launch":
            print(f"steps: {printable(auto.get('loop', ''), 120)}")
        elif src == "auto" and auto.get("found"):  # a native program's loop, from its kernels
            print(f"steps: a decode loop of {auto.get('kernels_per_step')} kernels found in the "
                  f"kernel stream (confidence {auto.get('confidence')} "
                  f"{auto.get('confidence_label')}; boundary: {auto.get('boundary')}; "
                  f"{auto.get('identical_steps')} steps identical)")
        print(f"steps from {src}: {counts.get(src, 0)}" + (f" ({split})" if split else "")
              + (f"; {counts['ignored_nested']} nested marks ignored"
                 if counts.get("ignored_nested") else "")
              + (f"; before and between them {windows} windows of {meta.get('window_ms', 100):g}"
                 " ms (phase window)" if windows else ""))


def print_requests(view) -> None:
    """A server's requests: counts and latency percentiles over every request kept."""
    from ..analysis.requests import pct, window  # noqa: PLC0415

    req = view.requests
    c = req.counts
    w = window(view, seconds=1e9)
    line = (f"requests: {c.get('finished', 0)} finished, {c.get('failed', 0)} failed, "
            f"{len(req.in_flight)} in flight (of {c.get('arrived', 0)}; from "
            f"{', '.join(f'{k} {v}' for k, v in req.sources.items()) or 'nowhere'}); "
            f"{w.requests_per_s:.2f} req/s, {w.tokens_per_s:,.1f} output tokens/s")
    if c.get("warmup"):
        line += f"; {c['warmup']} warm-up request{'s' if c['warmup'] != 1 else ''} apart"
    print(line)
    for metric, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("queue_ms", "queue wait"),
                          ("e2e_ms", "end to end")):
        q = w.quantiles.get(metric)
        if q is not None:
            print(f"  {label:<10} p50 {q[0]:9.2f} ms  p90 {q[1]:9.2f} ms  p99 {q[2]:9.2f} ms")
    out = [r for r in req.finished if r.model_ns is not None and r.model_ns >= 0 and r.e2e_ms]
    if out:
        o = pct([(r.finish_ns - r.arrival_ns - r.model_ns) / 1e6 for r in out], 0.5)
        e = pct([r.e2e_ms for r in out], 0.5)
        print(f"  outside model steps: {o:.2f} of {e:.2f} ms a request (p50)")
    proxied = [r for r in req.rows if r.outside]
    if proxied:
        counted = sum(1 for r in proxied if r.tokens_from == "chunks")
        print(f"  {req.sources.get('proxy', len(proxied))} seen through the proxy, from outside "
              f"the engine: no queue wait, TTFT to the first streamed chunk"
              + (f"; {counted} sent no usage (output = chunks counted)" if counted else ""))
    if req.misuse:
        print("  misuse (counted, never raised): "
              + ", ".join(f"{k} {v}" for k, v in req.misuse.items()), file=sys.stderr)
