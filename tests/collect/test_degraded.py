"""Without a GPU the real CUPTI and NVML libraries fail to start: one line each, never a traceback."""
from __future__ import annotations

import pytest

from tuiprof.collect.cupti_collector import CuptiCollector, CuptiUnavailable
from tuiprof.collect.nvml_sampler import NvmlSampler, NvmlUnavailable
from tuiprof.store import SessionStore

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")


def test_no_cupti_one_line():
    with pytest.raises(CuptiUnavailable) as info:
        CuptiCollector(SessionStore()).start()
    msg = str(info.value)
    assert msg.startswith("no CUPTI:") and "\n" not in msg and "timing and NVML go on" in msg


def test_no_nvml_one_line():
    with pytest.raises(NvmlUnavailable) as info:
        NvmlSampler(SessionStore()).start()
    msg = str(info.value)
    assert msg.startswith("no NVML:") and "\n" not in msg


def test_profiler_degrades_and_records_why():
    from tuiprof.profiler import Profiler
    from tuiprof.spec import ProfilerOptions

    store = SessionStore()
    prof = Profiler(store, ProfilerOptions())
    prof.start_collectors()
    col = store.view().collectors
    assert col["cupti"]["ok"] is False and col["cupti"]["message"].startswith("no CUPTI")
    assert col["nvml"]["ok"] is False and col["nvml"]["message"].startswith("no NVML")
    assert prof.cupti is None and prof.nvml is None
    # the token clock falls back to the host clock
    assert prof.clock() > 0


def test_no_cupti_flag_says_so():
    from tuiprof.profiler import Profiler
    from tuiprof.spec import ProfilerOptions

    store = SessionStore()
    Profiler(store, ProfilerOptions(cupti=False, nvml=False)).start_collectors()
    col = store.view().collectors
    assert col["cupti"]["message"] == "no CUPTI: disabled with --no-cupti"
