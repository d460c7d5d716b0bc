"""GPipe on swpipe: an ``nn.Sequential`` split into partitions, micro-batches pipelined through them.

torchgpipe users change one import::

    from swpipe.gpipe import GPipe

and get torchgpipe's contract (arguments, errors, checkpointing, skip
connections, deferred batch norm, balance by time or size), run by swpipe's
engine as a plan that the simulator, the bounds and the search read
(``gpipe.plan``), a training step by GPipe's schedule or 1F1B
(:meth:`GPipe.step`), and predictions of a step's time and memory
(:mod:`swpipe.gpipe.predict`).
"""

from swpipe.gpipe.checkpoint import is_checkpointing, is_recomputing
from swpipe.gpipe.gpipe import GPipe


def __getattr__(name: str):  # AdaptiveGPipe lives with the re-planners (it imports this package's modules)
    if name == "AdaptiveGPipe":
        from swpipe.replan.gpipe import AdaptiveGPipe

        return AdaptiveGPipe
    raise AttributeError(f"module 'swpipe.gpipe' has no attribute {name!r}")


__all__ = ["GPipe", "AdaptiveGPipe", "is_checkpointing", "is_recomputing"]
