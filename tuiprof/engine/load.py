"""Building an engine from ``--model``: what the CLI, benchmarks and tests call."""
from __future__ import annotations

import importlib.metadata
import inspect
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import TuiprofError
from ..startup import in_thread, note, phase
from . import compile_cache, compile_helper, precompiled
from .events import EngineListener
from .model_defs import DTYPE_BYTES
from .source import ModelSource, resolve_model

DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog. Profiling language models on a GPU"
DEFAULT_MAX_NEW_TOKENS = 256


@dataclass
class LoadedModel:
    """A built adapter and what is known about it."""

    adapter: object
    source: ModelSource
    device: str
    dtype: str
    weights: str                  # "random (seed N)" | "loaded from PATH"
    load_s: float
    params: int                   # this rank's parameters (all of them without --tp)
    info: dict = field(default_factory=dict)


def pick_device(device: str | None) -> str:
    """``device`` as given, else ``cuda`` when available, else ``cpu``."""
    import torch

    if device:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise TuiprofError(f"device '{device}' asked for, but torch {torch.__version__} "
                               f"sees no CUDA GPU; use --device cpu")
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(dtype: str | None, device: str, source: ModelSource) -> str:
    """``dtype`` as given; else the model's dtype (bf16) on CUDA and float32 on CPU (faster)."""
    if dtype:
        dt = dtype.replace("torch.", "")
        aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16",
                   "fp32": "float32", "float": "float32"}
        dt = aliases.get(dt, dt)
        if dt not in DTYPE_BYTES:
            raise TuiprofError(f"unknown dtype '{dtype}'; use one of {', '.join(DTYPE_BYTES)}")
        return dt
    if device.startswith("cuda"):
        return source.model_def.dtype if source.model_def.dtype in DTYPE_BYTES else "bfloat16"
    return "float32"


