"""Figures the panes show say what they are, on replayed H100 data (Pilot, real Textual).

The live compiled session this reproduces: compiled decode traced only in rare bursts, the
generation loop restarting often, each restart bringing an (always traced) eager prefill."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tuiprof.collect.replay import Recording, replay_into
from tuiprof.store import SessionStore
from tuiprof.ui.app import make_app

from .conftest import FakeControl, screen_text


class SampledStore(SessionStore):
    """A real store whose decode tokens are marked untraced while ``untraced`` is set, as the
    CUPTI collector's sampling marks them between bursts (their records are then dropped)."""

    untraced = False

    def begin_token(self, phase, mode, start_ns, step, cycle=0, sampled=True, batch=1):
        if self.untraced and phase == "decode":
            sampled = False
        return super().begin_token(phase, mode, start_ns, step, cycle, sampled, batch)


_TS = {"K": (2, 3), "C": (3, 4), "S": (2, 3), "A": (4,), "R": (2, 3)}
_CORR = {"K": 13, "C": 6, "S": 5, "A": 6, "R": 4}   # correlation ids never repeat in a session


def shifted(rec: Recording, runs: int = 1, corr: int = 10**8) -> Recording:
    """The same recording ``runs`` times its own span later (the generation loop's next run,
    after the last), its correlation ids moved by ``runs * corr``."""
    span = max(m[2] for m in rec.marks) - min(m[2] for m in rec.marks) + 10**9
    dt, corr = runs * span, runs * corr
    def move(r):
        r = list(r)
        for i in _TS[r[0]]:
            r[i] += dt
        i = _CORR[r[0]]
        if len(r) > i and r[i]:
            r[i] += corr
        return tuple(r)
    return dataclasses.replace(
        rec, marks=[[e, s, t + dt] for e, s, t in rec.marks], records=[move(r) for r in rec.records],
        nvml=[[row[0] + dt, *row[1:]] for row in rec.nvml])


@pytest.fixture
def restarted(recordings):
    """Compiled decode traced once, then a loop restart (traced prefill) and untraced decode."""
    st = SampledStore()
    replay_into(recordings["compiled"], st)
    last_traced = max(t.seq for t in st.view(raw=False).tokens if t.phase == "decode")
    st.untraced = True
    replay_into(shifted(recordings["compiled"]), st)
    return st, last_traced


def _run(store, size, body, mode="compiled"):
    app = make_app(FakeControl(store, mode=mode), title="t", refresh_hz=0, deterministic=True)

    async def main():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            app.refresh_now()
            await pilot.pause()
            await body(app, pilot)
    asyncio.run(main())


def test_token_footer_takes_kernel_figures_from_a_traced_token_of_its_phase(restarted, compiled_facts):
    store, traced = restarted
    view = store.view(raw=False)
    last = view.tokens[-1]
    prefill = [t for t in view.tokens if t.phase == "prefill"][-1]
    assert last.phase == "decode" and not last.sampled and prefill.kernels > 1000

    async def body(app, pilot):
        footer = str(app.query_one("#latency-summary").render())
        assert f"#{last.seq} decode/b1 compiled" in footer
        assert f"traced #{traced}: " in footer, footer
        kernels = compiled_facts.kernels_per_step[-1]          # the last traced decode step's
        assert f"{kernels:,} kernels" in footer and f"#{prefill.seq}" not in footer, footer
    _run(store, (200, 50), body)


def test_kernel_busy_sparkline_is_traced_decode_of_the_mode(restarted):
    store, _ = restarted
    view = store.view(raw=False)
    busy = [100.0 * t.busy_ns / (t.end_ns - t.start_ns) for t in view.tokens
            if t.phase == "decode" and t.sampled]

    async def body(app, pilot):
        await pilot.press("3")
        await pilot.pause()
        text = screen_text(app)
        line = next(ln for ln in text.splitlines() if "kernel busy/step" in ln)
        now, mean = [float(w[:-1]) for w in line.split("kernel busy/step")[1].split()[:2]]
        n = int(text.split("traced decode/compiled tokens: last ")[1].split()[0])
        assert now == pytest.approx(busy[-1], abs=0.05)     # the latest traced decode token
        assert mean == pytest.approx(sum(busy[-n:]) / n, abs=0.05)
    _run(store, (200, 50), body)


def test_comparison_labels_traced_token_counts(restarted, compiled_facts):
    store, _ = restarted
    traced = str(compiled_facts.decode_steps)          # the first run; the second is untraced
    every = str(2 * compiled_facts.decode_steps)

    async def body(app, pilot):
        await pilot.press("v")
        await pilot.pause(0.3)  # the comparison is built on a timer after the first paint
        app.refresh_now()
        await pilot.pause()
        lines = screen_text(app).splitlines()

        def cells(label, start=0):
            ln = next(ln for ln in lines[start:] if ln.strip().startswith(label))
            return [c.strip() for c in ln.split("│")]
        # the session has only compiled steps at batch 1: that configuration comes first
        assert cells("decode steps (all)")[1:3] == [every, "–"]   # every compiled decode step
        assert cells("traced decode steps")[1:3] == [traced, "–"]   # the kernel figures' base
        diff_at = next(i for i, ln in enumerate(lines) if ln.strip() == "Summary")
        assert cells("traced decode steps", diff_at)[1:3] == [traced, "–"]   # as the table above
        assert cells("decode steps (all)", diff_at)[1:3] == [every, "0"]
        assert not any("decode tokens" in ln for ln in lines)   # no unlabelled count left
    _run(store, (120, 50), body)


