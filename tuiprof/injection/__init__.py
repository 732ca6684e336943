"""tuiprof's CUDA injection library for native programs (C, C++, Rust binaries).

``inject.c`` is loaded by the CUDA driver inside the profiled binary (``CUDA_INJECTION64_PATH``)
and hands CUPTI's raw activity buffers to the session (:mod:`tuiprof.collect.cupti_channel`);
:mod:`.build` compiles it on first use with the system C compiler against the CUPTI headers of
the ``nvidia-cuda-cupti`` package (``stub/`` supplies the few CUDA driver types those headers
name). See docs/native.md.
"""
