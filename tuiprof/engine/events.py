"""What the engine tells its listener: token boundaries and state changes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

STATES = ("loading", "prefill", "decode", "compiling", "paused", "stopped", "done", "error")


@dataclass(slots=True)
class TokenEvent:
    """One step: the prefill's or a decode step's, over every sequence of the batch."""

    index: int        # tokens generated in this engine's life, 0 = the prefill's token
    step: int         # -1 for prefill, else decode step within the current cycle
    phase: str        # "prefill" | "decode"
    mode: str         # "eager" | "compiled" (prefill always runs eager)
    token_id: int
    start_ns: int     # engine clock just before the step's work was launched
    end_ns: int       # engine clock after the token reached the host
    host_ms: float    # perf_counter wall time of the step
    gpu_ms: float | None   # CUDA-event time of the step's GPU work (None on CPU)
    cycle: int
    batch: int = 1         # sequences the step advanced (a decode step makes ``batch`` tokens)
    compiling: bool = False  # run while a compile ran in the background (timed apart)
    token_ids: list | None = None  # every sequence's token when batch > 1 (``token_id``: the first)


class EngineListener(Protocol):
    """Receives engine callbacks, on the engine thread: keep them short and never block.

    Per token: ``token_started`` before the step's work is launched, ``token_launched`` once it
    is queued and before the engine waits for the token (on a GPU the device is busy then: work
    done here is off the loop's critical path), ``token_finished`` once the token is on the host.
    ``batch``: sequences the step advances (None: the engine's configured batch, which is also
    the step's configuration); ``positions``: input positions over all of them; ``host``: the
    call comes from the thread that launches the step's work, at its boundary (a program's
    steps seen from another thread, time windows or NVTX ranges, are not).
    A step source that cannot tell when the work is queued never calls ``token_launched``.
    ``model_ns`` (``token_launched``'s argument, when the source knows it): the host window
    ``(start_ns, end_ns)`` in which the step's model forward launched its work, on the clock of
    the step marks; kernels launched outside it are the loop's own (sampling, ``generate()``'s
    bookkeeping).
    """

    def token_started(self, phase: str, mode: str, step: int, cycle: int, start_ns: int,
                      batch: int | None = None, positions: int = 1, host: bool = True) -> None: ...

    def token_launched(self, model_ns: tuple[int, int] | None = None) -> None: ...

    def token_finished(self, ev: TokenEvent) -> None: ...

    def state_changed(self, state: str, message: str = "") -> None: ...

    # Optional: ``configuration_changed(batch, compiling)`` is called (when defined) before the
    # first step of a new batch and when a background compile starts or ends.


class NullListener:
    """A listener that ignores everything."""

    def token_started(self, phase: str, mode: str, step: int, cycle: int, start_ns: int,
                      batch: int | None = None, positions: int = 1, host: bool = True) -> None:
        pass

    def token_launched(self, model_ns: tuple[int, int] | None = None) -> None:
        pass

    def token_finished(self, ev: TokenEvent) -> None:
        pass

    def state_changed(self, state: str, message: str = "") -> None:
        pass


class CollectingListener(NullListener):
    """Keeps every event and state (tests, headless runs); list appends are thread-safe."""

    def __init__(self) -> None:
        self.events: list[TokenEvent] = []
        self.states: list[tuple[str, str]] = []
        self.started = 0
        self.model_windows: list[tuple[int, int] | None] = []   # per token_launched call

    def token_started(self, phase: str, mode: str, step: int, cycle: int, start_ns: int,
                      batch: int | None = None, positions: int = 1, host: bool = True) -> None:
        self.started += 1

    def token_launched(self, model_ns: tuple[int, int] | None = None) -> None:
        self.model_windows.append(model_ns)

    def token_finished(self, ev: TokenEvent) -> None:
        self.events.append(ev)

    def state_changed(self, state: str, message: str = "") -> None:
        self.states.append((state, message))

    @property
    def token_ids(self) -> list[int]:
        return [e.token_id for e in self.events]
