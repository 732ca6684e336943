"""CUPTI activity collection with ``cupti-python``.

The buffer-completed callback runs on CUPTI's own thread. It is a hot path: every Python
instruction in it is taken from the generation thread through the GIL. So it only turns each
activity object into a record tuple (:mod:`tuiprof.store.records`) and hands the list over
through a deque; a consumer thread folds batches into the store. Runtime/driver API records are
enabled one callback id at a time (launches, malloc/free, synchronisations), never the whole API:
all API records made eager decode about 16 times slower on the H100.

Sampling: with ``sample_every=K`` (K > 1) device activity and the API subset are traced in
bursts: in every period of ``K * BURST`` tokens the kinds are enabled for ``BURST + 1`` tokens, the first of which is a
warm-up whose records are dropped (kernels of a CUDA graph that straddle the switch came back
with wrong timestamps on the H100); the store marks every token outside the burst
``sampled=False`` and analysis/UI say so. Tracing itself is what costs compiled decode most
(CUDA-graph kernels are instrumented by CUPTI), so sampling must switch the kinds off, not just
drop records.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Protocol

from ..errors import safe_text
from ..store import RECORDS, SessionStore
from .base import CollectorUnavailable
from .cupti_raw import (KIND_GRAPH_TRACE, Layout, LayoutError, LibraryResolver, NameCache,
                        RawBuffers, find_libcupti, parse_buffer)

DEFAULT_BUFFER_BYTES = 8 * 1024 * 1024
BURST = 4  # consecutive tokens traced per sampling period
SWITCH_LEAD = 8  # untraced tokens between a mode switch and the next burst's warm-up
ATTACH_LEAD = 2  # with CUPTI attached for bursts only: tokens attached before a warm-up

RUNTIME_APIS = (
    "cudaLaunchKernel_v7000", "cudaLaunchKernel_ptsz_v7000", "cudaLaunchKernelExC_v11060",
    "cudaLaunchKernelExC_ptsz_v11060", "cudaGraphLaunch_v10000", "cudaGraphLaunch_ptsz_v10000",
    "cudaMalloc_v3020", "cudaFree_v3020", "cudaMallocAsync_v11020", "cudaFreeAsync_v11020",
    "cudaDeviceSynchronize_v3020", "cudaStreamSynchronize_v3020", "cudaEventSynchronize_v3020",
    "cudaMemcpyAsync_v3020",
    # what else makes CUPTI memory records (their correlation ids name the call)
    "cudaHostAlloc_v3020", "cudaMallocHost_v3020", "cudaFreeHost_v3020",
    "cudaMallocFromPoolAsync_v11020",
)
DRIVER_APIS = (
    "cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch", "cuMemAlloc_v2", "cuMemFree_v2",
    "cuMemAllocAsync", "cuMemFreeAsync", "cuStreamSynchronize", "cuCtxSynchronize",
    "cuMemHostAlloc", "cuMemAllocHost_v2", "cuMemFreeHost", "cuMemCreate", "cuMemRelease",
    "cuMemAllocFromPoolAsync",
)


class CuptiUnavailable(CollectorUnavailable):
    """CUPTI cannot start here; the message is one line for the status bar."""


class MarkerSink(Protocol):
    """Takes NVTX marker records before the store sees a buffer's activity records.

    ``feed(markers, records)`` runs on the consumer thread for every parsed buffer (and with
    empty lists about twice a second): it may open and close steps from the markers, and
    returns the records to fold now, holding back any whose step may not be known yet.
    ``drain()`` gives back everything still held (at stop).
    """

    def feed(self, markers: list, records: list) -> list: ...

    def drain(self) -> list: ...


def import_cupti():
    """Import cupti-python's bindings or raise :class:`CuptiUnavailable` with the reason."""
    try:
        from cupti import cupti  # noqa: PLC0415 - optional dependency, imported on demand
    except Exception as exc:  # ImportError, or a missing libcupti.so
        raise CuptiUnavailable(f"no CUPTI: cupti-python could not be loaded ({exc.__class__.__name__}: "
                               f"{str(exc)[:80]}); install cupti-python matching your CUDA") from None
    return cupti


