"""The words a step is described by, defined once: its phase and its mode.

Every layer (engine, step sources, store, analysis, UI, exports) imports these; snapshots store
the strings themselves, so their values never change.
"""
from __future__ import annotations

PREFILL = "prefill"   # a step that feeds prompt tokens
DECODE = "decode"     # a step that makes one token per sequence
WINDOW = "window"     # a fixed time window of a program that marks no steps
OTHER = "other"       # records outside any step (start-up, compilation, idle)
PHASES = (PREFILL, DECODE)

EAGER = "eager"
COMPILED = "compiled"
MODES = (EAGER, COMPILED)
