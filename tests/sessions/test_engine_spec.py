"""``--model`` walks one way: the CLI resolves it once into an :class:`EngineSpec`; the session
process, the profiler and the engine take that spec as it is, and the session process receives
it as data (pickled at spawn, plain JSON for a detached session's keeper). Before, the same
name was resolved four times (the CLI, ``RemoteControl``, ``Profiler``, ``load_model``)."""
from __future__ import annotations

import json
import pickle
import sys
import time

import tuiprof.cli.run  # noqa: F401 - the modules that may hold resolve_model, loaded
import tuiprof.engine.load  # noqa: F401
import tuiprof.engine.source as source
import tuiprof.profiler  # noqa: F401
from tuiprof.cli import main
from tuiprof.sessions import RemoteControl
from tuiprof.spec import EngineSpec, ProfilerOptions


def _count_resolves(monkeypatch) -> list:
    """Every ``resolve_model`` of tuiprof's loaded modules, counted."""
    real, calls = source.resolve_model, []

    def counted(*args, **kwargs):
        calls.append(args[0] if args else kwargs.get("spec"))
        return real(*args, **kwargs)

    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("tuiprof") \
                and getattr(mod, "resolve_model", None) is real:
            monkeypatch.setattr(mod, "resolve_model", counted)
    return calls


def test_a_model_run_resolves_the_model_once(tmp_path, monkeypatch):
    calls = _count_resolves(monkeypatch)
    out = tmp_path / "s.json"
    assert main(["run", "--model", "qwen3-tiny", "--device", "cpu", "--headless", "--no-cupti",
                 "--no-nvml", "--max-new-tokens", "3", "--prompt-len", "4",
                 "--json", str(out)]) == 0
    assert calls == ["qwen3-tiny"]
    assert json.loads(out.read_text())["meta"]["model"] == "qwen3-tiny"


def test_the_spec_crosses_to_the_session_process_as_data_and_is_not_resolved_there(tmp_path):
    engine = EngineSpec.resolve("qwen3-tiny", device="cpu", max_new_tokens=4, prompt_len=4)
    opts = ProfilerOptions(cupti=False, nvml=False, engine=engine)
    assert ProfilerOptions.from_json(json.loads(json.dumps(opts.to_json()))) == opts
    ctl = RemoteControl(opts, {"ring_tokens": 8}, hook="sessions.resolve_count_hook:make")
    sent = pickle.loads(pickle.dumps(ctl.spec()))   # what the spawn hands over
    assert sent.options.engine == engine and sent.options.engine.source.name == "qwen3-tiny"
    ctl.start()
    try:
        t_end = time.monotonic() + 120
        while ctl.status.state not in ("done", "error") and time.monotonic() < t_end:
            ctl.view(raw=False, wait=True)
            time.sleep(0.1)
        assert ctl.status.state == "done", ctl.status
        assert ctl.call("hook") == 0      # the model loaded without resolving its name again
        assert ctl.view(raw=True).meta["model"] == "qwen3-tiny"
    finally:
        ctl.stop()
        ctl.close()
