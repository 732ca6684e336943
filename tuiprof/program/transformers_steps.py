"""Steps of Hugging Face transformers' own generation loops, found without changing the program.

Where the boundary is (the same in transformers 5.17 and 5.23, and in 4.5x):

* ``generate()``: every forward call of the loop (prefill, each decode step, beam search,
  assisted decoding) is preceded by exactly one call of the model's
  ``prepare_inputs_for_generation``, in plain Python outside the forward. That call is wrapped
  (on the model *instance*, for the duration of one ``generate()``), so it also works when the
  forward is ``torch.compile``d or replays CUDA graphs (``cache_implementation="static"``):
  a hook inside the compiled region would be traced by dynamo and never run per step. A step
  lasts from one such call to the next (the forward, logits processing, sampling and the
  stopping check that syncs), and the last one ends when ``generate()`` returns. The returned
  model inputs give the batch (sequences) and the input positions. The model's forward runs
  from that call's return to the next call of ``_update_model_kwargs_for_generation`` (also
  wrapped on the instance): kernels launched outside that window are ``generate()``'s own.
* continuous batching (``generate_batch``, ``ContinuousBatchingManager``):
  ``ContinuousBatchingManager._generation_step`` runs one forward over the scheduled requests;
  the step lasts for that call and its batch is the number of requests scheduled in it, which
  varies from step to step. Its GPU time is from events recorded at the call's start and end on
  the generation thread's current stream (the legacy default stream, which waits for the
  manager's own compute stream).
* The step's device work is queued when ``generate()`` calls its logits processors
  (``LogitsProcessorList.__call__``, right after the forward and before the step's sync):
  tuiprof's bookkeeping for the step boundary is done there, while the device computes.
* All of a ``generate()`` step's device work is queued once its stopping criteria
  (``StoppingCriteriaList.__call__``) return, after the token's selection and right before the
  loop reads whether to stop (the step's sync): the step's second CUDA event goes there
  (:mod:`.step_gpu_time`). A streamer's copy of the token to the host comes before them: with a
  streamer, the step's GPU time includes that sync's wait.

Prefill: the forward calls at the start of a ``generate()`` while every call so far fed more
than one position per sequence (a chunked prefill is several such calls); in continuous
batching, a step that feeds more positions than it has requests. Mode: ``compiled`` for decode
steps of ``generate()`` when transformers compiles the forward itself (a static cache on a GPU,
``_valid_auto_compile_criteria``), for every step when the model's ``forward`` was wrapped by
``torch.compile``, and for continuous-batching steps that run CUDA graphs or a compiled forward.

The patches go in when transformers' modules are imported (a post-import hook, so the program
imports transformers itself, in its own order and with its own environment) and come out with
:meth:`TransformersSteps.uninstall`.
"""
from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable

from .import_hooks import Patches
from .steps import DECODE, PREFILL, StepRecorder
from .transformers_requests import ArrivalMiddleware, TransformersRequests, patch_uvicorn

GENERATION = "transformers.generation.utils"
LOGITS = "transformers.generation.logits_process"
STOPPING = "transformers.generation.stopping_criteria"
BATCHING = "transformers.generation.continuous_batching.continuous_api"
# transformers serve's handlers of /v1/completions, /v1/chat/completions and /v1/responses
SERVING = {"transformers.cli.serving.completion": "CompletionHandler",
           "transformers.cli.serving.chat_completion": "ChatCompletionHandler",
           "transformers.cli.serving.response": "ResponseHandler"}
SERVER = "transformers.cli.serving.server"   # build_server: the FastAPI app
SOURCE = "transformers"