def nvidia_gpu_present() -> bool:
    """An NVIDIA GPU this process may use, judged without importing torch (device nodes)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidiactl") or any(Path("/proc/driver/nvidia/gpus").glob("*"))


def expected_meta(model_spec: str, *, device: str | None = None, dtype: str | None = None,
                  seed: int = 0, weights: str | None = None, trust_remote_code: bool = False,
                  source: ModelSource | None = None, **_: Any) -> dict:
    """What a header can show before torch is imported: model, device (as asked for, else
    ``cuda`` when an NVIDIA GPU is present), dtype and weights. The session replaces
    ``device`` and ``dtype`` with what it picked as soon as it knows (``load_model``).
    Empty when ``model_spec`` does not resolve (loading it then says why)."""
    try:
        source = source or resolve_model(model_spec, trust_remote_code=trust_remote_code)
    except TuiprofError:
        return {}
    dev = device or ("cuda" if nvidia_gpu_present() else "cpu")
    try:
        dt = pick_dtype(dtype, dev, source)
    except TuiprofError:
        dt = dtype or "?"
    path = weights or source.weights
    return {"model": source.name, "family": source.family, "device": dev, "dtype": dt,
            "weights": f"loaded from {path}" if path else f"random (seed {seed})"}


def start_device(device: str | None, warm: Callable[[str], None] | None = None
                 ) -> tuple[str | None, Callable[[], str]]:
    """Pick the device; on CUDA, create the context and the cuBLAS handle on a thread,
    overlapping the model code's imports.

    Returns the device if known already (else None) and a function that waits for that thread
    and returns the device (re-raising its error, which the first CUDA operation would have
    raised otherwise). With the ``cuda-thread`` way (:mod:`tuiprof.engine.imports`) CUDA's
    initialisation (``cuInit``, the device count) runs on the thread as well, and ``warm(dev)``
    after the context: work done there while transformers imports is off the first token's path.
    """
    import torch

    from . import imports

    if device == "cpu":
        return device, lambda: device
    on_thread = imports.on("cuda-thread")
    dev: str | None = None
    if not on_thread:
        with phase("CUDA init"):
            dev = pick_device(device)
            if not dev.startswith("cuda"):
                return dev, lambda: dev
            torch.cuda.init()
    failed: list[BaseException] = []
    picked: list[str] = [dev] if dev else []

    def context() -> None:
        try:
            if not picked:
                with phase("CUDA init"):
                    picked.append(pick_device(device))
                    if not picked[0].startswith("cuda"):
                        return
                    torch.cuda.init()
            with phase("CUDA context"):
                torch.cuda.synchronize(picked[0])  # creates the primary context (GIL released)
        except BaseException as exc:  # re-raised on the loading thread by wait()
            failed.append(exc)
            return
        try:  # a warm-up only: the handle goes back to torch's pool when this thread ends,
            torch.cuda.current_blas_handle()  # and the prefill's first matmul takes it
            if warm is not None:
                with phase("warming cuBLAS"):
                    warm(picked[0])
        except Exception:
            pass

    thread = in_thread(context, "tuiprof-cuda-init")

    def wait() -> str:
        thread.join()
        if failed:
            raise failed[0]
        return picked[0]

    return dev, wait


def gemm_warmup(config: dict, dtype: str, tokens: int) -> Callable[[str], None] | None:
    """Run the matrix products of a decoder's prefill and first decode step once, on random
    tensors of the model's shapes and dtype (nothing of the model's): cuBLAS/cuBLASLt pick and
    load their kernels then, not in the first prefill. None without the usual config keys or
    when a shape is too large to hold twice beside the model (lm heads of huge vocabularies)."""
    try:
        h, inter = int(config["hidden_size"]), int(config["intermediate_size"])
        nq = int(config["num_attention_heads"])
        nkv = int(config.get("num_key_value_heads") or nq)
        hd = int(config.get("head_dim") or h // nq)
        vocab = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    outs = sorted({nq * hd, nkv * hd, inter, vocab, (nq + 2 * nkv) * hd})
    shapes = [(m, h, n) for m in sorted({1, max(1, tokens)}) for n in outs]
    shapes += [(m, k, h) for m in sorted({1, max(1, tokens)}) for k in sorted({nq * hd, inter})]
    limit = 512 * 2**20

    def warm(dev: str) -> None:
        import torch

        dt = getattr(torch, dtype)
        if not dt.is_floating_point:
            return
        for m, k, n in shapes:
            if k * n * dt.itemsize > limit:
                continue
            a = torch.empty((m, k), dtype=dt, device=dev).normal_()
            w = torch.empty((n, k), dtype=dt, device=dev).normal_()
            torch.nn.functional.linear(a, w)
            del a, w
        torch.cuda.synchronize(dev)
        with phase("warming attention"):
            _warm_attention(dev, dt, nq, nkv, hd, h, tokens)
        torch.cuda.empty_cache()  # the model's build is not yet allocating: nothing else frees

    return warm


def _warm_attention(dev: str, dt: Any, nq: int, nkv: int, hd: int, h: int, tokens: int) -> None:
    """The attention and the elementwise kernels of a decoder's prefill, once, on random
    tensors of its shapes: the first use of each loads its kernel module (SDPA's flash kernels
    take about a second on the H200), which otherwise happens inside the first prefill.
    Attention as transformers' SDPA path calls it for a prefill into an empty cache: causal,
    no mask, the key/value heads grouped (``enable_gqa``). Only the prefill's: the first token
    waits for this thread, and each other variant (the decode step's masked one) loads a
    module of its own that the first token does not need."""
    import torch
    import torch.nn.functional as F

    t = max(1, tokens)
    q = torch.empty((1, nq, t, hd), dtype=dt, device=dev).normal_()
    k = torch.empty((1, nkv, t, hd), dtype=dt, device=dev).normal_()
    v = torch.empty_like(k).normal_()
    group = max(1, nq // max(1, nkv))
    try:
        F.scaled_dot_product_attention(q, k, v, is_causal=t > 1,
                                       **({"enable_gqa": True} if group > 1 else {}))
    except Exception:
        pass
    kv_len = max(64, t)
    # RMSNorm, rotary, SwiGLU, the cache's index_copy_, sampling: each kernel family once
    try:
        x = torch.empty((1, max(1, tokens), h), dtype=dt, device=dev).normal_()
        w = torch.ones(h, dtype=dt, device=dev)
        xf = x.float()
        y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt) * w
        half = y[..., : h // 2]
        rot = torch.cat((-y[..., h // 2:], half), dim=-1) * y.cos() + y * y.sin()
        act = F.silu(rot) * y
        cache = torch.zeros((1, nkv, kv_len, hd), dtype=dt, device=dev)
        cache.index_copy_(2, torch.arange(min(tokens, kv_len), device=dev),
                          q.new_zeros((1, nkv, min(tokens, kv_len), hd)))
        logits = act.float().softmax(-1)
        torch.argmax(logits[:, -1], dim=-1).tolist()
        emb = torch.nn.functional.embedding(torch.zeros((1, 1), dtype=torch.long, device=dev),
                                            torch.ones((8, h), dtype=dt, device=dev))
        del x, w, xf, y, half, rot, act, cache, logits, emb
    except Exception:
        pass
    torch.cuda.synchronize(dev)


def load_model(model_spec: str | ModelSource, *, device: str | None = None,
               dtype: str | None = None,
               seed: int = 0, max_len: int | None = None, trust_remote_code: bool = False,
               weights: str | None = None, tp: object = None,
               warm_tokens: int = 16) -> LoadedModel:
    """Build the adapter of ``model_spec`` (random weights unless some are found): a
    :class:`ModelSource` resolved already, or a name resolved here.

    ``warm_tokens``: the prompt length whose matrix products are warmed on CUDA while the model
    code imports (:func:`gemm_warmup`).

    ``tp``: a :class:`~tuiprof.engine.tensor_parallel.TPContext`: build this rank's shard.
    Reports its phases to the start-up tracker, if one listens (:mod:`tuiprof.startup`).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    source = (model_spec if isinstance(model_spec, ModelSource)
              else resolve_model(model_spec, trust_remote_code=trust_remote_code))
    from . import bytecode

    kept = bytecode.keep()  # before torch: an install without bytecode compiles it every start
    if kept:
        note("bytecode", kept)
    with phase("importing torch"):
        import torch

        from . import imports
        from .families import get_family
    warm = None
    if device != "cpu" and imports.on("warm-blas") and nvidia_gpu_present():
        warm = gemm_warmup(dict(source.model_def.config), pick_dtype(dtype, "cuda", source),
                           warm_tokens)
    dev, device_ready = start_device(device, warm)
    if dev is not None:
        note("device", dev)
        note("dtype", pick_dtype(dtype, dev, source))
    weights_path = weights or source.weights
    with phase("importing model code"):
        family = get_family(source.family)
        preload = getattr(family, "preload", None)
        if preload is not None:
            preload()
    dev = device_ready()
    dt = pick_dtype(dtype, dev, source)
    note("device", dev)
    note("dtype", dt)
    options = {"max_len": max_len, "trust_remote_code": trust_remote_code}
    accepted = inspect.signature(family.build).parameters
    kwargs = {k: v for k, v in options.items() if k in accepted}
    if tp is not None:
        if "tp" not in accepted:
            raise TuiprofError(f"--tp: the {source.family} family ({source.name}) has no "
                               f"tensor-parallel build; supported: {', '.join(tp_families())}")
        if weights_path:
            raise TuiprofError("--tp builds random weights only for now; drop --weights")
        kwargs["tp"] = tp
    t0 = time.perf_counter()
    with phase("building model"):
        try:
            adapter = family.build(source.model_def, device=dev, dtype=dt, seed=seed,
                                   weights=weights_path, **kwargs)
        except torch.cuda.OutOfMemoryError:
            raise _out_of_memory(f"building {source.name} in {dt}", "a smaller model") from None
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    module = getattr(adapter, "model", None) or getattr(adapter, "module", None)
    params = sum(p.numel() for p in module.parameters()) if module is not None else 0
    desc = f"loaded from {weights_path}" if weights_path else f"random (seed {seed})"
    return LoadedModel(adapter, source, dev, dt, desc, load_s, params)


def _out_of_memory(doing: str, remedy: str) -> TuiprofError:
    import torch

    free, total = torch.cuda.mem_get_info()
    return TuiprofError(f"CUDA out of memory {doing} ({free / 1024**3:.2f} of "
                        f"{total / 1024**3:.2f} GiB free); try {remedy}")


def tp_families() -> list[str]:
    """Families whose ``build`` takes ``tp`` (tensor-parallel shards)."""
    from .families import available_families, get_family

    return [f for f in available_families()
            if "tp" in inspect.signature(get_family(f).build).parameters]


def prompt_ids(loaded: LoadedModel, prompt: str | None, prompt_len: int, seed: int,
               batch: int = 1):
    """``[batch, T]`` prompt ids on the model's device and where they came from.

    With a tokenizer beside the weights the text prompt is tokenized (the first sequence);
    otherwise ``prompt_len`` deterministic ids are drawn from ``seed``. Further sequences get
    random ids of the same length, different per sequence (``switching.extend_prompt``).
    """
    from .switching import extend_prompt

    first, desc = _first_prompt(loaded, prompt, prompt_len, seed)
    if batch <= 1:
        return first, desc
    ids = extend_prompt(first, batch, loaded.adapter.vocab_size, seed)
    return ids, f"{batch} sequences of {ids.shape[1]} tokens (first: {desc})"


def _first_prompt(loaded: LoadedModel, prompt: str | None, prompt_len: int, seed: int):
    import torch

    adapter = loaded.adapter
    limit = max(1, adapter.max_len - 1)
    tok_dir = loaded.source.tokenizer
    if prompt and tok_dir:
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True,
                                                trust_remote_code=loaded.source.trust_remote_code)
            ids = tok(prompt, return_tensors="pt").input_ids[:, :limit]
            if ids.shape[1] > 0 and int(ids.max()) < adapter.vocab_size:
                return ids.to(loaded.device), f"text ({ids.shape[1]} tokens)"
        except Exception:  # a broken tokenizer must not stop a profile: fall back to ids
            pass
    n = max(1, min(prompt_len, limit))
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, adapter.vocab_size, (1, n), generator=gen)
    return ids.to(loaded.device), f"random ids ({n} tokens, seed {seed})"


