"""Snapshot: byte-identical round trip, schema validation, refusal of bad input, privacy."""
from __future__ import annotations

import copy
import gzip
import json
import os
import statistics
from pathlib import Path

import pytest

from tuiprof.errors import TuiprofError
from tuiprof.export import snapshot as snap
from tuiprof.export import snapshot_read
from tuiprof.export.snapshot import SCHEMA_VERSION

from ._independent import token_windows

DOCS = Path(__file__).resolve().parents[2] / "docs" / "snapshot.md"


@pytest.fixture(scope="module")
def eager_file(tmp_path_factory, eager_view):
    p = tmp_path_factory.mktemp("snap") / "eager.json"
    snap.write_snapshot(eager_view, p)
    return p


@pytest.fixture(scope="module")
def eager_doc(eager_file):
    return json.loads(eager_file.read_bytes())


@pytest.mark.parametrize("which", ["eager", "compiled"])
def test_round_trip_is_byte_identical(which, request, tmp_path):
    view = request.getfixturevalue(f"{which}_view")
    a = snap.write_snapshot(view, tmp_path / "a.json")
    back = snap.read_snapshot(a)
    b = snap.write_snapshot(back, tmp_path / "b.json")
    assert a.read_bytes() == b.read_bytes()
    # the reopened view is the view: tokens, aggregates and raw records
    assert [t.to_dict() for t in back.tokens] == [t.to_dict() for t in view.tokens]
    assert {k: v.stats.to_dict() for k, v in back.kernels.items()} == \
           {k: v.stats.to_dict() for k, v in view.kernels.items()}
    assert back.raw == view.raw and back.counters == view.counters
    hm = view.token_stats[("decode", view.meta["mode"])]["host_ms"]
    assert back.token_stats[("decode", view.meta["mode"])]["host_ms"].median == hm.median


def test_written_file_validates_against_schema(eager_doc, compiled_view):
    snap.validate_snapshot(eager_doc, all_records=False)
    doc = json.loads(snap.dumps(snap.snapshot_dict(compiled_view)))
    snap.validate_snapshot(doc)   # every record against the full schema
    assert doc["schema_version"] == SCHEMA_VERSION and doc["format"] == "tuiprof-snapshot"
    import jsonschema
    jsonschema.Draft202012Validator.check_schema(snap.schema())


def test_contents_match_the_recording(eager_doc, eager_raw, eager_facts):
    assert len(eager_doc["tokens"]) == eager_facts.tokens
    assert sum(k["stats"]["count"] for k in eager_doc["kernels"]) == \
        sum(1 for r in eager_raw["records"] if r[0] == "K")
    assert sum(len(r["records"]) for r in eager_doc["raw"]) == len(eager_raw["records"])
    wins = token_windows(eager_raw)
    dec = [(e - s) / 1e6 for p, s, e in wins if p == "decode"]
    m = eager_doc["summary"]["modes"]["eager"]
    assert m["ms_per_token_median"] == pytest.approx(statistics.median(dec), abs=1e-6)
    assert m["tokens_per_s"] == pytest.approx(len(dec) / (sum(dec) / 1000), abs=1e-6)
    assert m["kernels_per_token_median"] == eager_facts.kernels_per_step_median
    ends = [e for _, _, e in wins]
    itl = [(b - a) / 1e6 for a, b in zip(ends, ends[1:])]
    assert m["itl_ms"]["median"] == pytest.approx(statistics.median(itl), abs=1e-6)
    assert m["itl_ms"]["p90"] == pytest.approx(statistics.quantiles(itl, n=10, method="inclusive")[-1], abs=1e-6)
    assert eager_doc["summary"]["ttft_ms"]["last"] == pytest.approx((wins[0][2] - wins[0][1]) / 1e6)
    nvml_cols = eager_raw["meta"]["nvml_columns"]
    assert len(eager_doc["nvml"]) == len(eager_raw["nvml"]) and set(eager_doc["nvml"][0]) == \
        set(nvml_cols[1:]) | {"ts_ns"}


def test_raw_tokens_limit(eager_view, eager_facts, tmp_path):
    doc = snap.snapshot_dict(eager_view, findings=[], raw_tokens=3)
    n = eager_facts.tokens
    assert [r["seq"] for r in doc["raw"]] == [n - 3, n - 2, n - 1]
    p = snap.write_snapshot(eager_view, tmp_path / "s.json", findings=[], raw_tokens=3)
    assert len(snap.read_snapshot(p).raw) == 3


def test_meta_privacy(compiled_view):
    import dataclasses
    home = os.path.expanduser("~")
    meta = dict(compiled_view.meta, host="gpu-node-17", env={"HOME": home, "TOKEN": "x"},
                model_def=f"{home}/models/qwen3.json", user="alice", cwd="/srv/x")
    v = dataclasses.replace(compiled_view, meta=meta)
    m = snap.snapshot_dict(v, findings=[])["meta"]
    assert "host" not in m and "env" not in m and "user" not in m and "cwd" not in m
    assert m["model_def"] == "qwen3.json" and home not in json.dumps(m)
    v2 = dataclasses.replace(compiled_view, meta=dict(meta, share_host=True))
    assert snap.snapshot_dict(v2, findings=[])["meta"]["host"] == "gpu-node-17"


