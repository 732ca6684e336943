"""The raw buffer pool's C callbacks across CUPTI sessions (attached, finalized, attached
again). They are called here through their C function pointers, as CUPTI calls them; CUPTI
itself cannot run on a CPU (the real cycle: tests/gpu/test_detach_gpu.py)."""
from __future__ import annotations

import ctypes

from tuiprof.collect.cupti_raw import COMPLETE_FN, REQUEST_FN, RawBuffers


def _c_calls(pool: RawBuffers):
    """request() and complete(addr, valid) through the C entry points CUPTI is given."""
    request_c = REQUEST_FN(ctypes.cast(pool.request_cb, ctypes.c_void_p).value)
    complete_c = COMPLETE_FN(ctypes.cast(pool.complete_cb, ctypes.c_void_p).value)

    def request() -> int:
        buf, size, recs = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
        request_c(ctypes.byref(buf), ctypes.byref(size), ctypes.byref(recs))
        assert size.value == pool.buffer_bytes and buf.value % 8 == 0
        return buf.value

    def complete(addr: int, data: bytes = b"") -> None:
        ctypes.memmove(addr, data, len(data))
        complete_c(None, 0, addr, pool.buffer_bytes, len(data))

    return request, complete


def test_buffers_of_a_finalized_session_are_not_parsed():
    got: list[bytes] = []
    pool = RawBuffers(4096, got.append)
    request, complete = _c_calls(pool)
    a, b = request(), request()
    complete(a, b"kernels of session 0")
    assert got == [b"kernels of session 0"] and pool.held() == 1
    assert pool.end_epoch() == 1                  # finalize: CUPTI still holds b
    c = request()                                 # attached again: a is reused
    assert c == a
    complete(b, b"names point into freed memory")  # b comes back late: not parsed
    complete(c, b"kernels of session 1")
    assert got == [b"kernels of session 0", b"kernels of session 1"]
    assert pool.stale == 1 and pool.held() == 0
    assert request() in (a, b)                     # a late buffer is free again


def test_a_pointer_given_back_twice_is_neither_parsed_nor_handed_out_twice():
    got: list[bytes] = []
    pool = RawBuffers(4096, got.append)
    request, complete = _c_calls(pool)
    a = request()
    complete(a, b"once")
    complete(a, b"twice")
    assert got == [b"once"] and pool.unknown == 1
    assert request() == a and request() != a      # on the free list once, not twice