def load_engine(model_spec: str | ModelSource, device: str | None = None,
                dtype: str | None = None,
                seed: int = 0, prompt: str | None = DEFAULT_PROMPT, prompt_len: int = 16,
                max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS, loop: bool = False,
                mode: str = "eager", compile_mode: str | None = None,
                trust_remote_code: bool = False, weights: str | None = None,
                max_len: int | None = None, temperature: float = 0.0, top_k: int = 0,
                listener: EngineListener | None = None,
                clock: Callable[[], int] | None = None, tp: int = 1, batch: int = 1,
                max_batch: int | None = None, background_compile: bool = True):
    """Build the model and return an :class:`~tuiprof.engine.generate.Engine`, not started.

    The static cache holds the prompt plus ``max_new_tokens`` unless ``max_len`` is given.
    ``batch`` sequences are decoded together; ``b``/``B`` in the app move it within 1 …
    ``max_batch`` (default: 256, or fewer when that many caches would not fit the GPU).
    ``tp`` > 1: this process is one rank of a tensor-parallel job (its environment says which,
    see :mod:`tuiprof.engine.distributed`); it builds its shard and runs in lockstep, at the
    batch it started with (the ranks do not agree on batch changes yet).
    """
    want_len = max_len or (max(prompt_len, 64) + (max_new_tokens or 1024))
    group = lock = shard = None
    if tp and tp > 1:
        from .distributed import record_clock, tp_group
        from .lockstep import Lockstep
        from .tensor_parallel import TPContext

        group = tp_group(device)
        if group.world_size != tp:
            raise TuiprofError(f"--tp {tp}, but the job has {group.world_size} ranks")
        device = group.device
        record_clock(group, clock or time.time_ns, "init")
        shard = TPContext(group.rank, group.world_size, group.group)
        lock = Lockstep(group.side, group.rank, group.world_size)
    loaded = load_model(model_spec, device=device, dtype=dtype, seed=seed, max_len=want_len,
                        trust_remote_code=trust_remote_code, weights=weights, tp=shard,
                        warm_tokens=prompt_len)
    import torch

    from .generate import Engine

    if batch < 1:
        raise TuiprofError(f"--batch must be at least 1, not {batch}")
    ids, prompt_desc = prompt_ids(loaded, prompt, prompt_len, seed, batch)
    info = engine_info(loaded)
    limit = max_batch or fitting_batch(loaded)
    info.update(prompt=prompt_desc, prompt_tokens=int(ids.shape[1]), max_new_tokens=max_new_tokens,
                loop=loop, seed=seed, batch=batch, max_batch=max(limit, batch))
    if group is not None:
        limit = batch
        info["max_batch"] = batch
        record_clock(group, clock or time.time_ns, "ready")
        info.update(group.info())
        info["lockstep"] = lock.stats      # the engine's agreement costs, updated in place
        module = getattr(loaded.adapter, "model", None) or getattr(loaded.adapter, "module", None)
        info["tp_shard"] = getattr(module, "tp_shard", None)
        from .tensor_parallel import TEST_DELAY_ENV, test_delay_ns
        if os.environ.get(TEST_DELAY_ENV):   # a test's injected lateness: say so in the data
            info["test_tp_delay"] = {"spec": os.environ[TEST_DELAY_ENV], "rank": group.rank,
                                     "us": test_delay_ns(group.rank) / 1000}
        try:  # "params" is this rank's shard; the whole model's count, for findings
            from .model_defs import param_count
            info["model_params"] = param_count(loaded.source.model_def)
        except Exception:
            pass
    compiling = CompileSetup(loaded, model_spec, seed=seed, max_len=want_len,
                             prompt_len=int(ids.shape[1]), weights=weights,
                             trust_remote_code=trust_remote_code, info=info)
    engine = Engine(loaded.adapter, ids, device=loaded.device, max_new_tokens=max_new_tokens,
                    loop=loop, mode=mode, compile_mode=compile_mode, temperature=temperature,
                    top_k=top_k, seed=seed, clock=clock, listener=listener, info=info,
                    lockstep=lock, max_batch=max(limit, batch),
                    background_compile=background_compile,
                    compile_helper=compiling if group is None else None,
                    compile_cache=compiling.prepare)
    compiling.engine = engine
    engine.info["compile_mode"] = engine.compile_mode
    try:  # the starting batch's KV cache: at start-up (its own phase), not in the first prefill
        engine.allocate()
    except torch.cuda.OutOfMemoryError:
        raise _out_of_memory(f"allocating a KV cache of {loaded.adapter.max_len} positions for "
                             f"{batch} sequence(s)", "a smaller --batch, or a shorter --max-len "
                             "or --max-new-tokens") from None
    return engine


