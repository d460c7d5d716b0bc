"""Pipeline parallelism across ranks: PyTorch's schedules read, predicted, bounded and searched.

``torch.distributed.pipelining`` stays the runtime; swpipe reads its schedules as data and
adds what its dry run lacks (time, transfers, memory):

* the schedule: :func:`pp_program` (one of PyTorch's, for some ranks and micro-batches),
  :class:`PPProgram` (per-rank actions; ``.grid()`` prints the step x rank table as PyTorch
  does; ``.to_csv()`` writes the compute-only CSV ``_PipelineScheduleRuntime`` loads),
  :func:`builtin_programs`, :func:`program_from_order`, :func:`read_csv`, :func:`validate_program`
  (the rules every schedule keeps: each action once, dependencies in order, no deadlock);
* the costs: :func:`measure_stage_costs` (F, I, W, B and bytes per stage, one process),
  :func:`measure_p2p` (the link, with ``torch.distributed``), :class:`StageCost`,
  :class:`P2PCost`, :class:`PPCosts`, :func:`split_module`, :class:`LiveTensorBytes`;
* measured while the job trains: :class:`RollingStepCosts` (each ``schedule.step`` and each
  action of its stages timed into a rolling window), :func:`refreshed_pp_costs` (the costs
  from the windows' medians, with how fresh and how noisy: a :class:`PPRefreshed`),
  :func:`measure_action_overhead` (what the runtime adds per action, on the user's stages:
  an :class:`ActionOverhead`); :func:`calibrate_pp` (stages, link and that overhead at once,
  in the job's process group);
* the prediction: :func:`pp_simulate` (step, bubble and peak memory per rank),
  :func:`pp_lower_bounds`, :func:`pp_what_if`, :func:`pp_compare` (a :class:`PPComparison`);
* the search: :func:`pp_search` (CP-SAT and list scheduling, seeded with PyTorch's schedules);
* errors: :class:`PPError` (``.rule``, ``.field``, ``.value``, ``.schedule``),
  :class:`PPScheduleError` (a schedule the runtime would not run through: ``.rule``, ``.rank``,
  ``.action``, ``.step``, ``.fix``), :class:`PPTorchError` (a torch without the helpers read); a
  cost, time limit or cap out of range is an ``OptionError`` naming the field.

``swpipe pp`` runs every schedule and a searched one under ``torchrun`` and prints the
prediction beside the measurement.

Examples
--------
>>> from swpipe.pp import PPCosts, StageCost, pp_program, pp_simulate
>>> costs = PPCosts((StageCost(forward_s=1.0, backward_s=2.0, activation_bytes=100),) * 2)
>>> result = pp_simulate(pp_program("1F1B", n_ranks=2, n_microbatches=4), costs)
>>> result.step_s, result.peak_bytes
(15.0, {0: 200, 1: 100})
"""

from __future__ import annotations

from autosched.pp import (ActionOverhead, PPRefreshed, RollingStepCosts, calibrate_pp, measure_action_overhead,
                          refreshed_pp_costs)
from autosched.pp import (LiveTensorBytes, P2PCost, PPBounds, PPCandidate, PPComparison, PPCosts, PPError, PPProgram,
                          PPRow, PPScheduleError, PPSearchResult, PPSimResult, PPTorchError, PPWhatIf, StageCost,
                          builtin_programs, measure_p2p, measure_stage_costs, pp_compare, pp_lower_bounds, pp_program,
                          pp_search, pp_simulate, pp_what_if, program_from_order, read_csv, split_module,
                          validate_program)

__all__ = ["ActionOverhead", "PPRefreshed", "RollingStepCosts", "calibrate_pp", "measure_action_overhead",
           "refreshed_pp_costs",
           "LiveTensorBytes", "P2PCost", "PPBounds", "PPCandidate", "PPComparison", "PPCosts", "PPError", "PPProgram",
           "PPRow", "PPScheduleError", "PPSearchResult", "PPSimResult", "PPTorchError", "PPWhatIf", "StageCost",
           "builtin_programs", "measure_p2p", "measure_stage_costs", "pp_compare", "pp_lower_bounds", "pp_program",
           "pp_search", "pp_simulate", "pp_what_if", "program_from_order", "read_csv", "split_module",
           "validate_program"]
