"""Bad input reaches the user as one line, never a traceback, never code execution.

Unknown models, malformed model directories, and snapshots/recordings that are truncated,
corrupt, from a newer schema, a pickle in disguise, or hostile, through the real CLI entry
point (``tuiprof.cli.main``, in-process) and the loaders. The property-based fuzzing of the
two loaders is in test_fuzz_loaders.py.
"""
from __future__ import annotations

import gzip
import json
import pickle
import re
from pathlib import Path

import pytest

from tuiprof.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = json.loads((REPO / "models" / "qwen3-tiny.json").read_text())["config"]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out, out.err
    return rc, out.out, out.err


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("tuiprof: ")
             and not ln.startswith(("tuiprof: loading", "tuiprof: snapshot written"))]
    assert len(lines) == 1, err
    assert len(lines[0]) < 600, lines[0]
    return lines[0]


# ------------------------------------------------------------------ models
@pytest.mark.parametrize("spec, says", [
    ("no-such-model", "unknown model 'no-such-model'; known:"),
    ("./no/such/dir", "no such model directory: ./no/such/dir"),
    ("someone/not-cached-anywhere", "is not in the local Hugging Face cache and tuiprof never downloads"),
])
def test_bad_model_name(capsys, tmp_path, spec, says):
    rc, _, err = _run(capsys, "--model", spec, "--headless", "--json", str(tmp_path / "s.json"))
    assert rc == 2
    assert says in _one_error_line(err), err
    assert not (tmp_path / "s.json").exists()       # nothing was measured, nothing written