class CompileSetup:
    """What an engine built here needs for its compiles: the persistent inductor cache of this
    model (:mod:`tuiprof.engine.compile_cache`) and a helper process that fills it
    (:mod:`tuiprof.engine.compile_helper`) with the same model, shapes and compile mode."""

    HELPER_MARGIN = 2 * 1024**3   # GPU memory left free beside the helper's copy

    def __init__(self, loaded: LoadedModel, model_spec: str | ModelSource, *, seed: int,
                 max_len: int,
                 prompt_len: int, weights: str | None, trust_remote_code: bool,
                 info: dict) -> None:
        self.loaded, self.model_spec, self.seed, self.max_len = loaded, model_spec, seed, max_len
        self.prompt_len, self.weights, self.trust = prompt_len, weights, trust_remote_code
        self.info = info
        self.engine = None
        self.cache_dir: Path | None = None
        self._idle = None             # a prestarted helper, waiting
        self._prepared = False
        self._precompiled = None      # PrecompiledSteps, or False when there are none
        self._saving: list = []       # helpers that save the compiled step after their compile

    def prepare(self) -> None:
        """Before this process's first compile (or helper): the key directory, pointed at (and
        pruned). Once."""
        if self._prepared:
            return
        self._prepared = True
        mode = getattr(self.engine, "compile_mode", "")
        fields = compile_cache.key_fields(self.loaded.source.model_def, self.loaded.dtype,
                                          self.info.get("device_name", self.loaded.device), mode)
        self.cache_dir = compile_cache.prepare(fields)
        compile_cache.activate(self.cache_dir)
        if self.engine is not None:
            self.engine.info["inductor_cache"] = str(self.cache_dir) if self.cache_dir else None

    def prestart(self) -> None:
        """Start the helper now, to wait with its imports done (policy ``prestart``)."""
        if compile_helper.policy(self.loaded.device.startswith("cuda")) != "prestart":
            return
        self.prepare()
        if self.warm([int(self.info.get("batch") or 1)]):
            # the likely first compile is cached: no helper to wait for it, but this process
            # compiles (or loads the saved step) itself then, and inductor's modules take a
            # second to import: done now, beside eager decoding, not after `c`
            in_thread(precompiled.preimport, "tuiprof-compile-imports")
            return
        if self._idle is None or not self._idle.alive:
            self._idle = self._new_helper()

    MARKS = 64   # compile signatures kept in a cache directory's marks file

    def _signature(self, batches: list[int]) -> dict:
        return {"max_len": self.max_len, "prompt_len": self.prompt_len,
                "batches": [int(b) for b in batches]}

    def warm(self, batches: list[int]) -> bool:
        """True when a compile of ``batches`` (in this order, with these shapes) has completed
        with this cache directory before: its graphs and kernels are all there."""
        self.prepare()
        if self.cache_dir is None:
            return False
        return self._signature(batches) in _read_marks(self.cache_dir / "compiled.json")

    def compiled(self, batches: list[int]) -> None:
        """A compile of ``batches`` completed: mark it in the cache directory (bounded)."""
        if self.cache_dir is None:
            return
        path = self.cache_dir / "compiled.json"
        marks = [m for m in _read_marks(path) if m != self._signature(batches)]
        marks = (marks + [self._signature(batches)])[-self.MARKS:]
        tmp = path.with_name(f".compiled.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(marks))
            os.replace(tmp, path)
        except OSError:
            pass

    def precompiled(self):
        """The compiled steps kept across sessions in this model's cache directory
        (:mod:`tuiprof.engine.precompiled`), for this engine's shapes; None when off."""
        if self._precompiled is None:
            self.prepare()
            pre = False
            if self.cache_dir is not None and precompiled.supported():
                adapter = type(self.loaded.adapter)
                pre = precompiled.PrecompiledSteps(self.cache_dir, {
                    "max_len": self.max_len, "prompt_len": self.prompt_len,
                    "compile_mode": getattr(self.engine, "compile_mode", ""),
                    "adapter": f"{adapter.__module__}.{adapter.__qualname__}"})
            self._precompiled = pre
        return self._precompiled or None

    def close(self) -> None:
        """The session ends: an idle helper goes with it."""
        idle, self._idle = self._idle, None
        if idle is not None:
            idle.stop()
        saving, self._saving = self._saving, []
        for h in saving:   # still saving a compiled step: the file is written whole or not
            h.stop()

    def __call__(self, batches: list[int]):
        """A helper compiling ``batches`` in order (the prestarted one if it still runs); None
        when switched off. Raises :class:`TuiprofError` (one line) when it cannot run here."""
        if compile_helper.policy(self.loaded.device.startswith("cuda")) == "off":
            return None
        self.prepare()
        need = self._helper_bytes(max(batches))
        if need is not None:
            import torch

            free, _ = torch.cuda.mem_get_info(torch.device(self.loaded.device))
            if free < need + self.HELPER_MARGIN:
                self.close()
                raise TuiprofError(f"{free / 1024**3:.1f} GiB of GPU memory free, a second copy "
                                   f"of the model needs {need / 1024**3:.1f} + "
                                   f"{self.HELPER_MARGIN / 1024**3:.0f}")
        model = self.model_spec
        request = {"model": model.to_json() if isinstance(model, ModelSource) else model,
                   "device": self.loaded.device,
                   "dtype": self.loaded.dtype, "seed": self.seed, "max_len": self.max_len,
                   "prompt_len": self.prompt_len, "weights": self.weights,
                   "trust_remote_code": self.trust, "batches": [int(b) for b in batches],
                   "compile_mode": getattr(self.engine, "compile_mode", None)}
        pre = self.precompiled()
        if pre is not None:  # after its compile, it saves the step for the next session
            request["precompile"] = {"dir": str(self.cache_dir), "fields": pre.fields}
        h, self._idle = self._idle, None
        if h is None or not h.alive:
            h = self._new_helper()
        try:
            h.send(request)
        except OSError:  # it ended between the check and the request: one more try
            h.stop()
            h = self._new_helper()
            h.send(request)
        if pre is not None:
            self._saving = [x for x in self._saving if x.alive] + [h]
        return h

    def _new_helper(self):
        log = self.cache_dir / "helper.log" if self.cache_dir else None
        h = compile_helper.CompileHelper(self.loaded.source.family, self.loaded.device,
                                         str(self.cache_dir) if self.cache_dir else None, log)
        h.start()
        return h

    def _helper_bytes(self, batch: int) -> int | None:
        if not self.loaded.device.startswith("cuda"):
            return None
        per_seq = getattr(self.loaded.adapter, "cache_bytes", None)
        cache = per_seq(batch) if per_seq is not None else 0
        return self.loaded.params * DTYPE_BYTES[self.loaded.dtype] + cache


def _read_marks(path: Path) -> list:
    try:
        marks = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return marks if isinstance(marks, list) else []


def fitting_batch(loaded: LoadedModel, cap: int | None = None, share: float = 0.5) -> int:
    """The largest power of two up to ``cap`` (default 256) whose KV cache takes at most
    ``share`` of the GPU memory free now (activations, the logits and a second cache during a
    switch need the rest). ``cap`` on a CPU or when the adapter cannot say its cache size."""
    from .generate import DEFAULT_MAX_BATCH

    cap = cap or DEFAULT_MAX_BATCH
    per_seq = getattr(loaded.adapter, "cache_bytes", None)
    if not loaded.device.startswith("cuda") or per_seq is None:
        return cap
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(loaded.device))
    one = max(1, per_seq(1))
    n = 1
    while n * 2 <= cap and n * 2 * one <= share * free:
        n *= 2
    return n