class TransformersSteps:
    """Installs and removes the patches; reports steps to ``recorder``."""

    name = "transformers"

    def __init__(self, recorder: StepRecorder, describe: Callable[[Any], None] | None = None,
                 requests: Any = None) -> None:
        self.recorder = recorder
        self.describe = describe or (lambda model: None)  # called once per model seen
        # the store's requests (None: steps only); tuiprof/program/transformers_requests.py
        self.requests = TransformersRequests(requests, recorder.clock) if requests is not None \
            else None
        self._patches = Patches()
        self._local = threading.local()
        self._seen: set[int] = set()

    # ----------------------------------------------------------------- install
    def install(self) -> None:
        """Patch now what is imported, and the rest when the program imports it."""
        hooks = {GENERATION: self._patch_generate, LOGITS: self._patch_logits,
                 STOPPING: self._patch_stopping, BATCHING: self._patch_batching}
        if self.requests is not None:
            hooks.update({name: self._patch_handler for name in SERVING})
            hooks[SERVER] = self._patch_server
        self._patches.on_import(hooks)

    def uninstall(self) -> None:
        """Restore every patched attribute and drop the import hook."""
        self._patches.restore()

    def _replace(self, owner: Any, name: str, new: Any) -> None:
        self._patches.replace(owner, name, new)

    def _patch_generate(self, mod: Any) -> None:
        cls = getattr(mod, "GenerationMixin", None)
        if cls is None or "generate" not in cls.__dict__:
            return
        orig = cls.__dict__["generate"]
        steps = self

        @functools.wraps(orig)
        def generate(model, *args, **kwargs):
            if getattr(steps._local, "depth", 0):  # a generate() inside one (assistant model)
                return orig(model, *args, **kwargs)
            with _GenerateScope(steps, model) as scope:
                out = orig(model, *args, **kwargs)
                scope.result(out, kwargs)
                return out

        self._replace(cls, "generate", generate)

    def _patch_logits(self, mod: Any) -> None:
        """Every decoding loop of ``generate()`` runs its logits processors right after the
        forward is launched and before the step's sync: the step's device work is queued."""
        self._inside_generate(getattr(mod, "LogitsProcessorList", None),
                              before=self.recorder.launched)

    def _patch_stopping(self, mod: Any) -> None:
        """Once the stopping criteria return, a ``generate()`` step's device work is all queued
        and the loop syncs next: the step's GPU time ends there."""
        self._inside_generate(getattr(mod, "StoppingCriteriaList", None),
                              after=self.recorder.device_done)

    def _inside_generate(self, cls: Any, before: Callable[[str], None] | None = None,
                         after: Callable[[str], None] | None = None) -> None:
        """Wrap ``cls.__call__``: ``before`` / ``after`` it, when called inside a
        ``generate()`` (not an assistant model's), tell the recorder (``before(SOURCE)``)."""
        if cls is None or "__call__" not in cls.__dict__:
            return
        orig = cls.__dict__["__call__"]
        local = self._local

        @functools.wraps(orig)
        def __call__(obj, *args, **kwargs):
            inside = getattr(local, "depth", 0)
            if inside and before is not None:
                before(SOURCE)
            out = orig(obj, *args, **kwargs)
            if inside and after is not None:
                after(SOURCE)
            return out

        self._replace(cls, "__call__", __call__)

    def _patch_batching(self, mod: Any) -> None:
        cls = getattr(mod, "ContinuousBatchingManager", None)
        if cls is None or "_generation_step" not in cls.__dict__:
            return
        orig = cls.__dict__["_generation_step"]
        rec = self.recorder
        steps = self

        reqs = self.requests

        hooks = rec.hooks

        @functools.wraps(orig)
        def _generation_step(manager, *args, **kwargs):
            h = hooks.enter()   # tuiprof's own time on the batching thread, before the step
            try:
                proc = getattr(manager, "batch_processor", None)
                batch, positions, phase, mode = _batching_step(proc)
                model = getattr(manager, "model", None)
                if model is not None:
                    steps._describe_once(model)
                t = rec.clock()
                step = rec.begin(SOURCE, phase, batch=batch, positions=positions, mode=mode,
                                 start_ns=t)
                if step is not None and reqs is not None:
                    info = reqs.step_info(proc, manager)
                    if info is not None:
                        rec.step_requests(step, info)
            finally:
                hooks.leave(h)
            try:
                return orig(manager, *args, **kwargs)
            finally:
                if step is not None:
                    rec.end(SOURCE, step=step)

        self._replace(cls, "_generation_step", _generation_step)
        if reqs is not None:
            self._patch_batching_requests(mod, reqs)

    def _patch_batching_requests(self, mod: Any, reqs: TransformersRequests) -> None:
        """Arrivals (add_request), tokens and finishes (update_batch), failures, cancels."""
        cls = getattr(mod, "ContinuousBatchingManager", None)
        failed = reqs.failed_here
        wrap = functools.partial(self._patches.wrap, hooks=self.recorder.hooks)

        def added(t, rid, manager, input_ids, *args, **kwargs):
            reqs.added(rid, input_ids, t)

        def cancelled(_, out, manager, request_id, *args, **kwargs):
            reqs.cancelled(request_id)

        def before_update(proc, *args, **kwargs):
            return reqs.before_update(proc)

        def after_update(seen, out, *args, **kwargs):
            reqs.after_update(seen)

        def failed_state(router, state, error, *args, **kwargs):
            reqs.failed(state, error)

        wrap(cls, "add_request", failed, "add_request", stamp=self.recorder.clock, after=added)
        wrap(cls, "cancel_request", failed, "cancel_request", after=cancelled)
        wrap(getattr(mod, "ContinuousBatchProcessor", None), "update_batch", failed,
             "update_batch", before=before_update, after=after_update)
        router = getattr(mod, "OutputRouter", None)
        if router is not None and "deliver_batch" in router.__dict__:
            deliver = router.__dict__["deliver_batch"]

            @functools.wraps(deliver)
            def deliver_batch(self_, *args, **kwargs):
                reqs.delivering()   # the tokens' time: before the server's loop can have them
                return deliver(self_, *args, **kwargs)

            self._replace(router, "deliver_batch", deliver_batch)
        wrap(router, "fail_and_deliver", failed, "fail_and_deliver", before=failed_state)

    def _patch_server(self, mod: Any) -> None:
        """transformers serve's app: an outermost middleware notes when a request arrives."""
        if "build_server" not in mod.__dict__:
            return
        orig = mod.__dict__["build_server"]
        clock = self.recorder.clock
        hooks = self.recorder.hooks

        steps = self

        @functools.wraps(orig)
        def build_server(*args, **kwargs):
            app = orig(*args, **kwargs)
            try:
                app.add_middleware(ArrivalMiddleware, clock=clock, requests=steps.requests,
                                   hooks=hooks)
            except Exception:  # an app that takes no middleware: handler times only
                pass
            patch_uvicorn(steps._replace, clock, steps.recorder.hooks)
            return app

        self._replace(mod, "build_server", build_server)

    def _patch_handler(self, mod: Any) -> None:
        """transformers serve: an HTTP request reaches its handler (before tokenisation)."""
        cls = getattr(mod, SERVING.get(mod.__name__, ""), None)
        if cls is None or "handle_request" not in cls.__dict__:
            return
        orig = cls.__dict__["handle_request"]
        reqs = self.requests
        hooks = self.recorder.hooks

        @functools.wraps(orig)
        async def handle_request(handler, body, request_id, *args, **kwargs):
            h = hooks.enter()
            try:
                reqs.http_arrived(request_id)
            except Exception as exc:
                reqs.failed_here("handle_request", exc)
            finally:
                hooks.leave(h)
            return await orig(handler, body, request_id, *args, **kwargs)

        self._replace(cls, "handle_request", handle_request)

    def _describe_once(self, model: Any) -> None:
        if id(model) not in self._seen:
            self._seen.add(id(model))
            try:
                self.describe(model)
            except Exception:  # describing a model must never break the program
                pass


