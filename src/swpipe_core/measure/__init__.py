"""Measurement of a pipeline: per-task time (``profiler``) and what a profile holds (``result``), bytes in
flight (``memory``), timelines (``trace``), the machine's own costs (``calibrate``), the host allocator
(``allocator``) putting a model back after measuring runs (``state``) and what such a run ran (``measured``)."""
