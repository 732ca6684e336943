"""The decode-loop detector on synthetic kernel streams: a decode step is an embedding, L
identical layers and a head (norm, LM head, sampler); the prefill launches other kernels
(GEMMs for GEMVs) in the same shape. Deterministic: fixed seeds."""
from __future__ import annotations

import random

import pytest

from decode_like_stream import STEP as DL_STEP
from decode_like_stream import decode_like

from tuiprof.analysis.period import DECODE, MIN_CONFIDENCE, PREFILL, cut, detect, similarity

LAYER = ["rmsnorm", "gemv_qkv", "rope", "attn", "gemv_o", "add", "rmsnorm", "gemv_up", "silu",
         "gemv_down", "add"]
STEP = ["embed"] + LAYER * 6 + ["rmsnorm", "gemv_lm_head", "argmax"]          # 70 kernels
PREFILL_K = (["embed"] + [k.replace("gemv", "gemm").replace("attn", "attn_prefill")
                          for k in LAYER] * 6 + ["rmsnorm", "gemm_lm_head", "argmax"])
SETUP = ["fill_weights"] * 12


def timed(seq, step_starts=(), big=()):
    """Start/end times: kernels 3 us long 1.5 us apart, 40 us of host before each step start
    (the token read back), 500 us before each ``big`` index (set-up done, prompt copied)."""
    step_starts, big = set(step_starts), set(big)
    t, st, en = 0, [], []
    for i in range(len(seq)):
        t += 500_000 if i in big else 40_000 if i in step_starts else 1_500
        st.append(t)
        t += 3_000
        en.append(t)
    return st, en


def build(gens, noise=0.0, seed=0, setup=True):
    """Generations of ``n`` decode steps each after a prefill; ``noise``: chance that a step
    gets a stray kernel at a random place. Returns (names, decode step starts, prefill starts,
    starts of each decode step's kernels list)."""
    rnd = random.Random(seed)
    seq = list(SETUP) if setup else []
    dec, pre = [], []
    for n in gens:
        pre.append(len(seq))
        seq += PREFILL_K
        for _ in range(n):
            dec.append(len(seq))
            s = list(STEP)
            if rnd.random() < noise:
                s.insert(rnd.randrange(1, len(s)), rnd.choice(["memset_kernel", "copy_kernel"]))
            seq += s
    return seq, dec, pre


def phases(cut):
    return [s.phase for s in cut.steps]


def test_a_prefill_then_decode_steps_with_the_host_gap():
    seq, dec, pre = build([32])
    st, en = timed(seq, dec, pre)
    c = detect(seq, st, en)
    assert c.loop.period == len(STEP) and c.loop.time_supported
    assert phases(c) == [PREFILL] + [DECODE] * 32
    assert [s.first for s in c.steps] == pre + dec            # exact boundaries
    assert c.steps[0].end == dec[0]                           # set-up kernels are no step
    assert [tuple(seq[s.first:s.end]) for s in c.steps[1:]] == [tuple(STEP)] * 32
    assert c.identical == 32 and c.confidence == 1.0 and c.label() == "high"


def test_without_times_the_step_begins_after_the_prefill():
    seq, dec, pre = build([20])
    c = detect(seq)
    assert c.loop.period == len(STEP) and not c.loop.time_supported
    assert c.decode == 20 and c.prefill == 1 and c.confidence == 1.0
    # the prefill ends with the sampler the decode step ends with: without a host gap the
    # boundary cannot tell them apart and moves by that one kernel (docs/native.md)
    assert [s.first for s in c.steps if s.phase == DECODE] == [d - 1 for d in dec]


def test_layers_are_never_taken_for_steps():
    seq, dec, _ = build([24], setup=False)
    for args in ((seq,), (seq, *timed(seq, dec))):
        c = detect(*args)
        assert c.loop.period == len(STEP) and c.decode == 24


def test_noise_in_half_the_steps():
    seq, dec, pre = build([40], noise=0.5, seed=3)
    st, en = timed(seq, dec, pre)
    c = detect(seq, st, en)
    assert c.loop.period == len(STEP)
    assert c.decode == 40 and [s.first for s in c.steps if s.phase == DECODE] == dec
    assert 10 < c.identical < 30          # the others carry a stray kernel
    assert c.confidence == 1.0            # a stray kernel leaves a step 98.6 % similar


def test_noise_without_times_still_counts_every_step():
    seq, dec, _ = build([40], noise=0.5, seed=4)
    c = detect(seq)
    assert c.loop.period == len(STEP) and c.decode == 40 and c.confidence >= 0.9


@pytest.mark.parametrize("timed_run", [False, True])
def test_generations_of_varying_length(timed_run):
    gens = [12, 30, 7, 21]
    seq, dec, pre = build(gens)
    args = (seq, *timed(seq, dec, pre)) if timed_run else (seq,)
    c = detect(*args)
    assert c.loop.period == len(STEP)
    assert phases(c) == sum(([PREFILL] + [DECODE] * n for n in gens), [])
    if timed_run:
        assert [s.first for s in c.steps] == sorted(pre + dec)


def test_generations_of_one_length_are_cut_per_token_when_the_host_waits():
    seq, dec, pre = build([15] * 4)
    c = detect(seq, *timed(seq, dec, pre))
    assert c.loop.period == len(STEP) and c.decode == 60 and c.prefill == 4


