"""Burst sampling switches the device kinds *and* the API records together (eager: the
RUNTIME/DRIVER kinds, their per-id filter applied again; compiled: the subset's ids only), a
prefill is traced unless another was in the last period, and a mode switch sets the API policy
and restarts the sampling. CUPTI cannot run on a CPU, so a stand-in records the enable/disable
calls the collector makes (the real switching is verified on the H100 by tests/gpu/;
docs/gpu-verification.md)."""
from __future__ import annotations

from tuiprof.collect.cupti_collector import BURST, SWITCH_LEAD, CuptiCollector
from tuiprof.store import SessionStore


class Calls:
    class ActivityKind:
        RUNTIME, DRIVER = 10, 11

    def __init__(self) -> None:
        self.kinds: list[tuple[str, int]] = []
        self.api: list[tuple[int, int]] = []
        self.flushes = 0

    def activity_enable(self, k):
        self.kinds.append(("on", k))

    def activity_disable(self, k):
        self.kinds.append(("off", k))

    def activity_flush_all(self, flag):
        self.flushes += 1

    def api_fn(self, cbid, on):
        self.api.append((cbid, on))


def _collector(sample_every: int) -> tuple[CuptiCollector, Calls]:
    c = CuptiCollector(SessionStore(), sample_every=sample_every)
    calls = Calls()
    c._cupti = calls
    c._device_kinds = [1, 2, 3]
    c._api_kinds = [10, 11]
    # the subset's per-id filter: 211 and 13 in it, 5 not
    c._api_filter = [(calls.api_fn, 211, 1), (calls.api_fn, 5, 0), (calls.api_fn, 13, 1)]
    c._api_on = c._api_kinds_on = True   # as after start(): the subset is on
    c._device_on = c.attached = True   # as after start()
    return c, calls


def test_bursts_switch_kinds_and_api_ids_together():
    c, calls = _collector(sample_every=8)          # bursts of 4 in every 32 tokens
    period = 8 * BURST
    traced = [c.on_token_start(seq, prefill=(seq == 0)) for seq in range(2 * period)]
    # seq 0 is a prefill: traced; then 1..4 of each period traced, 0 of a period is warm-up
    assert traced[0] is True
    assert [s for s in range(1, 2 * period) if traced[s]] == \
        [1, 2, 3, 4, period + 1, period + 2, period + 3, period + 4]
    # after a burst the device kinds and the API kinds go off (with the API kinds on, CUPTI
    # intercepts every call); for the next burst (warm-up included) both come back on, and the
    # whole per-id filter is applied again, since a kind switched on again forgets it
    assert calls.kinds[:5] == [("off", 1), ("off", 2), ("off", 3), ("off", 10), ("off", 11)]
    assert calls.kinds[5:10] == [("on", 1), ("on", 2), ("on", 3), ("on", 10), ("on", 11)]
    assert calls.api == [(211, 1), (5, 0), (13, 1)]      # once, when the second burst began
    assert calls.flushes == 2                            # each burst handed over when it ended
    assert c._api_on is False and c._device_on is False


def test_every_token_keeps_api_on_and_paused_turns_kinds_off():
    c, calls = _collector(sample_every=1)
    assert all(c.on_token_start(s) for s in range(10))
    assert calls.api == [] and calls.kinds == []         # nothing to switch
    c.paused = True
    assert c.on_token_start(10) is False
    assert calls.kinds == [("off", 1), ("off", 2), ("off", 3)]


def test_compiled_policy_keeps_api_kinds_on_and_switches_only_the_subset():
    c, calls = _collector(sample_every=8)
    c.api_kinds_stay_on = True   # compiled mode (the profiler sets it per mode)
    period = 8 * BURST
    for seq in range(1, 2 * period):
        c.on_token_start(seq)
    assert ("off", 10) not in calls.kinds and ("on", 10) not in calls.kinds
    # the subset's ids only (211, 13), off after a burst and on for the next
    assert calls.api == [(211, 0), (13, 0), (211, 1), (13, 1), (211, 0), (13, 0)]
    assert c._api_kinds_on is True and c._api_on is False


def test_switch_to_compiled_turns_api_kinds_on_before_the_next_burst():
    """After a switch from eager (API kinds off between bursts) to compiled (kinds stay on),
    the kinds come back on at the first compiled token, SWITCH_LEAD untraced tokens before
    the next burst's warm-up, never together with the device kinds."""
    c, calls = _collector(sample_every=8)
    period = 8 * BURST
    for seq in range(1, 10):                       # eager: a burst, then kinds off
        c.on_token_start(seq)
    assert c._api_kinds_on is False and c._device_on is False
    calls.kinds.clear()
    c.api_kinds_stay_on = True                     # the switch to compiled at token 10
    c.restart_sampling(10)
    traced = [s for s in range(10, 10 + period) if c.on_token_start(s)]
    assert traced == [10 + SWITCH_LEAD + i for i in range(1, BURST + 1)]
    # token 10: API kinds on (with the filter, subset off); warm-up at 10 + SWITCH_LEAD: the
    # device kinds only
    assert calls.kinds[:2] == [("on", 10), ("on", 11)]
    assert calls.kinds[2:5] == [("on", 1), ("on", 2), ("on", 3)]
    assert ("off", 10) not in calls.kinds


