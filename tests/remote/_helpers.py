"""What the remote-session tests share: waiting on a live app, reading its screen."""
from __future__ import annotations

import asyncio
import time


async def until(pred, app, seconds: float = 60.0) -> None:
    """Refresh ``app`` until ``pred()`` holds; fail after ``seconds``."""
    t_end = time.monotonic() + seconds
    while not pred():
        assert time.monotonic() < t_end, "timed out"
        app.refresh_view()
        await asyncio.sleep(0.1)


def screen_text(app) -> str:
    """The current screen as plain text."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in s) for s in strips)
