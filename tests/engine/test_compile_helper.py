"""The persistent inductor cache (:mod:`tuiprof.engine.compile_cache`) and the compile helper
process (:mod:`tuiprof.engine.compile_helper`).

The cache: a directory per key (model, config, dtype, torch, transformers, device name, compile
mode), per user, bounded; a stale directory is started again; another torch gets its own.
The helper: real processes on the CPU (qwen3-tiny, inductor's CPU backend). A helper killed
mid-compile leaves one line and the session compiles in its own process; with a warm cache the
helper and the session both compile from it; ``q`` during a helper's compile stops the session
cleanly and leaves no helper behind, and a helper whose session vanished ends by itself.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuiprof.engine import compile_cache as cc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _fields(**over) -> dict:
    base = {"name": "qwen3-tiny", "config": {"hidden_size": 64, "num_hidden_layers": 2}}
    f = cc.key_fields(base, "float32", "cpu", "default", torch_version="2.13.0+cpu",
                      transformers_version="5.24.0")
    f.update(over)
    return f


# ------------------------------------------------------------------------- the cache
def test_one_directory_per_key_made_private_and_marked(tmp_path):
    path = cc.prepare(_fields(), base=tmp_path)
    assert path is not None and path.parent == tmp_path and path.name == cc.key_of(_fields())
    assert json.loads((path / cc.KEY_FILE).read_text()) == _fields()
    assert (path.stat().st_mode & 0o777) == 0o700
    assert cc.prepare(_fields(), base=tmp_path) == path               # the same key: the same dir
    other = cc.prepare(_fields(torch="2.11.0+cu130"), base=tmp_path)  # another torch: its own
    assert other != path and path.exists() and other.exists()
    assert cc.prepare(_fields(device="NVIDIA H100 80GB HBM3"), base=tmp_path) not in (path, other)


def test_a_stale_directory_is_started_again(tmp_path):
    path = cc.prepare(_fields(), base=tmp_path)
    (path / "fxgraph").mkdir()
    (path / "fxgraph" / "entry").write_text("x")
    (path / cc.KEY_FILE).write_text(json.dumps(_fields(torch="1.0")))  # says something else
    again = cc.prepare(_fields(), base=tmp_path)
    assert again == path and not (path / "fxgraph").exists()
    assert json.loads((path / cc.KEY_FILE).read_text()) == _fields()
    (path / cc.KEY_FILE).unlink()                                       # no key file at all
    (path / "left").write_text("x")
    cc.prepare(_fields(), base=tmp_path)
    assert not (path / "left").exists() and (path / cc.KEY_FILE).exists()


def test_bounded_least_recently_used_first_never_the_one_in_use(tmp_path):
    paths = []
    for i in range(5):
        p = cc.prepare(_fields(model=f"m{i}"), base=tmp_path, keep=99)
        (p / "blob").write_bytes(b"x" * 1000)
        os.utime(p / cc.KEY_FILE, (1000 + i, 1000 + i))
        paths.append(p)
    (tmp_path / "not-a-key-dir").mkdir()                     # never touched
    removed = cc.prune(tmp_path, keep=3, max_bytes=10**9, spare=paths[0])
    assert set(removed) == {paths[1], paths[2]}              # oldest, but the spare stays
    assert paths[0].exists() and (tmp_path / "not-a-key-dir").exists()
    removed = cc.prune(tmp_path, keep=10, max_bytes=2500)    # by size: the newest that fit
    assert {p.name for p in tmp_path.iterdir()} == {paths[4].name, paths[3].name, "not-a-key-dir"}


def test_root_follows_xdg_and_the_switches(monkeypatch, tmp_path):
    monkeypatch.delenv(cc.ENV, raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cc.root() == tmp_path / "tuiprof" / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/of/theirs")
    assert cc.root() is None and cc.prepare(_fields()) is None   # the user's choice wins
    monkeypatch.setenv(cc.ENV, "off")
    assert cc.root() is None
    monkeypatch.setenv(cc.ENV, str(tmp_path / "mine"))
    assert cc.root() == tmp_path / "mine"


def test_unwritable_root_means_inductors_default(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert cc.prepare(_fields(), base=blocker / "below") is None


# ------------------------------------------------------------------------- the helper
@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    return tmp_path_factory.mktemp("inductor-cache")


def _scenario(name: str, cache_root: Path, **extra: str) -> dict:
    # the helper and inductor's cache as such: no compiled steps kept across sessions (those
    # skip inductor's cache; tests/engine/test_precompiled_engine.py has them)
    env = dict(os.environ, TUIPROF_INDUCTOR_CACHE=str(cache_root), TUIPROF_COMPILE_HELPER="on",
               TUIPROF_PRECOMPILE="off",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               **extra)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.pop("TRITON_CACHE_DIR", None)
    r = subprocess.run([sys.executable, str(HERE / "compile_scenario.py"), name], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def filled(cache_root):
    """A session whose helper was killed: it compiled in its own process, filling the cache."""
    return _scenario("dies", cache_root)


@pytest.mark.slow
def test_a_helper_that_dies_leaves_one_line_and_the_session_compiles_itself(filled, cache_root):
    out = filled
    assert out["mode"] == "compiled" and out["error"] is None, out
    assert len(out["notes"]) == 1, out["notes"]
    note = out["notes"][0]
    assert note.startswith("compile helper ended (signal 9) before it had compiled")
    assert note.endswith("compiling in this process") and "\n" not in note
    assert out["helper_s"] is None or "helper" not in out["message"]
    assert Path(out["cache"]).parent == cache_root


@pytest.mark.slow
def test_a_compile_marked_in_the_cache_runs_from_it_with_no_helper(filled, cache_root):
    out = _scenario("warm", cache_root)
    assert out["mode"] == "compiled" and out["error"] is None and out["notes"] == [], out
    assert out["helper_s"] is None and not out["helper_started"]
    assert "from the cache (decoding paused)" not in out["message"]  # done: "compiled in …"
    hits = out["cache_hits"]
    assert hits["fxgraph_hit"] >= 1 and hits["fxgraph_miss"] == 0, hits
    assert out["cache"] == filled["cache"]
    marks = json.loads((Path(out["cache"]) / "compiled.json").read_text())
    assert {"max_len": 1088, "prompt_len": 16, "batches": [1]} in marks


@pytest.mark.slow
def test_helper_then_warm_compile_and_q_during_the_next_compile(filled, cache_root):
    # beside decoding even though the cache has it: the helper path, from a warm cache
    out = _scenario("quit", cache_root, TUIPROF_WARM_COMPILE="beside")
    assert out["mode"] == "compiled" and out["error"] is None and out["notes"] == [], out
    assert out["helper_s"] is not None and "in a helper process" in out["message"]
    assert out["eager_beside"] > 0                   # decoding went on meanwhile
    hits = out["cache_hits"]                         # the session's compile found the helper's
    assert hits["fxgraph_hit"] >= 1 and hits["fxgraph_miss"] == 0, hits
    assert not out["first_helper_alive"]             # done: it ended
    assert out["batch_helper_request"] == [1, 2]     # `b`: the batches in the session's order
    # `q` while the batch's helper compiled: stopped at once, nothing left running
    assert out["joined"] and out["state"] == "stopped" and out["stop_error"] is None, out
    assert out["stopped_s"] < 15 and not out["batch_helper_alive"]
    assert out["compile_thread_ended"]
    cache = Path(out["cache"])
    assert (cache / cc.KEY_FILE).exists() and (cache / "helper.log").exists()


def test_a_helper_ends_when_its_session_vanishes(tmp_path):
    """The session process leaves with os._exit (and may be killed): the helper, waiting with
    its imports done (prestart), sees its stdin close and ends with its process group."""
    code = ("import os, sys, time\n"
            "from tuiprof.engine.compile_helper import CompileHelper\n"
            "h = CompileHelper('', 'cpu', None, None)\n"
            "h.start()\n"
            "print(h.pid, flush=True)\n"
            "line = h.proc.stdout.readline().decode().strip()\n"
            "print(line, flush=True)\n"
            "os._exit(0)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    pid_line, said = r.stdout.split("\n")[:2]
    assert said.startswith("imported "), r.stdout
    pid = int(pid_line)
    end = time.monotonic() + 20
    while time.monotonic() < end and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


PREIMPORT = """
import sys, threading
from tuiprof.engine.load import CompileSetup, load_model
loaded = load_model("qwen3-tiny", device="cpu", seed=0, max_len=64)
setup = CompileSetup(loaded, "qwen3-tiny", seed=0, max_len=64, prompt_len=8, weights=None,
                     trust_remote_code=False, info={"batch": 1})
before = "torch._inductor.compile_fx" in sys.modules
setup.prepare()
if sys.argv[1] == "warm":
    setup.compiled([1])          # an earlier session compiled batch 1 with this cache
setup.prestart()
for t in threading.enumerate():
    if t.name == "tuiprof-compile-imports":
        t.join(300)
print(before, "torch._inductor.compile_fx" in sys.modules, setup._idle is not None, flush=True)
setup.close()
"""


@pytest.mark.parametrize("cache", ["warm", "cold"])
def test_a_warm_cache_has_inductor_imported_ahead_instead_of_a_helper(tmp_path, cache):
    """A session whose first compile is cached compiles (or loads its saved step) in its own
    process: inductor's modules are imported beside eager decoding, before `c` asks for
    them; a cold cache gets the prestarted helper instead."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, TUIPROF_INDUCTOR_CACHE=str(tmp_path),
               TUIPROF_COMPILE_HELPER="prestart")
    r = subprocess.run([sys.executable, "-c", PREIMPORT, cache], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    before, imported, helper = r.stdout.split()
    assert before == "False"
    assert (imported, helper) == (("True", "False") if cache == "warm" else ("False", "True"))