def _model_dir(tmp_path: Path, config, extra: dict | None = None) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    for name, data in (extra or {}).items():
        (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return d


@pytest.mark.parametrize("config, extra, says", [
    ('{"model_type": "qwen3", "hidden_size": 64', None, "config.json is not valid JSON"),
    ("[1, 2, 3]", None, "has no 'model_type'"),
    ({"hidden_size": 64}, None, "has no 'model_type'"),
    (dict(TINY_CONFIG), {"pytorch_model.bin": b"\x80\x04K\x01."}, "has only pickle (*.bin) weights"),
], ids=["truncated-json", "not-an-object", "no-model-type", "pickle-weights"])
def test_malformed_model_dir_is_refused_before_loading(capsys, tmp_path, config, extra, says):
    d = _model_dir(tmp_path, config, extra)
    rc, _, err = _run(capsys, "--model", str(d), "--headless", "--json", str(tmp_path / "s.json"))
    assert rc == 2 and says in _one_error_line(err), err


@pytest.mark.parametrize("config, extra, says", [
    ({"model_type": "frobnicator"}, None, "model type 'frobnicator' is unknown"),
    (dict(TINY_CONFIG, hidden_size="sixty-four"), None, ""),
    (dict(TINY_CONFIG), {"model.safetensors": b"\x00" * 7 + b"garbage"}, "cannot read weights"),
], ids=["unknown-model-type", "wrong-type-field", "corrupt-safetensors"])
def test_malformed_model_dir_fails_the_run_with_one_line(capsys, tmp_path, config, extra, says):
    """These are found while building the model (on the loader thread): the run ends in state
    "error" with the reason on one line, exit code 1, and the (empty) snapshot is still written."""
    d = _model_dir(tmp_path, config, extra)
    out = tmp_path / "s.json"
    rc, _, err = _run(capsys, "--model", str(d), "--headless", "--json", str(out))
    line = _one_error_line(err)
    assert rc == 1 and says in line, err
    print(line)
    assert out.exists()


def test_remote_code_is_never_run_unless_asked(capsys, tmp_path):
    """A model directory that ships its own modeling code: without --trust-remote-code the code
    is not imported (its import would create a marker file)."""
    marker = tmp_path / "PWNED"
    code = f"open({str(marker)!r}, 'w').write('x')\n"
    cfg = {"model_type": "evil_custom", "architectures": ["EvilForCausalLM"],
           "auto_map": {"AutoConfig": "configuration_evil.EvilConfig",
                        "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}}
    d = _model_dir(tmp_path, cfg, {"configuration_evil.py": code, "modeling_evil.py": code})
    rc, _, err = _run(capsys, "--model", str(d), "--headless", "--json", str(tmp_path / "s.json"))
    line = _one_error_line(err)
    assert rc in (1, 2) and not marker.exists()
    print(line)


# ------------------------------------------------------------------ snapshots and recordings
@pytest.fixture(scope="module")
def good_files(tmp_path_factory, eager_path):
    """A real snapshot and a real recording (from the eager H100 fixture, 4 raw tokens)."""
    from tuiprof.export.recording import write_recording
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.export.snapshot import write_snapshot
    from tuiprof.store import SessionStore

    d = tmp_path_factory.mktemp("good")
    store = SessionStore(ring_tokens=4)
    replay_into(load_recording(eager_path), store)
    return {"snapshot": write_snapshot(store.view(), d / "good.json"),
            "recording": write_recording(store.view(), d / "good.json.gz")}


class _Boom:
    """Unpickling this would run code: create the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _bad_snapshots(good: Path, tmp: Path) -> dict[str, Path]:
    raw = good.read_bytes()
    doc = json.loads(raw)
    files = {
        "truncated": raw[: len(raw) // 2],
        "empty": b"",
        "binary-garbage": bytes(range(256)) * 4,
        "gzip-of-snapshot": gzip.compress(raw),
        "newer-schema": json.dumps(dict(doc, schema_version=99)).encode(),
        "wrong-format": json.dumps(dict(doc, format="something-else")).encode(),
        "tokens-not-a-list": json.dumps(dict(doc, tokens={"a": 1})).encode(),
        "deep-nesting": b'{"format":"tuiprof-snapshot","schema_version":1,"meta":' + b"[" * 100_000
                        + b"]" * 100_000 + b"}",
        "huge-int": re.sub(rb'"schema_version":\d+', b'"schema_version":' + b"9" * 5000, raw),
        "nan-and-inf": json.dumps(dict(doc, tokens=[dict(doc["tokens"][0], host_ms=float("nan"),
                                                           gpu_ms=float("inf"))])).encode(),
        "gigantic-string": json.dumps(dict(doc, meta=dict(doc["meta"], model="x" * 5_000_000))).encode(),
        "pickle": pickle.dumps(_Boom(str(tmp / "PWNED"))),
        "a-directory": None,
    }
    out = {}
    for name, data in files.items():
        p = tmp / f"{name}.json"
        if data is None:
            p.mkdir()
        else:
            p.write_bytes(data)
        out[name] = p
    return out


def test_bad_snapshots_through_every_command(capsys, tmp_path, good_files, monkeypatch):
    import tuiprof.ui.app

    opened = []
    monkeypatch.setattr(tuiprof.ui.app, "run_app", lambda *a, **k: opened.append(a) or 0)
    bad = _bad_snapshots(good_files["snapshot"], tmp_path)
    seen = {}
    for name, path in bad.items():
        for argv in (["view", str(path)], ["export", str(path), "--trace", str(tmp_path / "t.json")],
                     ["diff", str(path), str(good_files["snapshot"])]):
            rc, out, err = _run(capsys, *argv)
            if name == "nan-and-inf" and rc == 0:   # JSON's NaN/Infinity: a valid, odd, snapshot
                (tmp_path / "t.json").unlink(missing_ok=True)
                continue
            assert rc == 2, (name, argv, err)
            seen[name] = _one_error_line(err)
    assert len(opened) <= 1                          # only the NaN one reaches the UI
    assert not (tmp_path / "PWNED").exists()
    assert not (tmp_path / "t.json").exists()
    for name, line in seen.items():
        print(f"{name}: {line}")
    assert "newer than this tuiprof reads" in seen["newer-schema"]
    assert "gzip" in seen["gzip-of-snapshot"]


@pytest.mark.parametrize("where", ["tokens/3/end_ns", "kernels/0/stats/count",
                                   "raw/0/records/0/3", "meta/seed", "nvml/0/ts_ns"])
@pytest.mark.parametrize("value", [2**64 + 1, -(2**63) - 1, 2**63])
def test_an_integer_beyond_int64_is_refused_at_load_for_every_export(capsys, tmp_path,
                                                                    good_files, where, value):
    """``export --sqlite`` crashed with an OverflowError traceback on 2**64 + 1 in a token's
    end_ns: every integer is checked at load time, so no export (nor view, nor diff) starts."""
    doc = json.loads(good_files["snapshot"].read_bytes())
    *path, last = where.split("/")
    at = doc
    for k in path:
        at = at[int(k)] if isinstance(at, list) else at[k]
    at[int(last) if isinstance(at, list) else last] = value
    bad = tmp_path / "big.json"
    bad.write_text(json.dumps(doc))
    outs = {"--sqlite": tmp_path / "o.sqlite", "--trace": tmp_path / "o.trace.json",
            "--nsys": tmp_path / "nsys", "--steps-csv": tmp_path / "steps.csv"}
    for flag, out in outs.items():
        rc, _, err = _run(capsys, "export", str(bad), flag, str(out))
        assert rc == 2, (flag, err)
        line = _one_error_line(err)
        assert f"{where}: {value} is beyond a 64-bit integer" in line, line
        assert not out.exists()
    rc, _, err = _run(capsys, "diff", str(bad), str(good_files["snapshot"]))
    assert rc == 2 and "beyond a 64-bit integer" in _one_error_line(err)


def test_the_largest_int64_values_load_and_export(capsys, tmp_path, good_files):
    doc = json.loads(good_files["snapshot"].read_bytes())
    doc["meta"]["seed"] = 2**63 - 1
    doc["meta"]["model"] = "m" + "9" * 30                       # digits in a string are text
    ok = tmp_path / "edge.json"
    ok.write_text(json.dumps(doc))
    rc, _, err = _run(capsys, "export", str(ok), "--sqlite", str(tmp_path / "o.sqlite"))
    assert rc == 0, err


def test_bad_recordings_through_replay(capsys, tmp_path, good_files):
    good = good_files["recording"]
    raw = gzip.decompress(good.read_bytes())
    doc = json.loads(raw)
    gz = good.read_bytes()
    files = {
        "truncated-gzip": gz[: len(gz) // 2],
        "corrupt-gzip": gz[:20] + bytes(b ^ 0x5A for b in gz[20:200]) + gz[200:],
        "truncated-json": gzip.compress(raw[: len(raw) // 2]),
        "newer-version": gzip.compress(json.dumps(dict(doc, meta=dict(doc["meta"], recording_version=2))).encode()),
        "records-wrong-type": gzip.compress(json.dumps(dict(doc, records=[["K", 1, 2]])).encode()),
        "marks-huge-int": gzip.compress(json.dumps(dict(doc, marks=[["step_start", 0, 10**30]])).encode()),
        "deep-nesting": gzip.compress(b"[" * 50_000 + b"]" * 50_000),
        "pickle": pickle.dumps(_Boom(str(tmp_path / "PWNED"))),
    }
    seen = {}
    for name, data in files.items():
        p = tmp_path / f"{name}.json.gz"
        p.write_bytes(data)
        rc, _, err = _run(capsys, "replay", str(p), "--headless", "--json", str(tmp_path / "o.json"))
        assert rc == 2, (name, err)
        seen[name] = _one_error_line(err)
    for name, line in seen.items():
        print(f"{name}: {line}")
    assert not (tmp_path / "PWNED").exists()
    assert not (tmp_path / "o.json").exists()
    assert "newer than this tuiprof reads" in seen["newer-version"]


def test_asking_for_a_gpu_on_a_machine_without_one(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU path")
    out = tmp_path / "s.json"
    rc, _, err = _run(capsys, "--model", "qwen3-tiny", "--device", "cuda", "--headless",
                      "--json", str(out))
    line = _one_error_line(err)
    assert rc == 1 and "sees no CUDA GPU; use --device cpu" in line, err
    print(line)
