"""A session-process hook (``RemoteControl(hook="sessions.resolve_count_hook:make")``): it
counts the calls of ``resolve_model`` in the session process from the hook's start, which
comes before the model loads, and answers the count (``ctl.call("hook")``)."""
from __future__ import annotations

import sys


def make(prof):
    import tuiprof.engine.source as source

    real, calls = source.resolve_model, []

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("tuiprof") \
                and getattr(mod, "resolve_model", None) is real:
            mod.resolve_model = counted

    class Count:
        def handle(self, *args):
            return len(calls)

    return Count()
