"""Pipeline parallelism across ranks: PyTorch's schedules read, predicted, bounded and searched.

``torch.distributed.pipelining`` stays the runtime; swpipe reads its schedules as data and
adds what its dry run lacks (time, transfers, memory):

* the schedule: :func:`pp_program` (one of PyTorch's, for some ranks and micro-batches),
  :class:`PPProgram` (per-rank actions; ``.grid()`` prints the step x rank table as PyTorch
  does; ``.to_csv()`` writes the compute-only CSV ``_PipelineScheduleRuntime`` loads),
  :func:`builtin_programs`, :func:`program_from_order`, :func:`read_csv`, :func:`validate_program`
  (the rules every schedule keeps: each action once, dependencies in order, no deadlock);
  :func:`schedule_for` (the ``torch.distributed.pipelining`` schedule object that runs a program on a rank's
  stages: PyTorch's own class for one of its schedules, its runtime for any other order);
* the costs: :func:`measure_stage_costs` (F, I, W, B and bytes per stage, one process),
  :func:`measure_p2p` (the link, with ``torch.distributed``), :class:`StageCost`,
  :class:`P2PCost`, :class:`PPCosts`, :func:`split_module`, :class:`LiveTensorBytes`;
* measured while the job trains: :class:`RollingStepCosts` (each ``schedule.step``, each
  action of its stages and each post and wait of its transfers timed into a rolling window; each
  step's split into compute, posting and waiting: :class:`StepSplit`), :func:`refreshed_pp_costs` (the costs
  from the windows' medians, with how fresh and how noisy: a :class:`PPRefreshed`),
  :func:`measure_action_overhead` (what the runtime adds per action, on the user's stages:
  an :class:`ActionOverhead`); :func:`measure_custom_overhead` (what a custom order's path adds beyond PyTorch's
  class, on the user's stages in the user's group: a :class:`CustomOverhead`; :class:`CustomPathProbe`, its
  paired rounds one at a time); :func:`calibrate_pp` (stages, link and both overheads at once, each correction kept
  only where it predicts held-out steps better: :func:`check_pp_corrections`, the post cost fitted on half of
  them: :func:`fitted_post_s`; the prediction's error on them, a search's margin: :func:`held_out_error_pct`,
  in the job's process group); :class:`AdaptiveSchedule` (the schedule and micro-batch count chosen
  again between steps when the measured step drifts, every rank switching at the same step);
* the prediction and the search: ``swpipe.simulate`` (step, bubble and peak memory per rank),
  ``swpipe.lower_bounds``, ``swpipe.what_if``, ``swpipe.compare`` and ``swpipe.search`` (CP-SAT and list
  scheduling, seeded with PyTorch's schedules, under ``Constraints``/``SolverOptions``): the verbs of a plan,
  which take a program alike; their results :class:`PPSimResult`, :class:`PPBounds`, :class:`PPSearchResult`
  (its best :class:`PPCandidate`; :class:`PPCpsatRun`: one CP-SAT
  problem, its status and its model's makespan). The names before them (``pp_simulate``, ``pp_lower_bounds``,
  ``pp_what_if``, ``pp_compare``, ``pp_search``) still work for one release and warn (``FutureWarning``);
* errors: :class:`PPError` (``.rule``, ``.field``, ``.value``, ``.schedule``),
  :class:`PPScheduleError` (a schedule the runtime would not run through: ``.rule``, ``.rank``,
  ``.action``, ``.step``, ``.fix``), :class:`PPTorchError` (a torch without the helpers read); a
  cost, time limit or cap out of range is an ``OptionError`` naming the field.

``swpipe pp`` runs every schedule and a searched one under ``torchrun`` and prints the
prediction beside the measurement, on the built-in model or yours (``--model pkg.module:factory``:
a factory returning a :class:`PPModel`).

Examples
--------
>>> from swpipe import simulate
>>> from swpipe.pp import PPCosts, StageCost, pp_program
>>> costs = PPCosts((StageCost(forward_s=1.0, backward_s=2.0, activation_bytes=100),) * 2)
>>> result = simulate(pp_program("1F1B", n_ranks=2, n_microbatches=4), costs)
>>> result.period_s, result.peak_bytes
(15.0, {0: 200, 1: 100})
"""

from __future__ import annotations

from typing import Any

from autosched.pp import (ActionOverhead, CustomOverhead, CustomPathProbe, LiveTensorBytes, P2PCost, PPBounds,
                          PPCandidate, PPComparison, PPCosts, PPCpsatRun, PPError, PPProgram, PPRefreshed, PPRow,
                          PPScheduleError, PPSearchResult, PPSimResult, PPTorchError, PPWhatIf, RollingStepCosts,
                          StageCost, StepSplit, builtin_programs, calibrate_pp, check_pp_corrections, fitted_post_s,
                          held_out_error_pct, measure_action_overhead, measure_custom_overhead, measure_p2p,
                          measure_stage_costs, pp_program, program_from_order, read_csv, refreshed_pp_costs,
                          schedule_for, split_module, validate_program)
from autosched.pp import RENAMED, renamed
from swpipe.commands.pp_model import PPModel
from swpipe.replan.schedule import AdaptiveSchedule

__all__ = ["ActionOverhead", "AdaptiveSchedule", "CustomOverhead", "CustomPathProbe", "LiveTensorBytes", "P2PCost",
           "PPBounds", "PPCandidate", "PPComparison", "PPCosts", "PPCpsatRun", "PPError", "PPModel", "PPProgram",
           "PPRefreshed", "PPRow", "PPScheduleError", "PPSearchResult", "PPSimResult", "PPTorchError", "PPWhatIf",
           "RollingStepCosts", "StageCost", "StepSplit", "builtin_programs", "calibrate_pp", "check_pp_corrections",
           "fitted_post_s", "held_out_error_pct", "measure_action_overhead", "measure_custom_overhead", "measure_p2p",
           "measure_stage_costs", "pp_program", "program_from_order", "read_csv", "refreshed_pp_costs", "schedule_for",
           "split_module", "validate_program"]


def __getattr__(name: str) -> Any:
    """The verbs' names before ``swpipe.simulate`` and the others, kept one release with a ``FutureWarning``."""
    if name in RENAMED:
        return renamed(name, "swpipe.pp")
    raise AttributeError(f"module 'swpipe.pp' has no attribute {name!r}")
