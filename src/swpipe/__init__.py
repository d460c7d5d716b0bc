"""swpipe: software-pipelined PyTorch training loops, their analysis and their automatic schedule.

``import swpipe`` gives what the workflow needs, and nothing else:

* the plan: ``PipelineTask``, ``TaskSchedule``, ``PipelinePlan``, ``IterContext``, ``DeclaredIO``, ``TaskRef``
  (a task's name or its ``PipelineTask``: what a plan's fields take), ``validate``, ``PlanError``, the ``pipelines`` registry of TorchRec's pipelines, ``with_thread_map``,
  ``save_plan``/``load_plan``;
* running it: ``SWPipeline``, its ``Timeouts``, ``PipelineTaskError``; ``agree_on_end`` (ranks whose data ends
  unevenly stop together), ``keep_freed_memory`` (a CPU process keeps freed host memory: no page faults each step);
* measuring it: ``TaskProfiler``, ``ProfileResult``, ``CostModel``, ``TaskCost``, ``CostModelError``, and while it
  runs ``RollingCosts`` (each task's recent times, for ``CostModel.refreshed``);
* checking what it computes: ``infer_plan``, ``check_dataflow``;
* predicting and explaining it: ``simulate``, ``lower_bounds``, ``what_if``, ``compare``, ``gantt``, which take a
  plan, a GPipe (``swpipe.gpipe``) or a pipeline-parallel program (``swpipe.pp``) alike;
* searching a better one: ``auto_schedule`` (a plan), ``search`` (a plan, a GPipe or a program), their options ``Constraints`` (what the plan may be), ``SolverOptions``
  (how the search runs) and ``VerifyOptions`` (how its answer is measured), ``SearchReport``.

The API reference's own import, ``from sw_pipeline import ...``, gives the same objects (the ``sw_pipeline``
package). Everything else stays in its module (``swpipe_core.*``, ``autosched.*``, ``swpipe.testing``): the few advanced
helpers the guide and the notebooks use are listed, with their module, at the end of the API reference.

Examples
--------
>>> import swpipe
>>> len(swpipe.__all__) <= 36 and "SWPipeline" in swpipe.__all__
True
>>> dir(swpipe) == swpipe.__all__
True
"""

import importlib as _importlib
import typing as _typing

from swpipe._version import __version__

# public name -> the module that defines it; loaded on first use, so ``import swpipe`` stays light
_PUBLIC = {
    "PipelineTask": "swpipe_core.plan",
    "TaskSchedule": "swpipe_core.plan",
    "PipelinePlan": "swpipe_core.plan",
    "IterContext": "swpipe_core.plan",
    "DeclaredIO": "swpipe_core.plan",
    "TaskRef": "swpipe_core.plan",
    "validate": "swpipe_core.validate",
    "PlanError": "swpipe_core.validate",
    "pipelines": "swpipe_core.pipelines",
    "with_thread_map": "swpipe_core.engine.workers",
    "save_plan": "autosched.model.graph",
    "load_plan": "autosched.model.graph",
    "SWPipeline": "swpipe_core.engine.pipeline",
    "PipelineTaskError": "swpipe_core.engine.pipeline",
    "Timeouts": "swpipe_core.engine.options",
    "agree_on_end": "swpipe_core.distributed",
    "keep_freed_memory": "swpipe_core.measure.allocator",
    "TaskProfiler": "swpipe_core.measure.profiler",
    "RollingCosts": "swpipe_core.measure.rolling",
    "ProfileResult": "swpipe_core.measure.result",
    "CostModel": "autosched.model.costs",
    "TaskCost": "autosched.model.costs",
    "CostModelError": "autosched.model.costs",
    "infer_plan": "swpipe_core.dataflow",
    "check_dataflow": "swpipe_core.dataflow",
    "simulate": "autosched.verbs",
    "lower_bounds": "autosched.verbs",
    "what_if": "autosched.verbs",
    "compare": "autosched.verbs",
    "gantt": "autosched.plots",
    "auto_schedule": "autosched.search.autoschedule",
    "search": "autosched.verbs",
    "Constraints": "autosched.search.options",
    "SolverOptions": "autosched.search.options",
    "VerifyOptions": "autosched.verify.loop",
    "SearchReport": "autosched.search.report",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> _typing.Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'swpipe' has no attribute {name!r}; the public API is swpipe.__all__, "
                             "everything else is in its module (swpipe_core.*, autosched.*)")
    if name == "pipelines":
        return _importlib.import_module(module)
    return getattr(_importlib.import_module(module), name)


def __dir__() -> list:
    """The public names, lazy ones included, and nothing else: ``dir()``, ``help()`` and tab completion list them."""
    return list(__all__)
