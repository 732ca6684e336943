"""Security: loading is JSON only, weights load safely, no network at run time, remote code only
when asked, and exported files carry no environment variables, secrets or home paths (and the
host name only when asked).
"""
from __future__ import annotations

import ast
import dataclasses
import gzip
import json
import os
import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted((REPO / "tuiprof").rglob("*.py"))
TINY_CONFIG = json.loads((REPO / "models" / "qwen3-tiny.json").read_text())["config"]
SECRET = "sk-live-7Hq2vXc9ZpL0RmT4"                  # looks like an API key


# ------------------------------------------------------------------ static checks of the code
def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            yield node, owner, name


# The one module that may import pickle: the wire protocol between tuiprof's own processes
# pickles its replies and reads them back only through its SafeUnpickler (docs/remote.md);
# requests are JSON. Nothing read from a file is unpickled.
PICKLE_ALLOWED = {"tuiprof/sessions/protocol.py"}


def test_no_pickle_eval_or_unsafe_loaders_in_the_code():
    problems = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        rel = path.relative_to(REPO)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for m in mods:
                    if m == "pickle" and str(rel) in PICKLE_ALLOWED:
                        continue
                    if m.split(".")[0] in ("pickle", "cPickle", "dill", "marshal", "shelve", "yaml"):
                        problems.append(f"{rel}:{node.lineno} imports {m}")
        for node, owner, name in _calls(tree):
            kw = {k.arg: k.value for k in node.keywords}
            if owner == "" and name in ("eval", "exec", "__import__"):
                problems.append(f"{rel}:{node.lineno} calls {name}()")
            if owner == "pickle" and name in ("load", "loads", "Unpickler"):
                problems.append(f"{rel}:{node.lineno} pickle.{name}: unpickle only with the "
                                f"protocol's SafeUnpickler")
            if owner == "torch" and name == "load":
                wo = kw.get("weights_only")
                if not (isinstance(wo, ast.Constant) and wo.value is True):
                    problems.append(f"{rel}:{node.lineno} torch.load without weights_only=True")
            if name == "from_pretrained":
                lfo = kw.get("local_files_only")
                if not (isinstance(lfo, ast.Constant) and lfo.value is True):
                    problems.append(f"{rel}:{node.lineno} from_pretrained may download")
                trc = kw.get("trust_remote_code")
                if isinstance(trc, ast.Constant) and trc.value is True:
                    problems.append(f"{rel}:{node.lineno} trust_remote_code=True")
    assert problems == []


def test_the_protocol_reads_replies_only_with_its_safe_unpickler():
    from tuiprof.sessions import protocol

    tree = ast.parse((REPO / "tuiprof" / "sessions" / "protocol.py").read_text())
    bases = [b for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
             for b in n.bases if isinstance(b, ast.Attribute) and b.attr == "Unpickler"]
    assert len(bases) == 1                                  # SafeUnpickler, and nothing else
    assert issubclass(protocol.SafeUnpickler, __import__("pickle").Unpickler)


def test_trust_remote_code_is_off_unless_asked():
    from tuiprof.cli import build_parser

    assert build_parser().parse_args(["run"]).trust_remote_code is False
    assert build_parser().parse_args(["run", "--trust-remote-code"]).trust_remote_code is True


def test_resolving_a_model_sets_hf_offline(monkeypatch):
    from tuiprof.engine.source import resolve_model
    from tuiprof.errors import TuiprofError

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with pytest.raises(TuiprofError, match="never downloads"):
        resolve_model("someone/never-cached")
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt (or name lookup) fails the test."""
    tried = []

    def refuse(*a, **k):
        tried.append(a)
        raise OSError("network access during a tuiprof run")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return tried


def test_a_run_makes_no_network_access(no_network, tmp_path, capsys):
    from tuiprof.cli import main

    rc = main(["--model", "qwen3-tiny", "--headless", "--max-new-tokens", "4",
               "--json", str(tmp_path / "s.json")])
    assert rc == 0, capsys.readouterr().err
    assert main(["--model", "someone/never-cached", "--headless"]) == 2   # refused, offline
    assert no_network == []


# ------------------------------------------------------------------ secrets in exported files
@pytest.fixture
def home_model(tmp_path, monkeypatch, tiny_loaded):
    """A fake home directory with a local model (config.json + safetensors) in it, and a
    secret-looking environment variable."""
    from safetensors.torch import save_model

    home = tmp_path / "home" / "alice-private"
    d = home / "models" / "tiny"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(TINY_CONFIG))
    save_model(tiny_loaded.adapter.model, str(d / "model.safetensors"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TUIPROF_TEST_API_KEY", SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    return home


def _grep(out: Path, needles: list[str]) -> list[str]:
    hits = []
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) >= 5, files
    for p in files:
        data = p.read_bytes()
        if p.suffix == ".gz":
            data = gzip.decompress(data)
        for n in needles:
            if n.encode() in data:
                i = data.index(n.encode())
                hits.append(f"{p.name}: {n!r} in ...{data[max(0, i - 80):i + 40]!r}")
    return hits


def test_exports_hold_no_secrets_or_home_paths(home_model, tmp_path, capsys):
    from tuiprof.cli import main

    out = tmp_path / "out"
    out.mkdir()
    snap, rec = out / "s.json", out / "r.json.gz"
    rc = main(["record", "--model", "~/models/tiny", "--max-new-tokens", "6", "--json", str(snap),
               "--record", str(rec)])
    said = capsys.readouterr()
    assert rc == 0, said.err
    assert f"weights: loaded from {home_model}" in said.out    # the real weights were used
    rc = main(["export", str(snap), "--sqlite", str(out / "s.sqlite"), "--trace",
               str(out / "t.json"), "--nsys", str(out / "nsys")])
    assert rc == 0, capsys.readouterr().err
    rc = main(["replay", str(rec), "--headless", "--json", str(out / "replayed.json")])
    assert rc == 0, capsys.readouterr().err
    needles = [SECRET, str(home_model), "alice-private", str(tmp_path)]
    host = socket.gethostname()
    if len(host) >= 6:     # a short host name ("vm") would match unrelated bytes
        needles.append(host)
    assert _grep(out, needles) == []


def test_host_name_only_when_asked(eager_path, tmp_path):
    from tuiprof.export.recording import write_recording
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.export.snapshot import write_snapshot
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=2)
    replay_into(load_recording(eager_path), store)
    small = store.view()
    host = "build-host-4711.internal.example"
    for share, want in ((False, False), (True, True)):
        view = dataclasses.replace(small, meta=dict(small.meta, host=host, share_host=share,
                                                    user_env=os.environ.copy()))
        d = tmp_path / str(share)
        d.mkdir()
        write_snapshot(view, d / "s.json", findings=[])
        write_recording(view, d / "r.json.gz")
        assert (host in (d / "s.json").read_text()) is want
        assert (host in gzip.decompress((d / "r.json.gz").read_bytes()).decode()) is want
        assert "user_env" not in (d / "s.json").read_text()