class CuptiCollector:
    """Collects CUPTI activity records into a :class:`SessionStore` (a
    :class:`~tuiprof.collect.base.Collector`)."""

    name = "cupti"

    def __init__(self, store: SessionStore, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                 api: bool = True, memory: bool = True, sample_every: int = 1,
                 flush_period_ms: int = 500, raw: bool = True,
                 api_kinds_stay_on: bool = False, markers: MarkerSink | None = None,
                 graph_trace: bool = False) -> None:
        self.store = store
        self.raw = raw
        self.markers = markers  # NVTX marker records go here (CUPTI's MARKER kind is enabled)
        self._layout = Layout()
        self._names = NameCache()
        self._libraries = LibraryResolver()
        self._rawbufs: RawBuffers | None = None
        self.buffer_bytes = buffer_bytes
        self.api = api
        self.memory = memory
        self.sample_every = max(1, int(sample_every))
        self.flush_period_ms = flush_period_ms
        self._queue: deque = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._consumer: threading.Thread | None = None
        self._cupti = None
        self._device_kinds: list = []
        self._enabled_kinds: list = []
        self._api_names: dict[tuple[int, int], str] = {}
        self._api_kinds: list = []   # RUNTIME, DRIVER
        self._api_filter: list = []  # (enable function, cbid, 0/1): the subset's per-id filter
        self._api_on = False         # the subset's records are delivered
        self._api_kinds_on = False   # the RUNTIME/DRIVER kinds are on
        self.api_kinds_stay_on = api_kinds_stay_on
        # the API kinds come on one token before a burst (their ids still off), never together
        # with the device kinds: that combination left CUDA-graph kernels with wrong durations
        self.api_lead = api_kinds_stay_on
        self._device_on = False
        # CUPTI graph records (one per CUDA-graph launch) while the device kinds are off would
        # give every compiled step a device span without tracing its kernels; opt-in, since
        # they crashed the process on the H100 (docs/performance.md)
        self.graph_trace = graph_trace
        self._graphs_on = False
        self.graph_error = ""
        self._origin = 0  # sampling periods count from this token sequence number
        self._prefill_seq: int | None = None  # the last prefill traced outside a burst
        self.paused = False  # benchmarks switch collection off without stopping CUPTI
        self.running = False
        # CUPTI attached only around bursts (compiled sessions: an attached CUPTI costs every
        # CUDA-graph replay 5-15 % on the H100; docs/performance.md). The profiler asks
        # attach_wanted() at each token start and drops the CUDA graphs around the switch.
        self.bursts_only = False
        self.attached = False
        self.detaches = 0
        self.stranded_buffers = 0  # buffers CUPTI still held at a finalize (summed)
        self._stale_said = 0
        self._lock = threading.Lock()  # CUPTI calls from the consumer vs. detach/attach
        self._parsing = threading.RLock()  # held while a buffer is parsed (detach waits)
        # self-measurement: seconds spent in the callback and in folding, for the overhead pane
        self.callback_s = 0.0
        self.fold_s = 0.0
        self.buffers = 0
        self._buffer_completed_impl = self._buffer_completed

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        """Subscribe and enable activity kinds; raises :class:`CuptiUnavailable`."""
        self._cupti = import_cupti()
        self._attach()
        self.running = True
        self._consumer = threading.Thread(target=self._consume, name="tuiprof-cupti-fold",
                                          daemon=True)
        self._consumer.start()
        self.announce()

    def _attach(self) -> None:
        """Register the buffer callbacks and enable the kinds (the device kinds on: a burst's
        state until the next token start decides); raises :class:`CuptiUnavailable`."""
        cupti = self._cupti
        K = cupti.ActivityKind
        try:
            if self.raw:
                cupti.get_timestamp()  # loads libcupti, whose C entry points we call directly
                if self._rawbufs is None:  # one pool for every attach (see RawBuffers)
                    self._rawbufs = RawBuffers(self.buffer_bytes, self._queue_raw)
                self._rawbufs.register(find_libcupti())
            else:
                cupti.activity_register_callbacks(self._buffer_requested, self._on_buffer)
        except Exception as exc:
            raise CuptiUnavailable(_busy_message(exc)) from None
        self._device_kinds = [K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET]
        self._device_on = self._api_on = self._api_kinds_on = self._graphs_on = False
        try:
            self._set_device_kinds(True)
            if self.memory:
                cupti.activity_enable(K.MEMORY2)
                self._enabled_kinds.append(K.MEMORY2)
            if self.markers is not None and self.raw:
                cupti.activity_enable(K.MARKER)
                self._enabled_kinds.append(K.MARKER)
            if self.api:
                self._enable_api_subset()
                self._api_on = self._api_kinds_on = True
        except CuptiUnavailable:
            self._disable_all()
            raise
        except Exception as exc:
            self._disable_all()
            raise CuptiUnavailable(_busy_message(exc)) from None
        if self.flush_period_ms:  # records reach a live display at least this often
            try:
                cupti.activity_flush_period(self.flush_period_ms)
            except Exception:
                pass
        self.attached = True

    # -------------------------------------------------- attached for bursts only
    def attach_wanted(self, seq: int, prefill: bool = False) -> bool | None:
        """With ``bursts_only``: True when CUPTI should attach before token ``seq`` (two tokens
        before a burst's warm-up: one for the attach, one for the API kinds' lead; or a prefill
        due to be traced, see :meth:`on_token_start`), False when it should detach (outside
        that window), None when nothing changes."""
        if not self.bursts_only or not self.running or self.paused:
            return None
        window = self.in_burst_window(seq) or (prefill and self._prefill_due(seq))
        if window != self.attached:
            return window
        return None

    def in_burst_window(self, seq: int) -> bool:
        """Whether token ``seq`` falls in a burst's attached window (the burst and its lead),
        as :meth:`attach_wanted` reckons it."""
        period = self.sample_every * BURST
        phase = (seq - self._origin) % period
        return phase <= BURST or phase >= period - ATTACH_LEAD

    def _prefill_due(self, seq: int) -> bool:
        return self._prefill_seq is None or seq - self._prefill_seq >= self.sample_every * BURST

    def detach(self) -> None:
        """Hand every record over, switch every kind off and finalize CUPTI; the consumer
        goes on. CUDA graphs CUPTI saw must be gone first (:mod:`tuiprof.engine.graphs`)."""
        if not self.attached or self._cupti is None:
            return
        with self._lock:
            try:
                self._cupti.activity_flush_all(1)
            except Exception:
                pass
            graphs = self.graph_trace
            self._disable_all()
            self.graph_trace = graphs
            # Parse every record now: kernel names and API names are resolved through CUPTI
            # (pointers into its memory, get_callback_name), which the finalize frees/re-inits.
            with self._parsing:
                self._drain()
            if self._rawbufs is not None:  # from here on, a buffer given back is not parsed
                self.stranded_buffers += self._rawbufs.end_epoch()
            try:
                self._cupti.finalize()
            except Exception:
                pass
            self._names, self._libraries = NameCache(), LibraryResolver()
            self.attached = False
            self._device_on = self._api_on = self._api_kinds_on = self._graphs_on = False
            self.detaches += 1
        self._wake.set()

    def attach(self) -> bool:
        """Attach again after :meth:`detach`; False (and the reason on the status line) if
        CUPTI refuses, the session then goes on detached."""
        if self.attached or self._cupti is None or not self.running:
            return self.attached
        with self._lock:
            try:
                self._attach()
            except CuptiUnavailable as exc:
                self.bursts_only = False
                self.store.set_collector("cupti", False, safe_text(exc, 200))
                return False
        return True

    def announce(self) -> None:
        """Say what is collected, sampling included, on the status line."""
        self.store.set_collector("cupti", True, "CUPTI: kernels, memcpy, memset, memory"
                                 + (" (attached for bursts only)" if self.bursts_only else "")
                                 + (", API subset" if self.api else "")
                                 + (", every CUDA-graph launch" if self.graph_trace and self.raw
                                    and not self.graph_error else "")
                                 + (f"; sampled: {BURST} tokens in every {BURST * self.sample_every}"
                                    ", a prefill at most once as often"
                                    if self.sample_every > 1 else ""))

    def _set_device_kinds(self, on: bool) -> None:
        cupti = self._cupti
        if on != self._device_on:
            if on:
                self._set_graph_kind(False)
            for k in self._device_kinds:
                (cupti.activity_enable if on else cupti.activity_disable)(k)
            self._device_on = on
        self._set_graph_kind(not on and self.graph_trace)

    def _set_graph_kind(self, on: bool) -> None:
        """GRAPH_TRACE on or off; it is only ever on while the kernel kinds are off (a graph
        traced node by node needs no graph record). If CUPTI refuses it, say so once and go on
        with the CUDA-event times."""
        if on == self._graphs_on or (on and (self.graph_error or not self.raw)):
            return
        cupti = self._cupti
        try:
            kind = cupti.ActivityKind.GRAPH_TRACE
            if int(kind) != KIND_GRAPH_TRACE:
                raise RuntimeError(f"GRAPH_TRACE is kind {int(kind)} here, not {KIND_GRAPH_TRACE}")
            (cupti.activity_enable if on else cupti.activity_disable)(kind)
            self._graphs_on = on
        except Exception as exc:
            self._graphs_on = False
            self.graph_error = safe_text(exc, 120)
            self.store.add_event("cupti", f"no CUDA-graph records: {self.graph_error}")

    def _enable_api_subset(self) -> None:
        """RUNTIME and DRIVER kinds on, then every callback id outside the subset off.

        Measured on the H100: per-id enables alone deliver no API records, and enabling the
        kinds alone delivers every call (cudaGetDevice 14 times per kernel launch).
        """
        cupti = self._cupti
        K = cupti.ActivityKind
        rt, drv = cupti.runtime_api_trace_cbid, cupti.driver_api_trace_cbid
        dom = cupti.CallbackDomain
        self._api_kinds = [K.RUNTIME, K.DRIVER]
        if K.RUNTIME not in self._enabled_kinds:
            for k in self._api_kinds:
                cupti.activity_enable(k)
                self._enabled_kinds.append(k)
        filt = []
        for names, enum, fn, domain in (
                (RUNTIME_APIS, rt, cupti.activity_enable_runtime_api, dom.RUNTIME_API),
                (DRIVER_APIS, drv, cupti.activity_enable_driver_api, dom.DRIVER_API)):
            wanted = {int(getattr(enum, n)) for n in names if hasattr(enum, n)}
            for member in enum:
                cbid = int(member)
                if cbid <= 0 or member.name in ("SIZE", "FORCE_INT", "INVALID"):
                    continue
                filt.append((fn, cbid, 1 if cbid in wanted else 0))
            for name in names:
                cbid = getattr(enum, name, None)
                if cbid is not None:
                    self._api_names[(int(domain), int(cbid))] = _short_api(name)
        self._api_filter = filt
        for fn, cbid, want in filt:
            fn(cbid, want)

    def _set_api_records(self, on: bool, lead: bool = False) -> None:
        """API records follow the sampling bursts (``lead``: the token before a burst, whose
        kinds come on with every id off, see ``api_lead``).

        With the RUNTIME/DRIVER kinds on, CUPTI intercepts every API call, even one whose id is
        filtered out: in eager decode (~30,000 API calls a token) that alone cost 17% on the
        H100, so unless ``api_kinds_stay_on`` the kinds go off between bursts. A kind switched
        on again forgets its per-id filter (1.2 million cudaGetDevice records in one run), so
        the whole filter (~700 ids) is applied again then. With ``api_kinds_stay_on`` (compiled
        mode: a few API calls a token, and kernels of a CUDA graph traced after the API kinds
        came back on had wrong durations) only the subset's ids are switched."""
        if not self.api or self._cupti is None:
            return
        cupti = self._cupti
        kinds_on = on or lead or self.api_kinds_stay_on
        if kinds_on != self._api_kinds_on:
            if kinds_on:
                for k in self._api_kinds:
                    cupti.activity_enable(k)
                for fn, cbid, want in self._api_filter:
                    fn(cbid, want if on else 0)
            else:
                for k in self._api_kinds:
                    cupti.activity_disable(k)
            self._api_kinds_on = kinds_on
        elif on != self._api_on:
            for fn, cbid, want in self._api_filter:
                if want:
                    fn(cbid, 1 if on else 0)
        self._api_on = on

    def clock(self) -> int:
        """CUPTI's timestamp, the clock of every record (ns); ``time.time_ns()`` while detached
        (CUPTI's clock is CLOCK_REALTIME on Linux, measured equal within 1 µs on the H100,
        and a CUPTI call while detached would attach it again)."""
        if not self.attached:
            return time.time_ns()
        return self._cupti.get_timestamp()

    def on_token_start(self, seq: int, prefill: bool = False) -> bool:
        """Called by the profiler at each token start; returns whether the token is sampled.

        ``prefill``: traced whatever the sampling (no warm-up) unless another prefill was
        traced less than a sampling period ago. One traced prefill per generation would trace
        every short ``generate()`` of a program: each costs the kind switches and folding its
        thousands of records beside the decode that follows (20–85 ms a burst on the H100):
        the likely cause of a compiled program's 20 % at 64 tokens a call (measured on the H100,
        docs/performance.md#sampling), and of a live compiled session's prefill every 256 steps.
        """
        if not self.attached:  # detached between bursts: nothing to switch, nothing traced
            return False
        if self.paused:
            self._set_device_kinds(False)
            return False
        n = self.sample_every
        period = n * BURST
        due = prefill and self._prefill_due(seq)
        if n <= 1 or due:
            if due:
                self._prefill_seq = seq
            self._set_device_kinds(True)
            self._set_api_records(True)
            return True
        phase = (seq - self._origin) % period
        on = phase <= BURST  # phase 0: warm-up token, records dropped
        if self._device_on and not on:  # a burst just ended: hand its records over now,
            try:                          # before its kinds go off
                self._cupti.activity_flush_all(0)
            except Exception:
                pass
        self._set_device_kinds(on)
        self._set_api_records(on, lead=self.api_lead and phase == period - 1)
        return 1 <= phase <= BURST

    def quiet_token(self) -> bool:
        """A token left untraced whatever the sampling (one decoded beside a compile, whose
        own kernels would land in its window); returns False (not sampled)."""
        if not self.attached:
            return False
        if self._device_on:  # a burst in progress: hand its records over before going quiet
            try:
                self._cupti.activity_flush_all(0)
            except Exception:
                pass
        self._set_device_kinds(False)
        self._set_api_records(False)
        return False

    def restart_sampling(self, seq: int) -> None:
        """A mode switch at token ``seq``: the next burst's warm-up comes ``SWITCH_LEAD``
        tokens later instead of up to a period later. The lead tokens are untraced, so a change
        of API policy (compiled mode switches the API kinds on at the first of them) never
        coincides with traced CUDA-graph kernels: switched on together with the device kinds,
        the API kinds left graph kernels with wrong durations on the H100."""
        self._origin = seq + SWITCH_LEAD

    def flush(self) -> None:
        """Deliver every buffered record now (forced flush) and fold it into the store."""
        if self._cupti is None:
            return
        if self.attached:  # a detached CUPTI is flushed already; a call would attach it
            try:
                self._cupti.activity_flush_all(1)
            except Exception:
                pass
        self._drain()
        self._poll_dropped()

    def stop(self) -> None:
        """Flush, disable every kind, stop the consumer, finalize CUPTI."""
        if self._cupti is None:
            return
        cupti = self._cupti
        attached = self.attached
        try:
            self.flush()
        finally:
            if attached:
                self._disable_all()
            self._stop.set()
            self._wake.set()
            if self._consumer is not None:
                self._consumer.join(5)
            self._drain()
            if self.markers is not None:
                self._fold(self.markers.drain())
            if attached:  # a detached CUPTI is finalized already; a call would attach it
                try:
                    cupti.finalize()
                except Exception:
                    pass
            self.attached = False
            self.running = False
            self._cupti = None

    def _disable_all(self) -> None:
        cupti = self._cupti
        self.graph_trace = False
        try:
            self._set_device_kinds(False)
        except Exception:
            pass
        for k in self._enabled_kinds:
            try:
                cupti.activity_disable(k)
            except Exception:
                pass
        self._enabled_kinds.clear()

    # ---------------------------------------------------------------- callbacks
    def _buffer_requested(self):
        return self.buffer_bytes, 0

    def _on_buffer(self, activities) -> None:
        self._buffer_completed_impl(activities)

    def _buffer_completed(self, activities) -> None:
        t0 = time.perf_counter()
        out = []
        append = out.append
        K = self._cupti.ActivityKind
        KERNEL, MEMCPY, MEMSET, MEMORY2 = (K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET, K.MEMORY2)
        RUNTIME, DRIVER = K.RUNTIME, K.DRIVER
        names = self._api_names
        # The hot loop: record tuples packed by position (store/records.py names the fields).
        for a in activities:
            kind = a.kind
            if kind == KERNEL:
                append(("K", a.name, a.start, a.end, a.grid_x, a.grid_y, a.grid_z, a.block_x,
                        a.block_y, a.block_z, a.registers_per_thread,
                        a.static_shared_memory + a.dynamic_shared_memory, a.stream_id,
                        a.correlation_id, a.graph_id))
            elif kind == MEMCPY:
                append(("C", a.copy_kind, a.bytes, a.start, a.end, a.stream_id, a.correlation_id))
            elif kind == MEMSET:
                append(("S", a.bytes, a.start, a.end, a.stream_id, a.correlation_id))
            elif kind == MEMORY2:
                append(("A", int(a.memory_operation_type), int(a.memory_kind), a.bytes,
                        a.timestamp, a.address))  # no detail: see alloc_classes
            elif kind == RUNTIME or kind == DRIVER:
                dom = 2 if kind == RUNTIME else 1
                name = names.get((dom, a.cbid))
                if name is None:
                    name = self._api_name(dom, a.cbid)
                append(("R", name, a.start, a.end, a.correlation_id))
        if out:
            self._queue.append(out)
            self._wake.set()
        self.buffers += 1
        self.callback_s += time.perf_counter() - t0

    def _queue_raw(self, data: bytes) -> None:
        # C callback context: one append, the parsing happens on the consumer thread.
        self._queue.append(data)
        self.buffers += 1
        self._wake.set()

    def _api_name(self, domain: int, cbid: int) -> str:
        try:
            name = self._cupti.get_callback_name(domain, cbid)
        except Exception:
            name = f"api#{cbid}"
        self._api_names[(domain, cbid)] = name
        return name

    # ------------------------------------------------------------------ consumer
    def _consume(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            self._drain()
            if self.markers is not None:  # held records whose time has come
                self._fold(self.markers.feed([], []))
            self._poll_dropped()

    def _drain(self) -> None:
        q = self._queue
        while q:
            with self._parsing:
                try:
                    batch = q.popleft()
                except IndexError:
                    break
                t0 = time.thread_time()  # CPU time, not the wait for the GIL
                markers = [] if self.markers is not None else None
                if isinstance(batch, bytes):
                    try:
                        batch = parse_buffer(batch, self._layout, self._names, _ApiNames(self),
                                             markers, self._libraries)
                    except LayoutError as exc:
                        self.store.set_collector("cupti", False, "CUPTI records unreadable: "
                                                 + safe_text(exc, 120))
                        continue
            if markers is not None:  # steps from the markers first, then their records
                batch = self.markers.feed(markers, batch)
            self.store.ingest(RECORDS, batch)
            self.fold_s += time.thread_time() - t0

    def _fold(self, records: list) -> None:
        if records:
            t0 = time.thread_time()
            self.store.ingest(RECORDS, records)
            self.fold_s += time.thread_time() - t0

    @property
    def cost_s(self) -> float:
        """CPU seconds in the buffer callback and folding records into the store."""
        return self.callback_s + self.fold_s

    def buffer_stats(self) -> dict[str, int]:
        """The raw buffer pool's counts: completed buffers, and those CUPTI gave back after
        the finalize of the session they were handed out in (``stale``, not parsed), gave
        back unasked (``unknown``), or still held at a finalize (``stranded``, summed)."""
        rb = self._rawbufs
        return {"buffers": self.buffers, "stale": rb.stale if rb else 0,
                "unknown": rb.unknown if rb else 0, "held": rb.held() if rb else 0,
                "stranded": self.stranded_buffers}

    def _poll_dropped(self) -> None:
        cupti = self._cupti
        if cupti is None:
            return
        rb = self._rawbufs
        if rb is not None and rb.stale + rb.unknown > self._stale_said:
            self._stale_said = rb.stale + rb.unknown
            self.store.add_event("cupti", f"{self._stale_said} CUPTI buffer(s) came back after "
                                 "their session's finalize: not parsed")
        if self.bursts_only:  # may detach meanwhile: any CUPTI call would attach it again
            with self._lock:
                dropped = _dropped_records_now(cupti) if self.attached else None
        else:
            dropped = _dropped_records_now(cupti)
        if dropped is not None:
            self.store.note_dropped(dropped)


def _dropped_records_now(cupti) -> int | None:
    """CUPTI's dropped-record count since the last call (global queue); None if it refuses."""
    import ctypes

    out = ctypes.c_size_t(0)
    try:
        res = cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(out))
    except Exception:
        return None
    if isinstance(res, int) and res and not out.value:
        return res  # some binding versions return the count
    return int(out.value)