def test_a_kernel_every_tenth_step_is_noise_not_the_period():
    seq = list(PREFILL_K)
    dec = []
    for k in range(60):
        dec.append(len(seq))
        seq += STEP
        if k % 10 == 9:
            seq.append("kv_block_alloc")
    for args in ((seq,), (seq, *timed(seq, dec))):
        c = detect(*args)
        assert c.loop.period == len(STEP) and c.decode == 60


@pytest.mark.parametrize("host_gap_us,stall_every", [
    ((100, 300), 60),   # a stall now and then, sometimes longer than the host gap
    ((10, 30), 10),     # stalls in every step, most longer than the host gap
])
def test_a_host_that_stalls_inside_steps_moves_no_boundary(host_gap_us, stall_every):
    """decode_like.cu's stream: the host gap opens before every step, but a host thread that
    stalls between two of a step's first launches leaves the GPU idle inside the step, at
    times longer than the gap before it; each step still begins at its first kernel."""
    for seed in range(3):
        recs, firsts, prefill = decode_like(512, seed=seed, host_gap_us=host_gap_us,
                                            stall_every=stall_every)
        ks = sorted((r for r in recs if r[0] == "K"), key=lambda r: r[2])
        c = detect([k[1] for k in ks], [k[2] for k in ks], [k[3] for k in ks],
                   [k[12] for k in ks])
        assert c.loop.period == len(DL_STEP) and c.loop.time_supported
        assert phases(c) == [PREFILL] + [DECODE] * 512
        assert ks[c.steps[0].first][13] == prefill
        dec = c.steps[1:]
        assert [ks[s.first][13] for s in dec] == firsts, seed
        assert all([k[1] for k in ks[s.first:s.end]] == DL_STEP for s in dec)
        assert c.identical == 512 and c.label() == "high"


def test_a_prefill_with_the_decode_kernels_names_is_told_by_its_length():
    seq = list(STEP) * 21
    st, en = [], []
    t = 0
    for i in range(len(seq)):
        long = i < len(STEP)                       # the first step works on the prompt
        t += 40_000 if i % len(STEP) == 0 else 1_500
        st.append(t)
        t += 30_000 if long else 3_000
        en.append(t)
    c = detect(seq, st, en)
    assert phases(c) == [PREFILL] + [DECODE] * 20
    # a live cut that goes on after a decode step: its first step, long as it is (the host
    # stalled), is a decode step
    assert phases(cut(seq, c.loop, st, en, after_decode=True)) == [DECODE] * 21


def test_two_loops_interleaved_on_two_streams():
    rnd = random.Random(7)
    a = ["a_embed"] + ["a_gemv", "a_act"] * 5 + ["a_head", "a_argmax", "a_copy"]  # 14
    b = ["b_x", "b_y", "b_z", "b_w", "b_v"]                                      # 5
    names, streams = [], []
    ia = ib = 0
    while ia < 14 * 60:
        if rnd.random() < 0.6:
            names.append(a[ia % 14]); streams.append(7); ia += 1
        else:
            names.append(b[ib % 5]); streams.append(13); ib += 1
    assert detect(names).loop is None           # merged, neither loop repeats
    c = detect(names, streams=streams)
    assert (c.loop.stream, c.loop.period, c.loop.anchor) == (7, 14, "a_embed")
    assert c.decode == 60 and c.confidence >= 0.9
    idx = c.indices
    assert all(streams[idx[i]] == 7 for s in c.steps for i in range(s.first, s.end))
    assert [(o["stream"], o["kernels_per_step"]) for o in c.others] == [(13, 5)]


def test_two_loops_alternating_on_one_stream_make_one_step():
    a = ["a_embed"] + ["a_gemv"] * 6 + ["a_argmax"]
    b = ["b_embed"] + ["b_gemv"] * 3 + ["b_argmax"]
    c = detect((a + b) * 30)
    assert c.loop.period == len(a) + len(b) and c.decode >= 29


def test_no_loop_in_noise_and_too_few_steps_are_not_trusted():
    rnd = random.Random(1)
    assert detect([rnd.choice("abcdefghij") for _ in range(3000)]).loop is None
    c = detect(PREFILL_K + STEP * 3)
    assert c.decode == 3 and c.confidence < MIN_CONFIDENCE and not c.usable
    assert detect([]).loop is None and detect(["k"] * 3).loop is None


def test_similarity_is_a_multiset_overlap():
    assert similarity(["a", "b", "c"], ["c", "b", "a"]) == 1.0
    assert similarity(["a", "b"], ["a", "b", "x"]) == pytest.approx(2 / 3)
    assert similarity([], ["a"]) == 0.0


def test_describe_says_what_was_found():
    seq, dec, pre = build([16])
    d = detect(seq, *timed(seq, dec, pre)).describe()
    assert d["found"] and d["kernels_per_step"] == 70 and d["decode_steps"] == 16
    assert d["confidence_label"] == "high" and d["boundary"] == "host gap before each step"
    assert detect(["x"] * 2).describe() == {"found": False,
                                              "reason": "no kernel sequence repeats in 2 kernels"}
