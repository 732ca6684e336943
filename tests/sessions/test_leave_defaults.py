"""A session left on (``tuiprof run --detach``) samples a quarter as often as the live app and
reads NVML at 2 Hz unless told otherwise; the live app and headless keep their rates, and
``--sample-every live`` / ``--nvml-hz`` give a detached session the live app's again. The
policy is said in the snapshot's words."""
from __future__ import annotations

import argparse

import pytest

from tuiprof.cli.options import LEAVE_NVML_HZ, child_options, nvml_hz, sample_every
from tuiprof.cli.run import add_run_arguments, check_arguments
from tuiprof.collect.native_sampling import AUTO_NATIVE, BurstSchedule
from tuiprof.errors import TuiprofError
from tuiprof.profiler import Profiler
from tuiprof.sampling import AUTO_SAMPLE_EVERY, LEAVE_SAMPLE_EVERY, tracing_policy
from tuiprof.spec import ProfilerOptions
from tuiprof.store import SessionStore


def _args(*argv: str, detach: bool = False) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    args = p.parse_args(list(argv))
    args.detach = detach
    return args


def test_a_detached_session_samples_a_quarter_as_often_and_nvml_at_2_hz():
    left_on = _args(detach=True)
    assert sample_every(left_on, False) == "leave"
    assert nvml_hz(left_on) == LEAVE_NVML_HZ == 2.0
    assert child_options(left_on)["sample_every"] == "leave"   # its followed processes too
    assert child_options(left_on)["nvml_hz"] == 2.0
    assert LEAVE_SAMPLE_EVERY == {m: 4 * n for m, n in AUTO_SAMPLE_EVERY.items()}


@pytest.mark.parametrize("headless", [False, True])
def test_the_live_app_and_headless_keep_their_rates(headless):
    args = _args(*(["--headless"] if headless else []))
    assert sample_every(args, headless) == "auto"
    assert nvml_hz(args) == 10.0


def test_a_detached_session_takes_the_rates_it_is_given():
    args = _args("--sample-every", "live", "--nvml-hz", "10", detach=True)
    assert sample_every(args, False) == "live" and nvml_hz(args) == 10.0
    check_arguments(_args("--sample-every", "leave"))   # the word is an accepted value
    with pytest.raises(TuiprofError, match="--nvml-hz 0: must be positive"):
        check_arguments(_args("--nvml-hz", "0"))


def test_the_policy_in_the_snapshot_words():
    store = SessionStore()
    prof = Profiler(store, ProfilerOptions(nvml=False, cupti=False, sample_every="leave"))
    assert prof._sample_every("eager") == 256 and prof._sample_every("compiled") == 4096
    assert store.meta["tracing"] == tracing_policy("leave", 4096) == (
        "bursts of 4 steps in every 16384 traced (a session left on: a quarter of the live "
        "app's)")
    # a native binary is sampled by time: a burst a quarter as often too
    assert BurstSchedule.from_option("leave").every == 4 * AUTO_NATIVE
