"""A user's own program as a step source: ``tuiprof run -- python prog.py``.

The program runs in tuiprof's interpreter (``launch``); its steps come from transformers'
``generate()`` and continuous batching (``hf``), from :func:`tuiprof.step` marks, from NVTX
ranges in CUPTI's marker records (``nvtx``) or, when none of these shows up, from fixed time
windows (``windows``). Every source reports through one :class:`~.steps.StepRecorder` to the
same :class:`~tuiprof.engine.events.EngineListener` the built-in engine reports to (the
``Profiler``). ``output`` keeps what the program prints; ``session`` wires it all together.
Importing this package imports neither torch nor transformers.
"""
