"""tuiprof's own recording format (docs/recording.md), written from a session's raw window.

A recording is what ``tuiprof replay`` reads: ``{"format": "tuiprof-recording", "meta",
"marks", "records", "nvml", "alloc"}`` gzip'd (see ``docs/recording.md``). It holds the raw
records of the tokens still in the store's ring (``--ring-tokens``), their marks, the NVML
samples and the allocator statistics.
"""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from ..collect.replay import RECORDING_FORMAT, RECORDING_VERSION
from ..errors import TuiprofError
from ..store import StoreView
from ._atomic import atomic_path
from .snapshot import clean_meta

NVML_COLUMNS = ["cupti_ts_ns", "gpm_sm_util", "gpm_sm_occupancy", "gpm_dram_bw_util",
                "gpm_tensor_util", "util_gpu", "util_memory", "mem_used_bytes", "power_mw",
                "sm_clock_mhz"]
ALLOC_COLUMNS = ["step", "num_device_alloc", "num_device_free", "allocation_all_allocated",
                 "active_bytes", "reserved_bytes"]


def recording_dict(view: StoreView) -> dict:
    """Build the recording object from a store view."""
    seqs = {seq for seq, _ in view.raw}
    rows = [t for t in view.tokens if t.seq in seqs and t.done]
    marks, records, alloc = [], [], []
    modes = {}
    decode_step = 0
    prefill_mode = "eager"
    for t in rows:
        if t.phase == "prefill":
            marks.append(["prefill_start", -1, t.start_ns])
            marks.append(["prefill_end", -1, t.end_ns])
            prefill_mode = t.mode
        else:
            marks.append(["step_start", decode_step, t.start_ns])
            marks.append(["step_end", decode_step, t.end_ns])
            modes[str(decode_step)] = t.mode
            if t.alloc:
                alloc.append([decode_step] + [t.alloc.get(c, 0) for c in ALLOC_COLUMNS[1:]])
            decode_step += 1
    for seq, recs in view.raw:
        records.extend(list(r) for r in recs)
    nvml = [[s.get("ts_ns", 0)] + [_finite(s.get(c)) for c in NVML_COLUMNS[1:]] for s in view.nvml]
    # the snapshot's rules: known keys only, no home-directory paths, the host name only when
    # asked (meta["share_host"])
    meta = {k: v for k, v in clean_meta(view.meta).items()
            if isinstance(v, (str, int, float, bool)) or v is None}
    meta.update({"recording_version": RECORDING_VERSION, "nvml_columns": NVML_COLUMNS,
                 "alloc_columns": ALLOC_COLUMNS, "mode_by_step": modes,
                 "prefill_mode": prefill_mode, "decode_tokens": decode_step})
    model_def = clean_meta({"model_def": view.meta.get("model_def")}).get("model_def")
    if isinstance(model_def, dict):
        meta["model_def"] = model_def
    return {"format": RECORDING_FORMAT, "meta": meta, "marks": marks, "records": records,
            "nvml": nvml, "alloc": alloc}


def write_recording(view: StoreView, path: str | Path) -> Path:
    """Write a gzip'd recording atomically (temp file + rename)."""
    p = Path(path)
    data = json.dumps(recording_dict(view), separators=(",", ":")).encode()
    try:
        with atomic_path(p) as tmp:   # a device or a FIFO is written in place, not replaced
            with open(tmp, "wb") as fh:
                with gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
                    gz.write(data)
    except TuiprofError as exc:
        raise TuiprofError(str(exc).replace("cannot write ", "cannot write recording ", 1)) \
            from None
    return p


def _finite(v):
    """JSON has no NaN: a missing or non-finite sample value is written as null."""
    return v if isinstance(v, int) or (isinstance(v, float) and math.isfinite(v)) else None