def test_profiler_sets_the_api_policy_and_restarts_sampling_at_a_mode_switch():
    from tuiprof.profiler import Profiler
    from tuiprof.spec import ProfilerOptions
    from tuiprof.sampling import AUTO_SAMPLE_EVERY

    c, calls = _collector(sample_every=AUTO_SAMPLE_EVERY["eager"])
    prof = Profiler(c.store, ProfilerOptions(cupti=False, nvml=False, alloc_every=0))
    prof.cupti = c
    prof.status.mode = "eager"
    for step in range(3):
        prof.token_started("decode", "eager", step, 0, step)
    assert c.api_kinds_stay_on is False
    prof.token_started("decode", "compiled", 3, 0, 3)   # the switch
    assert c.api_kinds_stay_on is True and c.sample_every == AUTO_SAMPLE_EVERY["compiled"]
    assert c._origin == 3 + SWITCH_LEAD
    prof.token_started("decode", "eager", 4, 0, 4)
    assert c.api_kinds_stay_on is False and c.sample_every == AUTO_SAMPLE_EVERY["eager"]


def test_program_compiled_policy_turns_api_kinds_on_a_token_before_each_burst():
    """`tuiprof run`'s compiled mode: the API kinds are off between bursts (a program's own
    ops around its graphs make hundreds of API calls a step), on one token before each burst
    with every id off, so they never come on together with the device kinds; off again with
    the device kinds when the burst ends."""
    c, calls = _collector(sample_every=8)
    c.api_kinds_stay_on, c.api_lead = False, True   # Profiler: a program in compiled mode
    period = 8 * BURST
    events = []
    for seq in range(1, 2 * period + 2):
        n = len(calls.kinds)
        c.on_token_start(seq)
        events += [(seq, *k) for k in calls.kinds[n:]]
    api = [(s, what) for s, what, k in events if k == 10]
    dev = [(s, what) for s, what, k in events if k == 1]
    # seq 1..4 (the first burst) end at 5; the lead token is period-1, warm-up at period
    assert api == [(BURST + 1, "off"), (period - 1, "on"), (period + BURST + 1, "off"),
                   (2 * period - 1, "on")]
    assert dev == [(BURST + 1, "off"), (period, "on"), (period + BURST + 1, "off"),
                   (2 * period, "on")]
    # at the lead token the whole filter is applied with every id off; the subset comes on at
    # the warm-up, with the device kinds
    lead = calls.api[:3]
    assert lead == [(211, 0), (5, 0), (13, 0)] and calls.api[3:5] == [(211, 1), (13, 1)]


def test_a_program_session_switches_api_kinds_off_between_compiled_bursts():
    from tuiprof.profiler import Profiler
    from tuiprof.spec import ProfilerOptions
    from tuiprof.cli.program import program_options
    from tuiprof.cli import build_parser, split_program

    argv, program = split_program(["run", "--", "python", "x.py"])
    args = build_parser().parse_args(argv)
    args.program = program
    opts = program_options(args, headless=False)
    assert opts.compiled_api_kinds_stay_on is False
    c, _ = _collector(sample_every=8)
    prof = Profiler(c.store, ProfilerOptions(cupti=False, nvml=False, alloc_every=0,
                                             compiled_api_kinds_stay_on=False))
    prof.cupti = c
    prof.status.mode = "eager"
    prof.token_started("decode", "compiled", 0, 0, 0)
    assert c.api_kinds_stay_on is False and c.api_lead is True
    prof.token_started("decode", "eager", 1, 0, 1)
    assert c.api_lead is False



def test_a_prefill_is_traced_at_most_once_a_period():
    """A program calling generate() for 20 tokens at a time brings a prefill every 21 steps:
    tracing each (kind switches, thousands of records folded beside the decode) made a compiled
    program 20 % slower on the H100 (docs/performance.md#sampling). The first prefill is traced at
    once; the next only a sampling period after it; the decode bursts are unchanged."""
    c, _ = _collector(sample_every=1024)           # compiled: bursts of 4 in every 4,096
    period, call = 1024 * BURST, 21
    traced_prefills, traced_decode = [], []
    for seq in range(3 * period):
        prefill = seq % call == 0
        if c.on_token_start(seq, prefill=prefill):
            (traced_prefills if prefill else traced_decode).append(seq)
    # 4,096 = 1 (mod 21): the first prefill at or after 4,096 is 4,116, then at or after 8,212
    assert traced_prefills == [0, 4116, 8232]
    assert traced_decode == [k * period + i for k in range(3) for i in range(1, BURST + 1)]
    # eager (a period of 128): the built-in engine's prefill every 256 steps is always traced
    e, _ = _collector(sample_every=32)
    engine = [seq for seq in range(2048) if e.on_token_start(seq, prefill=seq % 256 == 0)
              and seq % 256 == 0]
    assert engine == list(range(0, 2048, 256))
