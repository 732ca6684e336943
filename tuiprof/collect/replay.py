"""Replay recorded sessions through the same store a live session fills.

Two recording formats are read:

* the first H100 recordings' format (made before ``tuiprof record`` existed): a gzip'd JSON
  object with ``meta``, ``marks``, ``records``, ``nvml``, ``alloc`` (docs/recording.md);
* tuiprof's own recordings (``tuiprof record``, :mod:`tuiprof.export.recording`), which are the
  same format with ``"format": "tuiprof-recording"`` and a version in ``meta``.
"""
from __future__ import annotations

import gzip
import json
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..control import SessionControl
from ..errors import TuiprofError, one_line, safe_text, safe_tree
from ..store import NVML, RECORDS, SessionStore
from ..store.records import DECODE, PREFILL, record_start

RECORDING_FORMAT = "tuiprof-recording"
RECORDING_VERSION = 1
MAX_RECORDING_BYTES = 2 * 1024**3  # decompressed; a recording bigger than this is refused


@dataclass
class Recording:
    """A recording loaded into memory, validated."""

    meta: dict
    marks: list
    records: list
    nvml: list
    alloc: list
    path: str = ""


def load_recording(path: str | Path) -> Recording:
    """Read and validate a recording; raises :class:`TuiprofError` with a one-line reason."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(p, "rb") as fh:
            data = fh.read(MAX_RECORDING_BYTES + 1)
    except FileNotFoundError:
        raise TuiprofError(f"no such recording: {p}") from None
    except (OSError, EOFError, zlib.error) as exc:  # zlib.error: a corrupt deflate stream
        raise TuiprofError(f"cannot read recording {p}: {safe_text(exc, 120)} (is it a truncated or corrupt "
                           f".json.gz?)") from None
    if len(data) > MAX_RECORDING_BYTES:
        raise TuiprofError(f"recording {p} is larger than 2 GiB decompressed; refusing to load it")
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise TuiprofError(f"recording {p} is not valid JSON ({safe_text(exc, 80)}); it may be truncated or corrupt") from None
    return validate_recording(obj, str(p))


def validate_recording(obj: object, where: str = "recording") -> Recording:
    """Check the structure and types of a decoded recording."""
    if not isinstance(obj, dict):
        raise TuiprofError(f"{where}: expected a JSON object with meta/marks/records")
    for key, typ in (("meta", dict), ("marks", list), ("records", list)):
        if not isinstance(obj.get(key), typ):
            raise TuiprofError(f"{where}: missing or malformed '{key}'")
    meta = obj["meta"]
    if obj.get("format", RECORDING_FORMAT) != RECORDING_FORMAT:
        raise TuiprofError(f"{where}: not a tuiprof recording (format {safe_text(repr(obj.get('format')), 40)})")
    version = meta.get("recording_version", 1)
    if not isinstance(version, int) or version > RECORDING_VERSION:
        raise TuiprofError(f"{where}: recording version {safe_text(repr(version), 40)} is newer than this tuiprof "
                           f"reads ({RECORDING_VERSION}); upgrade tuiprof")
    _check_meta(meta, where)
    meta = safe_tree(meta, 65536)  # its words reach the header and the panes
    marks = []
    for m in obj["marks"]:
        if not (isinstance(m, list) and len(m) == 3 and isinstance(m[0], str)
                and _int(m[1]) and _int(m[2])):
            raise TuiprofError(f"{where}: malformed mark {safe_text(m)}")
        marks.append(m)
    records = []
    for r in obj["records"]:
        if not _valid_record(r):
            raise TuiprofError(f"{where}: malformed record {safe_text(r)}")
        records.append(tuple(r))
    nvml = obj.get("nvml", [])
    alloc = obj.get("alloc", [])
    if not isinstance(nvml, list) or not isinstance(alloc, list):
        raise TuiprofError(f"{where}: malformed 'nvml' or 'alloc'")
    ncols = meta.get("nvml_columns", [])
    acols = meta.get("alloc_columns", [])
    if not (isinstance(ncols, list) and all(isinstance(c, str) for c in ncols)
            and isinstance(acols, list) and all(isinstance(c, str) for c in acols)):
        raise TuiprofError(f"{where}: malformed column lists in meta")
    for row in nvml:  # first columns: the NVML timestamp, the allocator's step (integers)
        if not (isinstance(row, list) and len(row) == len(ncols) and all(_num(v) for v in row)
                and _int(row[0])):
            raise TuiprofError(f"{where}: malformed NVML row {safe_text(row)}")
    for row in alloc:
        if not (isinstance(row, list) and len(row) == len(acols) and all(_num(v) for v in row)
                and _int(row[0])):
            raise TuiprofError(f"{where}: malformed allocator row {safe_text(row)}")
    return Recording(meta=meta, marks=marks, records=records, nvml=nvml, alloc=alloc, path=where)


_LIMIT = 1 << 63
_META_STR = ("device", "device_name", "driver", "torch", "model", "mode", "prefill_mode", "dtype",
             "weights", "cuda", "tuiprof", "recording", "source")
_META_INT = ("sm_count", "prompt_tokens", "decode_tokens", "params")


def _check_meta(meta: dict, where: str) -> None:
    """The meta fields replay and the analysis use must have their types."""
    for key in _META_STR:
        if meta.get(key) is not None and not (isinstance(meta[key], str) and len(meta[key]) <= 65536):
            raise TuiprofError(f"{where}: meta '{key}' must be a string")
    for key in _META_INT:
        if meta.get(key) is not None and not _int(meta[key]):
            raise TuiprofError(f"{where}: meta '{key}' must be an integer")
    mbs = meta.get("mode_by_step")
    if mbs is not None and not (isinstance(mbs, dict) and all(isinstance(v, str) for v in mbs.values())):
        raise TuiprofError(f"{where}: meta 'mode_by_step' must map steps to mode names")


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -_LIMIT < v < _LIMIT


def _num(v: object) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and -1e300 < v < 1e300) or v is None


_SHAPES = {"K": (15, 2), "C": (5, 1), "S": (4, 1), "A": (6, 1), "R": (5, 2)}


def _valid_record(r: object) -> bool:
    if not isinstance(r, list) or not r or not isinstance(r[0], str):
        return False
    shape = _SHAPES.get(r[0])
    if shape is None:
        return False
    n, first_int = shape
    if r[0] in ("C", "S"):
        if not (n <= len(r) <= n + 2):
            return False
    elif r[0] == "A":
        if len(r) not in (n, n + 5):   # old recordings: 6 fields; with the detail: 11
            return False
    elif len(r) != n:
        return False
    if r[0] in ("K", "R"):
        if not isinstance(r[1], str) or len(r[1]) > 65536:
            return False
    return all(_int(v) for v in r[first_int:])


def replay_into(rec: Recording, store: SessionStore, speed: float = 0.0,
                stop: Callable[[], bool] | None = None, batch: int = 4096) -> None:
    """Feed a recording through ``store`` in time order.

    ``speed`` 0 replays as fast as possible; 1.0 at recorded speed (2.0 twice as fast...).
    ``stop`` is polled between tokens so a replay thread can be stopped.
    """
    meta = rec.meta
    mode = meta.get("mode", "eager")
    store.meta.update({
        "source": "replay", "recording": Path(rec.path).name if rec.path else "",
        "device": meta.get("device", ""), "sm_count": meta.get("sm_count"),
        "driver": meta.get("driver", ""), "torch": meta.get("torch", ""),
        "model": meta.get("model", ""), "mode": mode,
        "prompt_tokens": meta.get("prompt_tokens"), "decode_tokens": meta.get("decode_tokens"),
    })
    # device_name: a tuiprof recording's "device" is "cuda"; the GPU's peaks come from its name
    for key in ("device_name", "dtype", "weights", "cuda", "tuiprof", "model_def", "params"):
        if key in meta:
            store.meta[key] = meta[key]
    store.set_collector("cupti", True, "replay")
    store.set_collector("nvml", bool(rec.nvml), "replay" if rec.nvml else "no NVML samples in recording")
    # Events on one time line: marks first at equal timestamps so windows open before records.
    records = sorted(rec.records, key=record_start)
    marks = sorted(rec.marks, key=lambda m: m[2])
    ncols = meta.get("nvml_columns", [])
    nvml = sorted((dict(zip(ncols, row)) for row in rec.nvml), key=lambda d: d.get(ncols[0], 0)) if ncols else []
    for s in nvml:
        s["ts_ns"] = s.pop(ncols[0])
    acols = meta.get("alloc_columns", [])
    alloc_by_step = {int(row[0]): dict(zip(acols[1:], row[1:])) for row in rec.alloc} if acols else {}
    mode_by_step = meta.get("mode_by_step") or {}

    ri = ni = 0
    open_seq: int | None = None
    open_start = 0
    t0_rec = marks[0][2] if marks else 0
    t0_wall = time.perf_counter()
    step_of_seq: dict[int, int] = {}

    def flush_until(ts: int) -> None:
        nonlocal ri, ni
        j = ri
        while j < len(records) and record_start(records[j]) < ts:
            j += 1
        while ri < j:
            store.ingest(RECORDS, records[ri:min(j, ri + batch)])
            ri = min(j, ri + batch)
        while ni < len(nvml) and nvml[ni]["ts_ns"] < ts:
            store.ingest(NVML, nvml[ni])
            ni += 1

    for event, step, ts in marks:
        if stop is not None and stop():
            break
        if speed > 0:
            due = (ts - t0_rec) / 1e9 / speed
            delay = due - (time.perf_counter() - t0_wall)
            if delay > 0:
                time.sleep(min(delay, 5.0))
        flush_until(ts)
        if event.endswith("_start"):
            phase = PREFILL if event.startswith("prefill") else DECODE
            m = mode_by_step.get(str(step), mode) if phase == DECODE else meta.get("prefill_mode", "eager")
            open_seq = store.begin_token(phase, m, ts, step)
            open_start = ts
            step_of_seq[open_seq] = step
        elif event.endswith("_end") and open_seq is not None:
            flush_until(ts + 1)
            store.end_token(open_seq, ts, (ts - open_start) / 1e6)
            if step in alloc_by_step and not event.startswith("prefill"):
                store.set_token_alloc(open_seq, alloc_by_step[step])
            open_seq = None
    flush_until(1 << 62)


class ReplayControl(SessionControl):
    """A :class:`SessionControl` that replays a recording on its own thread."""

    def __init__(self, rec: Recording, store: SessionStore, speed: float = 0.0,
                 loop: bool = False) -> None:
        super().__init__(store)
        self.rec, self.speed, self.loop = rec, speed, loop
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tuiprof-replay", daemon=True)
        self.status.state = "idle"
        self.status.mode = rec.meta.get("mode", "eager")
        self.status.message = f"replay of {Path(rec.path).name or 'recording'}"

    def start(self) -> None:
        self.status.state = "decode"
        self._thread.start()

    def _should_stop(self) -> bool:
        while self._paused.is_set() and not self._stop.is_set():
            time.sleep(0.05)
        return self._stop.is_set()

    def _run(self) -> None:
        try:
            while True:
                replay_into(self.rec, self.store, self.speed, stop=self._should_stop)
                if not self.loop or self._stop.is_set():
                    break
            self.status.state = "stopped" if self._stop.is_set() else "done"
        except Exception as exc:  # shown on the status line, never a traceback
            self.status.state = "error"
            self.status.message = f"replay failed: {one_line(exc)}"

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def toggle_pause(self) -> str:
        if self._paused.is_set():
            self._paused.clear()
            self.status.state = "decode"
            return "replay resumed"
        self._paused.set()
        self.status.state = "paused"
        return "replay paused"

    def join(self, timeout: float | None = None) -> None:
        """Wait for the replay thread to finish."""
        self._thread.join(timeout)
