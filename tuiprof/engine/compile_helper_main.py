"""The compile helper process (:mod:`tuiprof.engine.compile_helper` starts it and has the
protocol): import torch and the family's model code, say ``imported``, read one request, build
the same model, compile the batches asked for into the session's cache, say ``done``, and end
when the session closes the pipe.

Its imports are inside :func:`main`: a failure there is one ``error`` line for the session.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from ..errors import one_line
from .source import ModelSource


def _watch_stdin(stream) -> None:
    """End this process (and its group's compile workers) when the session closes the pipe."""
    try:
        while stream.read(4096):
            pass
    except Exception:
        pass
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(0)


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _save_steps(engine, pre: dict, batches: list[int]) -> None:
    """Compile each graph of ``batches`` ahead of time and save it where the session's next
    compile looks (:mod:`.precompiled`); says ``saved <graph> <seconds>`` or ``unsaved <graph>
    <why>`` each, then ``finished``. The session stops this process when it ends; a file is
    written whole or not at all."""
    from pathlib import Path

    from .precompiled import PrecompiledSteps, graph_of, mode_options

    steps = PrecompiledSteps(Path(pre["dir"]), pre["fields"])
    seen: set = set()
    for batch in batches:
        graph = graph_of(batch)
        if graph in seen or steps.whole_refused(graph) or steps.path(graph).exists():
            continue
        seen.add(graph)
        t0 = time.perf_counter()
        try:
            fn, note = steps.compile(graph, engine.adapter.decode, engine.adapter,
                                     engine.compile_args(batch), mode_options(engine.compile_mode))
        except BaseException as exc:
            fn, note = None, f"{type(exc).__name__}: {one_line(exc, 120)}"
        if fn is not None and not note:
            _say(f"saved {graph} {time.perf_counter() - t0:.2f}")
        else:
            _say(f"unsaved {graph} {note}")
    _say("finished")


def main(argv: list[str]) -> int:
    family, device = (argv + ["-", "cpu"])[:2]
    t0 = time.perf_counter()
    try:  # what every compile needs, done before the request comes (a prestarted helper)
        from . import bytecode

        bytecode.keep()  # as the session does (inherited through the environment, mostly)
        import torch

        from .families import get_family
        from .generate import Engine
        from .load import load_model

        if family != "-":
            preload = getattr(get_family(family), "preload", None)
            if preload is not None:
                preload()
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)  # the context, before the request
        _say(f"imported {time.perf_counter() - t0:.2f}")
    except BaseException as exc:
        _say(f"error {type(exc).__name__}: {one_line(exc, 160)}")
        return 1
    try:
        request = json.loads(sys.stdin.buffer.readline().decode())
    except ValueError:
        return 2  # the session went away before asking
    threading.Thread(target=_watch_stdin, args=(sys.stdin.buffer,), daemon=True,
                     name="tuiprof-helper-stdin").start()
    try:
        t0 = time.perf_counter()
        torch.set_grad_enabled(False)
        model = request["model"]   # the session's model, resolved there (a name from an older one)
        if isinstance(model, dict):
            model = ModelSource.from_json(model)
        loaded = load_model(model, device=request["device"], dtype=request["dtype"],
                            seed=int(request.get("seed", 0)), max_len=request.get("max_len"),
                            trust_remote_code=bool(request.get("trust_remote_code")),
                            weights=request.get("weights"))
        prompt = torch.zeros((1, int(request["prompt_len"])), dtype=torch.long)
        engine = Engine(loaded.adapter, prompt, device=loaded.device,
                        compile_mode=request.get("compile_mode"),
                        max_batch=max([1, *request["batches"]]))
        _say(f"ready {time.perf_counter() - t0:.2f}")
        for batch in request["batches"]:
            t1 = time.perf_counter()
            engine.compile_batch(int(batch))
            _say(f"compiled {int(batch)} {time.perf_counter() - t1:.2f}")
        _say("done")
    except BaseException as exc:  # one line for the session's note
        _say(f"error {type(exc).__name__}: {one_line(exc, 160)}")
        return 1
    pre = request.get("precompile")
    if pre:  # the session goes on with the cache filled; this saves the step for the next one
        _save_steps(engine, pre, [int(b) for b in request["batches"]])
    # stay until the session has read "done" and closed the pipe (the watcher ends us)
    threading.Event().wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
