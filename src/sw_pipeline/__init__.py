"""sw_pipeline: the API reference's import, ``from sw_pipeline import PipelineTask, TaskSchedule, PipelinePlan, SWPipeline``.

The reference the project is built from names its module ``sw_pipeline``; its examples start with that import.
This package holds nothing of its own: every name is the very object ``swpipe`` gives (``sw_pipeline.SWPipeline is
swpipe.SWPipeline``), loaded on first use. It gives the reference's names only; the rest of the API (the search,
the cost model, the simulator) is ``swpipe``'s.

Examples
--------
>>> import swpipe, sw_pipeline
>>> from sw_pipeline import PipelineTask, TaskSchedule, PipelinePlan, SWPipeline
>>> SWPipeline is swpipe.SWPipeline and sw_pipeline.TaskRef is swpipe.TaskRef
True
>>> dir(sw_pipeline) == sw_pipeline.__all__
True
"""

import typing as _typing

import swpipe as _swpipe

# the names the API reference documents (its data classes, the engine, the profiler), each one swpipe's
__all__ = ["DeclaredIO", "IterContext", "PipelinePlan", "PipelineTask", "ProfileResult", "SWPipeline", "TaskProfiler",
           "TaskRef", "TaskSchedule"]


def __getattr__(name: str) -> _typing.Any:
    if name not in __all__:
        raise AttributeError(f"module 'sw_pipeline' has no attribute {name!r}; it gives the API reference's names "
                             f"{__all__}; the rest of the API is swpipe's (swpipe.__all__)")
    return getattr(_swpipe, name)


def __dir__() -> list:
    """The reference's names and nothing else (``dir()``, ``help()`` and tab completion)."""
    return list(__all__)