def test_vllm_meta_is_kept_exactly(compiled_view, tmp_path):
    """What a vLLM engine core's scheduler runs with (``meta["vllm"]``) survives the export
    and a round trip, value for value."""
    import dataclasses
    facts = {"vllm": "0.32.0", "hooks_written_for": "0.32.0", "max_num_batched_tokens": 64,
             "max_num_seqs": 256, "chunked_prefill": True, "async_scheduling": False,
             "kv_blocks": 7281, "block_size": 16}
    v = dataclasses.replace(compiled_view, meta=dict(compiled_view.meta, vllm=facts))
    assert snap.snapshot_dict(v, findings=[])["meta"]["vllm"] == facts
    p = snap.write_snapshot(v, tmp_path / "v.json")
    assert json.loads(p.read_text())["meta"]["vllm"] == facts
    assert snap.read_snapshot(p).meta["vllm"] == facts
    assert "`meta.vllm`" in DOCS.read_text()


def _write(tmp_path: Path, obj, name="bad.json") -> Path:
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def _expect(path: Path, *needles: str) -> str:
    with pytest.raises(TuiprofError) as ei:
        snap.read_snapshot(path)
    msg = str(ei.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg
    return msg


@pytest.fixture(scope="module")
def small_doc(compiled_view):
    return snap.snapshot_dict(compiled_view, findings=[], raw_tokens=1)


def test_rejects_bad_input(tmp_path, small_doc):
    _expect(_write(tmp_path, "{not json"), "is not a tuiprof snapshot", "invalid JSON")
    _expect(_write(tmp_path, "[1, 2]"), "is not a tuiprof snapshot", "JSON object")
    _expect(_write(tmp_path, {"format": "chrome-trace"}), "not a tuiprof snapshot")
    newer = dict(small_doc, schema_version=SCHEMA_VERSION + 1)
    _expect(_write(tmp_path, newer), f"snapshot schema version {SCHEMA_VERSION + 1} is newer than "
            "this tuiprof reads", "upgrade")
    bad = dict(small_doc, tokens="lots")
    _expect(_write(tmp_path, bad), "not a tuiprof snapshot", "tokens")
    bad = copy.deepcopy(small_doc)
    bad["kernels"][0]["stats"]["count"] = "7"
    _expect(_write(tmp_path, bad), "not a tuiprof snapshot")
    bad = copy.deepcopy(small_doc)            # a sum of squares below 0 (found by the fuzzer)
    bad["kernels"][0]["stats"]["m2"] = -1.0
    _expect(_write(tmp_path, bad), "not a tuiprof snapshot", "m2")
    bad = copy.deepcopy(small_doc)
    bad["kernels"][0]["stats"]["count"] += 1
    _expect(_write(tmp_path, bad), "does not add up")
    bad = copy.deepcopy(small_doc)
    bad["raw"][0]["records"].append(["K", "x", 1, 2])
    _expect(_write(tmp_path, bad), "malformed raw record")
    bad = copy.deepcopy(small_doc)
    bad["raw"][0]["records"][-1][2] = "__import__('os')"
    _expect(_write(tmp_path, bad), "not a tuiprof snapshot")
    bad = dict(small_doc, extra=1)
    _expect(_write(tmp_path, bad), "not a tuiprof snapshot")


def test_rejects_deep_big_missing_and_binary(tmp_path, small_doc, monkeypatch):
    deep = dict(small_doc, meta={"a": json.loads("[" * 40 + "]" * 40)})
    _expect(_write(tmp_path, deep), "nested deeper")
    _expect(_write(tmp_path, '{"a":' * 100000 + "1" + "}" * 100000), "not a tuiprof snapshot")
    _expect(tmp_path / "nope.json", "no such snapshot")
    _expect(tmp_path, "is a directory")
    gz = tmp_path / "s.json.gz"
    gz.write_bytes(gzip.compress(json.dumps(small_doc).encode()))
    _expect(gz, "not UTF-8")
    ok = _write(tmp_path, small_doc, "ok.json")
    monkeypatch.setattr(snapshot_read, "MAX_BYTES", 1000)
    _expect(ok, "limit")


def test_write_failures_leave_nothing(tmp_path, small_doc, compiled_view, monkeypatch):
    with pytest.raises(TuiprofError, match="cannot write"):
        snap.write_snapshot(compiled_view, tmp_path / "no" / "dir" / "s.json", findings=[])
    target = tmp_path / "s.json"
    target.write_text("previous")

    def full(*_a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(TuiprofError, match="disk is full"):
        snap.write_snapshot(compiled_view, target, findings=[], raw_tokens=0)
    assert target.read_text() == "previous" and [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_findings_are_stored(eager_doc, compiled_view):
    doc = snap.snapshot_dict(compiled_view, findings=[{"id": "x", "title": "t"}], raw_tokens=0)
    assert doc["findings"] == [{"id": "x", "title": "t"}]
    try:
        from tuiprof.analysis import find  # noqa: F401
    except ImportError:
        assert eager_doc["findings"] == []
    else:
        assert eager_doc["findings"] and all("title" in f for f in eager_doc["findings"])


def test_docs_describe_every_field():
    text = DOCS.read_text()
    sch = snap.schema()
    names = set(sch["properties"])
    for d in sch["$defs"].values():
        names |= set(d.get("properties", {}))
    names |= {"ttft_ms", "ms_per_token_median", "tokens_per_s", "itl_ms", "p90", "p99",
              "gpu_busy_fraction", "kernels_per_token_median"}
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, missing
