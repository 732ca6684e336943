"""Shared helpers for the workload tests (CPU, tiny variants)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

torch.set_num_threads(1)  # tiny models: threads only contend on the 2-core CI machine

from workload_helpers import TINY, build_tiny  # noqa: E402,F401 - also importable from conftest


@pytest.fixture(autouse=True)
def _single_thread_determinism():
    import torch

    torch.manual_seed(0)
    yield