class _ApiNames(dict):
    """(domain, cbid) -> short API name, resolved through CUPTI on first sight."""

    def __init__(self, collector: "CuptiCollector") -> None:
        super().__init__(collector._api_names)
        self._c = collector

    def get(self, key, default=None):
        v = dict.get(self, key)
        if v is None:
            v = self[key] = _short_api(self._c._api_name(*key))
        return v


def _short_api(name: str) -> str:
    return name.split("_ptsz")[0].split("_v")[0] if "_v" in name or "_ptsz" in name else name


def _busy_message(exc: Exception) -> str:
    text = str(exc)
    if "MULTIPLE_SUBSCRIBERS" in text or "subscriber" in text.lower() or "NOT_INITIALIZED" in text:
        return ("no CUPTI: another profiler holds CUPTI (Nsight Systems/Compute, torch.profiler?); "
                "timing and NVML go on; run without it for kernel data")
    return f"no CUPTI: {text[:100]}; timing and NVML go on (--no-cupti hides this)"


def make(ctx) -> "CuptiCollector | str":
    """The session's CUPTI collector (:mod:`tuiprof.collect.registry`), or why it is off."""
    opts = ctx.options
    if not opts.cupti:
        return "no CUPTI: disabled with --no-cupti"
    c = CuptiCollector(ctx.store, buffer_bytes=opts.buffer_bytes, api=opts.api,
                       memory=opts.memory, sample_every=ctx.sample_every,
                       api_kinds_stay_on=ctx.api_stay_on, markers=ctx.markers,
                       graph_trace=opts.graphs and ctx.mode == "compiled")
    c.api_lead = ctx.mode == "compiled"
    return c


def make_clock(collector: CuptiCollector | None) -> Callable[[], int]:
    """The clock token marks must use: CUPTI's when it runs, else ``time.time_ns``."""
    if collector is not None and collector.running:
        return collector.clock
    return time.time_ns
