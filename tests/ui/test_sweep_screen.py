"""`tuiprof sweep --ui`: the sweep screen fills its table as cells finish, an injected OOM shows."""
from __future__ import annotations

import asyncio
import time

from textual.widgets import DataTable

from tuiprof.ui.screens.sweep import SweepApp, SweepScreen


def test_sweep_app_shows_cells_and_oom(monkeypatch):
    monkeypatch.setenv("TUIPROF_SWEEP_FAULT", "oom:gpt2-tiny:64")
    app = SweepApp(dict(models=["gpt2-tiny"], seq_lens=[32, 64], warmup=1, iters=1,
                        device="cpu", profile=False))

    async def main():
        async with app.run_test(size=(120, 30)) as pilot:
            t0 = time.monotonic()
            while app.result is None and time.monotonic() - t0 < 120:
                await asyncio.sleep(0.1)
            screen = app.screen
            assert isinstance(screen, SweepScreen)
            table = screen.query_one(DataTable)
            rows = [table.get_row_at(i) for i in range(table.row_count)]
            await pilot.press("escape")
            return rows

    rows = asyncio.run(main())
    assert [r[1] for r in rows] == ["32", "64"]
    assert rows[0][5] == "ok" and rows[1][5] == "oom"
    assert app.return_value is not None and len(app.return_value.cells) == 2
