"""A session's options as data: the built-in engine's run (:class:`EngineSpec`, ``--model``
resolved once) and what to collect and how (:class:`ProfilerOptions`). Built by the CLI (or a
benchmark, a test), taken as they are by every layer below (the session process, the
profiler, the engine): ``--model`` walks one way, cli -> session process -> profiler ->
engine, and nothing resolves it again. Pickled to a session process once; plain JSON for a
detached session's keeper. Nothing heavy is imported here."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .engine.load import DEFAULT_MAX_NEW_TOKENS, DEFAULT_PROMPT, expected_meta
from .engine.source import ModelSource, resolve_model


@dataclass(frozen=True)
class EngineSpec:
    """One run of the built-in engine: the model, resolved (:func:`resolve`), and how to run
    it. Frozen: a layer that needs another value makes a copy (``dataclasses.replace``)."""

    model: str                        # --model as given (names, file stems, a title)
    source: ModelSource               # --model resolved: registry entry, directory, HF cache
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    prompt: str | None = DEFAULT_PROMPT
    prompt_len: int = 16
    max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS
    loop: bool = False
    mode: str = "eager"
    compile_mode: str | None = None
    weights: str | None = None
    max_len: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    batch: int = 1
    max_batch: int | None = None
    tp: int = 1                       # ranks of a tensor-parallel job (each rank's copy says)

    @classmethod
    def resolve(cls, model: str, *, trust_remote_code: bool = False, **options: Any) -> "EngineSpec":
        """``model`` resolved (one line, :class:`~tuiprof.errors.TuiprofError`, when it does
        not), with ``options`` (the other fields)."""
        return cls(model=model, source=resolve_model(model, trust_remote_code=trust_remote_code),
                   **options)

    @property
    def trust_remote_code(self) -> bool:
        return self.source.trust_remote_code

    def engine_kwargs(self) -> dict:
        """The engine's keyword arguments (:func:`tuiprof.engine.load.load_engine`), the
        resolved model as its first."""
        kw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
              if f.name not in ("model", "source")}
        return {"model_spec": self.source, "trust_remote_code": self.trust_remote_code, **kw}

    def expected_meta(self) -> dict:
        """What a header shows before torch is imported (model, device, dtype, weights)."""
        return expected_meta(self.model, device=self.device, dtype=self.dtype, seed=self.seed,
                             weights=self.weights, source=self.source)

    def to_json(self) -> dict:
        return dict(dataclasses.asdict(self), source=self.source.to_json())

    @classmethod
    def from_json(cls, data: dict) -> "EngineSpec":
        return cls(**dict(data, source=ModelSource.from_json(data["source"])))


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
    # A native program's CUDA graphs (tuiprof run -- BINARY, --cuda-graph-trace): "node", every
    # kernel of every graph launch (CUPTI instruments each node at the launch, ~0.7 µs a node
    # on an H200); "graph", one record per launch and none of its kernels, for the program's
    # life (docs/native.md#llamacpp)
    cuda_graph_trace: str = "node"
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
    engine: EngineSpec | None = None   # the built-in engine's run (None: a program's session)
    started_at: float | None = None  # time.monotonic() at the command's start (start-up phases)

    def to_json(self) -> dict:
        """Plain data (a detached session's keeper reads it back with :meth:`from_json`)."""
        return dict(dataclasses.asdict(self),
                    engine=self.engine.to_json() if self.engine is not None else None)

    @classmethod
    def from_json(cls, data: dict) -> "ProfilerOptions":
        engine = data.get("engine")
        return cls(**dict(data, engine=EngineSpec.from_json(engine) if engine else None))