class _GenerateScope:
    """One ``generate()``: wraps the instance's per-step hook and closes the last step."""

    def __init__(self, steps: TransformersSteps, model: Any) -> None:
        self.steps = steps
        self.model = model
        self.multi = True            # every forward so far fed > 1 position per sequence
        self.auto_compile = False    # transformers chose its compiled forward for decode
        self.compiled_forward = _is_compiled(getattr(model, "forward", None))
        self._saved: dict[str, Any] = {}
        # its rows as requests (None: steps only)
        self.rows = steps.requests.generate_scope() if steps.requests is not None else None
        self._done = False

    def __enter__(self) -> "_GenerateScope":
        steps, model = self.steps, self.model
        steps._local.depth = 1
        steps._describe_once(model)
        steps.recorder.enter_scope(SOURCE)
        prepare = getattr(model, "prepare_inputs_for_generation", None)
        if callable(prepare):
            self._set("prepare_inputs_for_generation", self._wrap_prepare(prepare))
        criteria = getattr(model, "_valid_auto_compile_criteria", None)
        if callable(criteria):
            self._set("_valid_auto_compile_criteria", self._wrap_criteria(criteria))
        update = getattr(model, "_update_model_kwargs_for_generation", None)
        if callable(update):
            self._set("_update_model_kwargs_for_generation", self._wrap_update(update))
        return self

    def result(self, out: Any, kwargs: dict) -> None:
        """generate() returned ``out``: each row's length (its end-of-sequence token)."""
        self._done = True
        if self.rows is not None:
            h = self.steps.recorder.hooks.enter()
            try:
                self.rows.done(out, _eos(self.model, kwargs), True)
            except Exception as exc:
                self.rows.owner.failed_here("generate() rows", exc)
            finally:
                self.steps.recorder.hooks.leave(h)

    def __exit__(self, *exc: object) -> None:
        if self.rows is not None and not self._done:  # generate() raised
            try:
                self.rows.done(None, None, False)
            except Exception as exc:
                self.rows.owner.failed_here("generate() rows", exc)
        for name, old in self._saved.items():
            if old is _MISSING:
                self.model.__dict__.pop(name, None)
            else:
                self.model.__dict__[name] = old
        self.steps.recorder.exit_scope(SOURCE)
        self.steps._local.depth = 0

    def _set(self, name: str, fn: Any) -> None:
        self._saved[name] = self.model.__dict__.get(name, _MISSING)
        self.model.__dict__[name] = fn   # an instance attribute shadows the class's method

    def _wrap_prepare(self, prepare: Callable) -> Callable:
        rec = self.recorder = self.steps.recorder

        @functools.wraps(prepare)  # generate() inspects its signature: keep it
        def prepare_inputs_for_generation(*args, **kwargs):
            t = rec.clock()
            inputs = prepare(*args, **kwargs)
            h = rec.hooks.enter()   # the rest is tuiprof's, on the program's thread
            try:
                batch, per_seq = _input_shape(inputs)
                self.multi = self.multi and per_seq > 1
                phase = PREFILL if self.multi else DECODE
                compiled = self.compiled_forward or (phase == DECODE and self.auto_compile)
                step = rec.begin(SOURCE, phase, batch=batch, positions=batch * per_seq,
                                 mode="compiled" if compiled else "eager", start_ns=t)
                rows = self.rows
                if rows is not None and step is not None:
                    try:
                        rows.step(inputs, batch, per_seq, t)
                    except Exception as exc:
                        rows.owner.failed_here("generate() rows", exc)
                rec.model_begins(step)  # generate() calls the forward next
            finally:
                rec.hooks.leave(h)
            return inputs

        return prepare_inputs_for_generation

    def _wrap_update(self, update: Callable) -> Callable:
        """generate() calls it right after each forward returns: the model's window ends."""
        rec = self.steps.recorder
        rows = self.rows

        @functools.wraps(update)
        def _update_model_kwargs_for_generation(*args, **kwargs):
            h = rec.hooks.enter()
            try:
                rec.model_ends(SOURCE)
                if rows is not None:  # the forward is launched: the rows' store work goes here
                    try:
                        rows.flush_due()
                    except Exception as exc:
                        rows.owner.failed_here("generate() rows", exc)
            finally:
                rec.hooks.leave(h)
            return update(*args, **kwargs)

        return _update_model_kwargs_for_generation

    def _wrap_criteria(self, criteria: Callable) -> Callable:
        @functools.wraps(criteria)
        def _valid_auto_compile_criteria(*args, **kwargs):
            ok = criteria(*args, **kwargs)
            self.auto_compile = bool(ok)
            return ok

        return _valid_auto_compile_criteria


