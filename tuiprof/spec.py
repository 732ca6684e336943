"""A session's options as data: what to collect and how (:class:`ProfilerOptions`). Built by
the CLI (or a benchmark, a test), taken as it is by every layer below (the session process,
the profiler), pickled to a session process once. Nothing heavy is imported here."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProfilerOptions:
    """What to collect and how."""

    cupti: bool = True
    nvml: bool = True
    nvml_hz: float = 10.0
    sample_every: int | str = "auto"  # CUPTI device records for 1 token in N; "auto": see below
                                      # ("live": the same, also where "auto" would mean 1)
    alloc_every: int | str = "auto"  # caching-allocator stats every N tokens (0: never); "auto":
                                     # AUTO_ALLOC_EVERY
    buffer_bytes: int = 8 * 1024 * 1024
    api: bool = True
    # Compiled mode keeps CUPTI's API kinds on between bursts (their ids off): the engine's
    # compiled step makes a few API calls. A program's own per-step ops around its CUDA graphs
    # make hundreds (generate(): ~44 ops a step, ~10 API calls each), each intercepted while
    # the kinds are on, so `tuiprof run` switches them off between bursts (False) and on again
    # one token before each burst, never together with the device kinds.
    compiled_api_kinds_stay_on: bool = True
    memory: bool = True  # CUPTI memory records (every device allocation), on between bursts too
    # CUPTI graph records between bursts in compiled mode (every step's device span). Off: with
    # them on, a compiled qwen3-0.6b session segfaulted on the H100 within seconds
    # (docs/performance.md#cupti-and-cuda-graphs); every step's device time comes from its
    # CUDA-event pair instead.
    graphs: bool = False
    # CUPTI attached only around its sampling bursts (and a prefill due to be traced) and
    # finalized between them: an attached CUPTI, even with every kind off, cost eager decode
    # 15-30 % and compiled 2-15 % on the H100 (docs/performance.md). In compiled mode the CUDA
    # graphs are dropped (recorded again, no recompile) around each switch, since a CUPTI
    # finalized under graphs it saw kills their next replay; the steps that record them
    # again are timed apart (TokenRow.rerecord). One GPU only: the built-in engine, and a
    # program whose steps are marked on the thread that launches them (transformers,
    # tuiprof.step) and that records no CUDA graph of its own; --cupti-attached turns it off.
    detach_between_bursts: bool = True
    # Do the store's per-token work in token_launched, while the device computes the next step
    # (False: right after each token's sync, on the decode loop's critical path).
    overlap: bool = True
    # GIL switch interval while collecting. The record consumer and the generation thread share
    # the GIL; with Python's default 5 ms, the generation thread can wait up to 5 ms for it
    # after every CUDA sync (once per compiled token). None keeps the interpreter's setting.
    switch_interval_s: float | None = None
    measure_peaks: bool = False  # copy + matmul at start-up, for the roofline
    device_index: int = 0        # the GPU NVML samples (a tensor-parallel rank's own GPU)
    engine_kwargs: dict = field(default_factory=dict)
    started_at: float | None = None  # time.monotonic() at the command's start (start-up phases)
