"""tuiprof: a live inference profiler for the terminal.

Importing ``tuiprof`` imports nothing heavy (no torch, no textual): the CLI decides what to load.
A program profiled with ``tuiprof run -- python prog.py`` may mark its own decode steps with
:func:`tuiprof.step` and :func:`tuiprof.mark_prefill`, and a server its requests with
:func:`tuiprof.request_arrived`, :func:`tuiprof.request_token` and
:func:`tuiprof.request_finished`, a warm-up request with :func:`tuiprof.request_warmup` (all
no-ops when it runs without tuiprof).
"""
__version__ = "0.1.0"

from .marks import (mark_prefill, request_arrived, request_finished,  # noqa: E402  (after
                    request_token, request_warmup, step)            # __version__: cli imports it)

__all__ = ["step", "mark_prefill", "request_arrived", "request_token", "request_finished",
           "request_warmup", "__version__"]
