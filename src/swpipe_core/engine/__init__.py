"""The engine: runs a PipelinePlan on worker threads and device streams (:class:`~swpipe_core.engine.pipeline.SWPipeline`).

One idea per module: ``pipeline`` (the SWPipeline object: construction,
fill/progress/drain/close, run), ``loop`` (one period: fetch, walk, retire),
``program`` (the plan compiled for the hot path), ``checks`` (arguments,
runnable plan, idle pipeline), ``failure`` (cancel a run, raise its error
once), ``tasks`` (one task execution), ``state`` (contexts, errors, per-run
state), ``lifetime`` (keeping device memory alive until its streams are
done; ending a run), ``serial`` (the serial loop), ``workers`` (thread
groups), ``streams`` (named streams and events), ``device`` (the one seam to
``torch.cuda``), ``sequencer`` (globally ordered collectives), ``shortcut``
(skipping a task for profiling), ``watchdog`` (no silent hang), ``rng``
(per-task random generators), ``reach`` (what a batch or context reaches).
"""