def _restarting_store(cycles: int = 30, decode: int = 4) -> SessionStore:
    """A generation loop that restarts every ``decode`` tokens: a prefill each time."""
    st = SessionStore()
    t = 1_000_000
    for c in range(cycles):
        for i in range(decode + 1):
            phase = "prefill" if i == 0 else "decode"
            ms = 600.0 + 7 * c if i == 0 else 50.0 + (i % 3)
            seq = st.begin_token(phase, "eager", t, i - 1, cycle=c)
            t += int(ms * 1e6)
            st.end_token(seq, t, ms)
            t += 1000
    return st


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
def test_prefill_labels_never_overlap_or_leave_the_chart(size):
    import re

    async def body(app, pilot):
        await pilot.press("1")          # the latency pane alone at 80x24
        await pilot.pause()
        app.refresh_now()
        await pilot.pause()
        text = screen_text(app)
        rows = [ln for ln in text.splitlines() if "ms" in ln and "prefill" in ln]
        assert rows, text
        for ln in rows:
            # every "<n>ms" on the label row belongs to a whole "prefill <n>ms" label, and
            # labels are apart ("prefill 664prefill 740…" and a cut "ll 932ms" were seen)
            assert len(re.findall(r"\d+ms", ln)) == len(re.findall(r"prefill \d+ms", ln)), ln
            assert not re.search(r"\dm?s?prefill", ln), ln
    _run(_restarting_store(), size, body, mode="eager")


def test_kernel_names_get_the_width_first_at_80x24(store):
    async def body(app, pilot):
        await pilot.press("2")
        await pilot.pause()
        app.refresh_now()
        await pilot.pause()
        text = screen_text(app)
        # cut to 24 characters before ("cuBLAS GEMV nvjet 64x8 s") while grid/block kept theirs
        assert "cuBLAS GEMV nvjet 64x8 split-K " in text, text
        assert "Triton fused add·cat·cos·index_copy·mean…" in text
        assert "% GPU" in text and "count" in text and "avg" in text
    _run(store, (80, 24), body)


def test_traced_steps_older_than_the_series_are_named_in_both_panes(recordings):
    """Compiled sampling traces 4 steps in 4,096: on the H100 at step 8,102 the utilisation
    pane said "no traced decode/compiled step yet" beside a latency footer and a kernel table
    built from 8 traced steps (they had left the series of 2,048). Both panes now give the
    store's running mean of those steps' kernel-busy share, the same figure."""
    st = SampledStore(series_len=80)
    replay_into(recordings["compiled"], st)
    view = st.view(raw=False)
    traced = [100.0 * t.busy_ns / (t.end_ns - t.start_ns) for t in view.tokens
              if t.phase == "decode" and t.kernels]
    st.untraced = True
    replay_into(shifted(recordings["compiled"]), st)
    replay_into(shifted(recordings["compiled"], 2), st)
    view = st.view(raw=False)
    assert not [t for t in view.tokens if t.phase == "decode" and t.kernels]
    mean = sum(traced) / len(traced)

    async def body(app, pilot):
        await pilot.press("3")
        await pilot.pause()
        text = screen_text(app)
        assert "no traced decode/compiled step yet" not in text
        assert f"none in the series; mean of {len(traced)} earlier" in text, text
        line = next(ln for ln in text.splitlines() if "kernel busy/step" in ln)
        shown = float(line.split("kernel busy/step")[1].split()[1][:-1])
        assert shown == pytest.approx(mean, abs=0.05)
        footer = str(app.query_one("#latency-summary").render())
        assert f"(mean of {len(traced)} earlier): busy {mean:.1f}% of its traced step" \
            in footer, footer
    _run(st, (200, 50), body)


def test_without_cupti_every_pane_says_cupti_is_off():
    """On the CPU the utilisation pane said "no traced decode/eager step yet" and the compare
    screen "no b1 eager decode kernels yet" (as if a trace were coming) while the latency
    footer said "no kernel records (CUPTI off)"."""
    st = SessionStore()
    for i in range(6):
        seq = st.begin_token("decode", "eager", i * 10**6, i)
        st.end_token(seq, i * 10**6 + 5 * 10**5, 0.5)
    st.set_collector("cupti", False, "no CUPTI: CUDA driver is not found")

    async def body(app, pilot):
        await pilot.press("3")
        await pilot.pause()
        text = screen_text(app)
        assert "step yet" not in text and "no kernel records (CUPTI off)" in text, text
        assert "no kernel records (CUPTI off)" in str(app.query_one("#latency-summary").render())
        await pilot.press("v")
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "no b1 eager decode kernels (CUPTI off)" in text and "kernels yet" not in text
    _run(st, (200, 50), body, mode="eager")
