"""Where a compile's time went: dynamo's own metrics read around a compile, and the one line
that `c` ends with ("compiled in 9.8 s (dynamo 3.1 s, inductor 4.2 s, CUDA graphs 1.0 s; …)")."""
from __future__ import annotations

import torch

from tuiprof.engine.compile_support import COMPILE_TIMES, _compile_times, _CompileJob, _took


def test_a_compile_adds_to_dynamos_trace_and_backend_times():
    before = _compile_times()
    assert set(before) == set(COMPILE_TIMES)

    def f(x):
        return torch.sin(x) * 2 + x

    torch.compile(f, backend="eager")(torch.randn(4))
    after = _compile_times()
    for key in COMPILE_TIMES:  # torch renamed a metric if this fails: the line would say less
        assert after[key] > before[key], key


def test_the_compiled_line_names_each_part():
    job = _CompileJob(1, None)
    job.seconds, job.parts = 8.8, {"bytecode_tracing": 3.14, "OutputGraph.call_user_compiler": 4.2}
    assert _took(job, 1.0, "CUDA graphs") == \
        "9.8 s (dynamo 3.1 s, inductor 4.2 s, CUDA graphs 1.0 s)"
    job.helper_s = 4.5
    assert _took(job, 1.0, "CUDA graphs").endswith("CUDA graphs 1.0 s, 4.5 s in a helper process)")
    job.gated_s = 3.0  # inductor waited 3 s of its 4.2 for the helper: 1.2 s its own
    assert "inductor 1.2 s" in _took(job, 1.0, "CUDA graphs")
    job.helper_note = "compile helper ended (signal 9) before it had compiled"
    assert "helper" not in _took(job, 1.0, "CUDA graphs")   # its seconds mean nothing then
    job.parts = {}
    assert _took(job) == "8.8 s"                             # nothing known: the total alone
