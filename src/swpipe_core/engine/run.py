"""What one pipelined run executes and with what: :class:`RunSetup`, fixed from the fill to the end of the run.

A run (one ``fill_pipeline`` .. ``drain`` cycle of a
:class:`~swpipe_core.engine.pipeline.SWPipeline`) is a few objects, each the
only writer of its own state (docs/architecture.md, "The state of a run"):
the period loop (:class:`~swpipe_core.engine.loop.PeriodLoop`: the iterations
in flight, the period counter, the data), how its tasks run
(:class:`~swpipe_core.engine.tasks.TaskRunner`: threads, the per-period
fast-path flags), its device lifetimes
(:class:`~swpipe_core.engine.lifetime.DeviceLifetimes`) and its failure
(:class:`~swpipe_core.engine.failure.RunFailure`). What they all read and
nobody changes is here, made once by ``SWPipeline.fill_pipeline``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from swpipe_core.engine.dispatch import Dispatch
from swpipe_core.engine.options import Timeouts
from swpipe_core.engine.program import CompiledPlan
from swpipe_core.engine.sequencer import SubmissionSequencer
from swpipe_core.engine.streams import StreamPool
from swpipe_core.measure.trace import TimelineRecorder
from swpipe_core.plan import IterContext

__all__ = ["RunSetup"]


@dataclass(frozen=True, eq=False, slots=True)  # slots: the hot path reads its fields for every task
class RunSetup:
    """What a run executes and with what; it does not change while the run goes on."""

    compiled: CompiledPlan
    pool: StreamPool
    dispatch: Dispatch
    timeouts: Timeouts
    recorder: Optional[TimelineRecorder]
    sequencer: SubmissionSequencer
    max_device_lag: int
    plain: bool = False        # CPU, nothing around the tasks: they need nothing but fn(ctx)
    # the device (CUDA)
    streams: List[Any] = field(default_factory=list)  # each task's resolved stream, by index
    ctx_type: type = IterContext  # GuardedContext on CUDA
    keep: Optional[Callable[[IterContext], None]] = None  # after each task: what its context must keep alive
    nvtx: bool = False         # NVTX ranges per task, emit_nvtx on every worker
