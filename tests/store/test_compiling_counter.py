"""The status line's "compiling N s" counts from the compile's start to its end: a background
compile outlives the prefills of an engine that loops from the prompt (and a pause), so neither
starts the count again; the decode state after it ends the count."""
from __future__ import annotations

from tuiprof.profiler import Profiler, ProfilerOptions
from tuiprof.store import SessionStore


def test_a_prefill_beside_a_compile_keeps_its_count():
    prof = Profiler(SessionStore(ring_tokens=8),
                    ProfilerOptions(cupti=False, nvml=False, alloc_every=0))
    prof.state_changed("compiling", "torch.compile(...) in a helper process")
    since = prof.status.compiling_since
    assert since is not None
    for state in ("prefill", "compiling", "paused", "compiling"):
        prof.state_changed(state)
        assert prof.status.compiling_since == since, state
    prof.state_changed("decode", "compiled in 9.8 s")
    assert prof.status.compiling_since is None
