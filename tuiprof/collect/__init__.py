"""Producers: CUPTI activity records, NVML samples, allocator statistics, recordings.

Each producer runs on its own thread and writes into a :class:`tuiprof.store.SessionStore`;
none of them imports Textual or touches a widget.
"""
