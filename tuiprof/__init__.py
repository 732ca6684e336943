"""tuiprof: a live inference profiler for the terminal.

Importing ``tuiprof`` imports nothing heavy (no torch, no textual): the CLI decides what to load.
"""
__version__ = "0.1.0"
