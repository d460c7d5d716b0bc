"""The engine: runs a PipelinePlan on worker threads and device streams (:class:`~swpipe_core.engine.pipeline.SWPipeline`).

One idea per module. ``pipeline`` is the SWPipeline object (construction,
fill/progress/drain/close, run, serial runs, instrument, shortcuts); what a
pipelined run is made of is ``run`` (the run state each function below
receives); ``loop`` (start a run, fetch, walk a period, retire), ``tasks``
(one task instance: waits, turn, device waits, signal), ``dispatch`` (the
one call around every task: instrument wrappers, shortcuts, strict mode,
per-task generators), ``lifetime`` (what a CUDA run keeps alive and until
when; ending a run), ``failure`` (the task error, cancel, raise once) and
``serial`` (the serial loop) do it. ``program`` is the plan compiled for the
hot path, ``options`` and ``checks`` what the pipeline takes and checks.
Below them: ``workers`` (thread groups), ``streams`` (named streams and
events), ``device`` (the one seam to ``torch.cuda``), ``sequencer``
(globally ordered collectives), ``shortcut`` (replaying a task for
profiling), ``watchdog`` (no silent hang on the caller's thread), ``rng``
(per-task random generators), ``reach`` (what a batch or context reaches).
"""