def engine_info(loaded: LoadedModel) -> dict:
    """Facts about the model and the machine for headers and exports."""
    import torch

    from .model_defs import embedding_params

    defn = loaded.source.model_def
    cuda = loaded.device.startswith("cuda")
    try:
        emb = embedding_params(defn)
    except Exception:
        emb = None
    try:  # the installed version, without importing transformers (seconds) for a torch-only model
        tf_version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        tf_version = None
    return {
        "model": defn.name,
        "model_def": {"name": defn.name, "family": defn.family, "config": dict(defn.config)},
        "family": defn.family,
        "origin": loaded.source.origin,
        "study": defn.study,
        "params": loaded.params,
        "non_embedding_params": loaded.params - emb if emb is not None else None,
        "weight_bytes": loaded.params * DTYPE_BYTES[loaded.dtype],
        "dtype": loaded.dtype,
        "device": loaded.device,
        "device_name": torch.cuda.get_device_name(loaded.device) if cuda else "cpu",
        "weights": loaded.weights,
        "max_len": loaded.adapter.max_len,
        "vocab_size": loaded.adapter.vocab_size,
        "load_s": round(loaded.load_s, 3),
        "torch": str(torch.__version__),  # a TorchVersion would import torch where unpickled (UI)
        "cuda": torch.version.cuda,
        "transformers": tf_version,
    }
