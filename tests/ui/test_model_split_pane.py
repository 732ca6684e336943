"""The kernels pane and the findings say how many of a step's kernels its model forward
launched and how many the loop around it did (a user's generate() against the model)."""
from __future__ import annotations

import asyncio

from tuiprof.ui.app import make_app
from tuiprof.ui.static import StaticViewControl
from tuiprof.ui.widgets.findings_pane import FindingsPane

from split_data import FILL, split_store

from .conftest import screen_text


def _screens(store, tmp_path, keys=("2", "5")) -> list[str]:
    app = make_app(StaticViewControl(store.view(), "x.json"), title="t", export_dir=tmp_path,
                   refresh_hz=0, deterministic=True)
    texts: list[str] = []

    async def main():
        async with app.run_test(size=(200, 50)) as pilot:
            for key in keys:
                await pilot.press(key)
                app.refresh_now()
                await pilot.pause()
                texts.append(" ".join(screen_text(app).split()))
            texts.append(" | ".join(f.title for f in app.main.query_one(FindingsPane).found))
    asyncio.run(main())
    return texts


def test_the_split_is_on_the_kernels_pane_and_in_the_findings(tmp_path):
    store = split_store(loop_name=FILL)
    kernels, _, findings = _screens(store, tmp_path)
    assert "per step: model 20 (0.08 ms) + loop 20 (0.22 ms)" in kernels
    assert "generate() launches 73% of the step's kernel time outside the model" in findings


def test_no_split_without_a_model_window(tmp_path, store):
    """A session whose steps mark no model window (a recording, an NVTX range) says nothing
    of a split."""
    kernels, _, findings = _screens(store, tmp_path)
    assert "per step: model" not in kernels and "outside the model" not in findings
