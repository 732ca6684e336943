"""The status line's "compiling N s" counts from the compile's start to its end: a background
compile outlives the prefills of an engine that loops from the prompt (and a pause), so neither
starts the count again; the decode state after it ends the count."""
from __future__ import annotations

from tuiprof.profiler import Profiler
from tuiprof.spec import ProfilerOptions
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


def test_a_batch_compiled_says_how_long_its_compile_took():
    """`b` in compiled mode: the engine says "compiled in …" and then, at the same boundary, the
    steps run at the new batch. The status line keeps the compile's line beside the batch's
    (the order the engine calls them in, seen with qwen3-tiny on the CPU); a batch change at a
    later step says only the batch."""
    prof = Profiler(SessionStore(ring_tokens=8),
                    ProfilerOptions(cupti=False, nvml=False, alloc_every=0))
    prof.configuration_changed(1, True)
    prof.state_changed("compiling", "torch.compile(mode='default') for batch 2 in a helper process")
    prof.configuration_changed(1, False)
    prof.state_changed("decode", "compiled in 8.5 s (dynamo 2.9 s, inductor 0.1 s)")
    prof.configuration_changed(2, False)
    assert prof.status.message == ("now decoding 2 sequences per step · "
                                   "compiled in 8.5 s (dynamo 2.9 s, inductor 0.1 s)")
    prof.store.begin_token("decode", "compiled", 0, 1)  # a step later: the batch alone
    prof.configuration_changed(1, False)
    assert prof.status.message == "now decoding 1 sequence per step"
