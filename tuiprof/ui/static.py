"""A read-only :class:`SessionControl` over one fixed :class:`StoreView` (``tuiprof view``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..control import SessionControl, SourceStatus


class FrozenStore:
    """Quacks like :class:`~tuiprof.store.SessionStore` for readers: ``view()`` returns the
    same immutable view every time; there is nothing to write or reset."""

    def __init__(self, view: Any) -> None:
        self._view = view
        self.meta = dict(view.meta)

    def view(self, raw: bool = True, raw_tokens: int | None = None, batch: Any = None) -> Any:
        return self._view if batch is None else self._view.select(batch)

    def reset(self) -> None:  # never called by StaticViewControl; kept for duck typing
        pass


class StaticViewControl(SessionControl):
    """A session that is a snapshot: every action answers that it is read-only."""

    def __init__(self, view: Any, source: str = "snapshot") -> None:
        self.store = FrozenStore(view)  # type: ignore[assignment]
        mode = view.meta.get("mode") or "eager"
        self.status = SourceStatus(state="read-only", mode=str(mode),
                                   message=f"snapshot {source}", live=False)

    @classmethod
    def from_path(cls, path: str | Path) -> "StaticViewControl":
        """Open a JSON snapshot written by ``e`` (needs :mod:`tuiprof.export`)."""
        from .adapters import read_snapshot
        return cls(read_snapshot(path), Path(path).name)

    def reset(self) -> str:
        return "read-only snapshot: nothing to reset"
