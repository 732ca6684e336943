"""The step-source seam: every way of finding a profiled program's steps, one row each, in
precedence order (docs/extending.md).

A step source marks the program's steps through the session's
:class:`~tuiprof.program.steps.StepRecorder` (``begin``/``end``, ``enter_scope``/``exit_scope``,
``launched``, ``model_begins``/``model_ends``). Its row names a factory
``make(session) -> StepSource | None`` in a module under ``tuiprof/program/``; it returns None
when the source does not apply to this run (``--step-range`` given or not, say). A source
earlier in :data:`STEP_SOURCES` wins over a later one: its steps end theirs, and marks of a
later source inside its scope are ignored (``steps.py`` has the rules).

Contract of a :class:`StepSource`:

* ``name``: its row's name;
* ``install()``: start marking (patches in place, threads started); called once the
  collectors run and the program's output is captured, before the program starts;
* ``uninstall()``: stop marking and end its open step; safe to call twice;
* ``markers`` (optional): a :class:`~tuiprof.collect.cupti_collector.MarkerSink` the CUPTI
  collector feeds with NVTX marker records (started before the collectors).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


class StepSource(Protocol):
    name: str

    def install(self) -> None: ...

    def uninstall(self) -> None: ...


@dataclass(frozen=True)
class SourceOption:
    """A ``tuiprof run`` option of a step source; its value reaches the source's factory as
    ``session.options[dest]``."""

    flag: str                       # "--step-range"
    dest: str                       # "step_range"
    help: str
    default: Any = None
    type: Callable | None = None    # argparse's type
    action: str | None = None       # argparse's action ("append")
    metavar: str | None = None
    # "" when the value is good, else why not: a function, or "module:function" under
    # tuiprof.program (a source's module may import this table's users)
    check: Callable[[Any], str] | str | None = None

    def problem(self, value: Any) -> str:
        """Why ``value`` cannot be used ("" when it can)."""
        check = self.check
        if isinstance(check, str):
            module, fn = check.split(":")
            check = getattr(importlib.import_module(f"{__package__}.{module}"), fn)
        return check(value) if check is not None else ""

    def add_to(self, parser: Any) -> None:
        kw = {k: v for k, v in (("type", self.type), ("action", self.action),
                                ("metavar", self.metavar)) if v is not None}
        parser.add_argument(self.flag, dest=self.dest, default=self.default, help=self.help,
                            **kw)


@dataclass(frozen=True)
class StepSourceSpec:
    name: str        # its name in snapshots (meta.step_source) and in the precedence
    make: str        # "module:function" under tuiprof.program
    host: bool       # marks steps on the program's own threads: pause can hold it there
    help: str
    options: tuple[SourceOption, ...] = field(default=())
    # the programs it applies to: "python" (run in tuiprof's interpreter), "native" (a binary
    # run as a child, its CUPTI injected: tuiprof.program.binary_session)
    programs: tuple[str, ...] = ("python", "native")


def _positive(v: Any) -> str:
    return "" if v > 0 else "must be positive"


STEP_SOURCES: tuple[StepSourceSpec, ...] = (
    StepSourceSpec("vllm", "vllm_steps:make", True,
                   "every engine step of vLLM's scheduler (V1 engine; its requests too)",
                   programs=("python",)),
    StepSourceSpec("transformers", "transformers_steps:make", True,
                   "every forward of transformers' generate() and continuous batching",
                   programs=("python",)),
    StepSourceSpec("api", "api_steps:make", True,
                   "tuiprof.step() / tuiprof.mark_prefill() in the program's own loop",
                   programs=("python",)),
    StepSourceSpec("function", "function_steps:make", True,
                   "the calls of a function of the program named with --step-function",
                   (SourceOption("--step-function", "step_function",
                                 "cut steps at the calls of this function of the program, "
                                 "MODULE:FUNCTION or MODULE:Class.method (again for more; a "
                                 "name with 'prefill' in it marks prefill steps)",
                                 default=[], action="append", metavar="MODULE:FUNCTION",
                                 check="function_steps:check"),), programs=("python",)),
    StepSourceSpec("nvtx", "nvtx_steps:make", False,
                   "NVTX ranges the program pushes, named with --step-range",
                   (SourceOption("--step-range", "step_range",
                                 "cut steps at the program's NVTX ranges named NAME (again for "
                                 "more names; a name with 'prefill' in it marks prefill steps)",
                                 default=[], action="append", metavar="NAME"),)),
    StepSourceSpec("auto", "stream_steps:make", False,
                   "a native program's decode loop, found in its kernel stream (else windows "
                   "of --window-ms on the records' clock)", programs=("native",)),
    StepSourceSpec("windows", "windows_steps:make", False,
                   "fixed time windows (--window-ms) while nothing else marks steps",
                   (SourceOption("--window-ms", "window_ms",
                                 "when the program marks no steps: windows of this many ms "
                                 "(default 100)", default=100.0, type=float,
                                 check=_positive),), programs=("python",)),
)
NAMES = tuple(s.name for s in STEP_SOURCES)
HOST = tuple(s.name for s in STEP_SOURCES if s.host)
OPTIONS = tuple(o for s in STEP_SOURCES for o in s.options)


def option_values(given: dict | None = None) -> dict:
    """Every source option's value: its default, unless ``given`` (by ``dest``) says else."""
    out = {o.dest: (list(o.default) if isinstance(o.default, list) else o.default)
           for o in OPTIONS}
    out.update({k: v for k, v in (given or {}).items() if k in out})
    return out


def factory(spec: StepSourceSpec) -> Callable[[Any], StepSource | None]:
    module, fn = spec.make.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), fn)
