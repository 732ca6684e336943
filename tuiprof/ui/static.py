"""A read-only :class:`SessionControl` over one fixed :class:`StoreView` (``tuiprof view``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..control import SessionControl, SourceStatus
from ..errors import safe_text


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
        if isinstance(view.meta.get("program"), dict):  # a program's run: how it ended
            self.status.extra["program"] = dict(view.meta["program"])

    @classmethod
    def from_path(cls, path: str | Path) -> "StaticViewControl":
        """Open a JSON snapshot written by ``e`` (needs :mod:`tuiprof.export`)."""
        from .adapters import read_snapshot
        return cls(read_snapshot(path), safe_text(Path(path).name))

    def reset(self) -> str:
        return "read-only snapshot: nothing to reset"


class StaticRanksControl(StaticViewControl):
    """A multi-rank snapshot: the same read-only session, one store per rank (a RankSet)."""

    def __init__(self, ranks: Any, source: str = "snapshot") -> None:
        super().__init__(ranks[0], source)
        self._ranks = ranks
        self.world_size = ranks.world_size
        self._stores = [FrozenStore(v) for v in ranks.views]
        self.store = self._stores[0]  # type: ignore[assignment]

    def rank_store(self, rank: int) -> FrozenStore:
        return self._stores[rank]

    def rank_status(self, rank: int) -> SourceStatus:
        return self.status

    def views(self, raw: bool = False, raw_tokens: int | None = None) -> Any:
        return self._ranks


class StaticProcessesControl(StaticRanksControl):
    """A snapshot of a program's processes: ``g`` cycles those that did GPU work or marked
    steps, ``a`` lists them all (as in the live app)."""

    def __init__(self, ranks: Any, source: str = "snapshot") -> None:
        from types import SimpleNamespace  # noqa: PLC0415

        from ..store.rank_set import process_facts  # noqa: PLC0415
        super().__init__(ranks, source)
        self.selected = 0
        self.entries = [SimpleNamespace(pid=process_facts(v).get("pid"),
                                        name=process_facts(v).get("name") or v.meta.get("model"))
                        for v in ranks.views]

    def cycle(self, current: int, step: int = 1) -> int:
        from ..store.rank_set import cycle_active  # noqa: PLC0415

        return cycle_active(self._ranks.views, current, step)
