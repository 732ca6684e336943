"""tuiprof: a live inference profiler for the terminal.

Importing ``tuiprof`` imports nothing heavy (no torch, no textual): the CLI decides what to load.
A program profiled with ``tuiprof run -- python prog.py`` may mark its own decode steps with
:func:`tuiprof.step` and :func:`tuiprof.mark_prefill` (no-ops when it runs without tuiprof).
"""
__version__ = "0.1.0"

from .marks import mark_prefill, step  # noqa: E402  (after __version__, which cli imports)

__all__ = ["step", "mark_prefill", "__version__"]
