"""Helpers for the analysis tests: the recordings' paths and independent reads of their JSON
(tests/recordings.py)."""
from __future__ import annotations

from recordings import COMPILED, EAGER, decode_records, decode_windows, duration
from recordings import NCU_CSV as NCU

__all__ = ["COMPILED", "EAGER", "NCU", "decode_records", "decode_windows", "duration"]