_MISSING = object()


def _eos(model: Any, kwargs: dict) -> Any:
    """The end-of-sequence id(s) a generate() call stopped at."""
    if kwargs.get("eos_token_id") is not None:
        return kwargs["eos_token_id"]
    for cfg in (kwargs.get("generation_config"), getattr(model, "generation_config", None)):
        eos = getattr(cfg, "eos_token_id", None)
        if eos is not None:
            return eos
    return None


def _input_shape(inputs: Any) -> tuple[int, int]:
    """(sequences, positions per sequence) of the model inputs of one forward."""
    get = inputs.get if isinstance(inputs, dict) else (lambda k: None)
    for key in ("input_ids", "decoder_input_ids", "inputs_embeds", "decoder_inputs_embeds"):
        t = get(key)
        shape = getattr(t, "shape", None)
        if shape is not None and len(shape) >= 2:
            return int(shape[0]), int(shape[1])
    return 1, 1


def _is_compiled(fn: Any) -> bool:
    """A function wrapped by ``torch.compile`` (or a module compiled with ``.compile()``)."""
    if fn is None:
        return False
    if hasattr(fn, "_torchdynamo_orig_callable"):
        return True
    owner = getattr(fn, "__self__", None)
    return getattr(owner, "_compiled_call_impl", None) is not None


def _batching_step(proc: Any) -> tuple[int, int, str, str]:
    """(batch, positions, phase, mode) of the continuous-batching step about to run."""
    io = getattr(proc, "inputs_and_outputs", None)
    pairs = getattr(io, "io_pairs", None)  # asynchronous batching: the pair in use
    if pairs is not None:
        io = getattr(pairs[getattr(io, "current_pair", 0)], "host_io", io)
    reqs = list(getattr(io, "requests_in_batch", None) or ())
    batch = len(reqs) or int(getattr(io, "num_request_in_batch", 0) or 0)
    positions = sum(int(getattr(r, "query_length", 1) or 1) for r in reqs) or batch
    phase = PREFILL if positions > batch else DECODE
    runner = getattr(proc, "model_runner", None)
    if phase == DECODE:
        compiled = getattr(runner, "use_cuda_graph_decode", False) or getattr(
            runner, "_compiled_decode", None) is not None
    else:
        compiled = getattr(runner, "use_cuda_graph_varlen", False) or getattr(
            runner, "_compiled_varlen", None) is not None
    return batch, positions, phase, "compiled" if compiled else "eager"


def make(session: Any) -> TransformersSteps | None:
    """transformers' loops mark the steps unless they come from NVTX ranges."""
    if session.step_ranges:
        return None
    return TransformersSteps(session.recorder, describe=session.describe_model,
                             requests=getattr(session, "requests", None))
