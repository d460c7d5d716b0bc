"""Cells of ``01_profile_to_plan.ipynb`` (written by ``_build.py``; edit here, then run it)."""

from typing import List, Tuple

Cell = Tuple[str, str]  # ("md" | "code", source)

CELLS: List[Cell] = [
    ("md", """\
# From a profile to a plan: the user's path through swpipe

A training step is split into tasks. This notebook takes the path a user takes with swpipe on a real
workload, a DLRM-style recommendation model trained over a real `torch.distributed` process group
(gloo on CPU, world size 1):

1. **declare** the tasks and their data dependencies as a plain serial `PipelinePlan` and run it with `SWPipeline`;
2. **profile** each task on the real step with `TaskProfiler` and turn the result into a `CostModel`;
3. **auto-generate** a plan with `autosched.auto_schedule` (stage x thread group x enqueue order, searched jointly);
4. **check** it: `validate`, the schedule table, the stage analysis, the lower bound, and the simulator's prediction
   against a measured run that must compute exactly what the serial loop computes;
5. ask **what if** a task took longer or shorter.

Everything below runs on this machine's CPU in well under a minute. Times are measured, so they differ
from run to run (and on a shared machine, a lot); the structure of the answer does not."""),
    ("code", """\
%matplotlib inline
import tempfile, time, pathlib
import torch
import pandas as pd

from swpipe import (PipelinePlan, PipelineTask, TaskSchedule, SWPipeline, TaskProfiler, CostModel,
                    Constraints, SolverOptions, auto_schedule, simulate, lower_bounds, what_if, validate)
# Beyond `import swpipe`: the tables SWPipeline.print_schedule and print_stage_analysis print, as text for any
# plan, come from the module that makes them; the DLRM workload is the repository's example (swpipe.workloads).
from swpipe_core.analysis import format_schedule, format_stage_analysis
from swpipe.workloads.dlrm import DLRMConfig, DLRMWorkload, SyntheticData, init_distributed
from swpipe.workloads.tasks import task_fns

# The pipeline's threads are the parallelism here: one intra-op thread per torch op keeps
# two pipeline threads from fighting over the two cores with OpenMP's spinning workers.
torch.set_num_threads(1)
workdir = pathlib.Path(tempfile.mkdtemp(prefix="swpipe-nb-"))
env = init_distributed()                      # a real gloo process group, world size 1
config = DLRMConfig.preset("demo", batch_size=256, seed=0)
batches = SyntheticData(config, env.world_size, env.rank).batches(30)
print(config)
print(f"{len(batches)} batches; torch {torch.__version__}; device {env.device}")

def in_ms(table):
    \"\"\"A results table with its ``*_s`` columns in milliseconds (``*_ms``), rounded for reading.\"\"\"
    seconds = [c for c in table.columns if c.endswith("_s")]
    return table.assign(**{c[:-2] + "_ms": (table[c] * 1e3).round(3) for c in seconds}).drop(columns=seconds)"""),
    ("md", """\
## 1. Declare the tasks and run them serially

`task_fns` gives the workload's task functions, each `fn(ctx)` reading and writing attributes of the
iteration's `IterContext` (`ctx.batch` is the batch). The dependencies below are the data flow of one
training step (intra-iteration) and the state one iteration leaves for the next (inter-iteration: the
embedding tables `Backward(i-1)` updated, the weights `OptimizerStep(i-1)` wrote, the gradients `ZeroGrad(i)`
may only clear once they were applied). They are semantics: the searcher never drops one.

The plan puts everything at stage 0 on one thread: the plain training loop."""),
    ("code", """\
TASKS = ["H2D", "InputDistStart", "InputDistWait", "EmbLookup", "ZeroGrad", "Forward", "Backward", "OptimizerStep"]
INTRA = [("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("EmbLookup", "InputDistWait"),
         ("Forward", "EmbLookup"), ("Forward", "ZeroGrad"), ("Backward", "Forward"), ("OptimizerStep", "Backward")]
INTER = [("EmbLookup", "Backward", 1), ("Forward", "OptimizerStep", 1), ("ZeroGrad", "OptimizerStep", 1)]

def serial_plan(workload):
    fns = task_fns(workload, TASKS)
    schedule = {PipelineTask(name, fns[name]): TaskSchedule(globally_ordered=(name == "InputDistStart"))
                for name in TASKS}   # the all-to-all is a collective: one global order on every rank
    return PipelinePlan(schedule, intra_iter_deps=INTRA, inter_iter_deps=INTER)

wl = DLRMWorkload(config, env)
serial = serial_plan(wl)
validate(serial)
with SWPipeline(serial, device=env.device) as pipe:
    pipe.print_schedule(2)
    serial_s = pipe.run(iter(batches)) / len(batches)
print(f"\\nserial loop: {serial_s * 1e3:.2f} ms/iteration")"""),
    ("md", """\
## 2. Profile each task on the real step

`TaskProfiler` shortcuts one task at a time (replays its cached output instead of running it) and times
serial iterations: a task's *exposed* time is how much the step speeds up without it. It also records each
task's host time on its thread (on CUDA, device time with CUDA events).

The two halves of the input all-to-all cannot be shortcut on their own, so they are skipped for the exposed
time (their host time is still measured): `InputDistStart` returns receive buffers an asynchronous collective
is still writing (a cached copy could be taken half-written), and `InputDistWait` completes the exchange
inside the state object `InputDistStart` created, an in-place change a replay cannot see."""),
    ("code", """\
t0 = time.perf_counter()
with SWPipeline(serial, device=env.device) as pipe:
    profile = TaskProfiler(pipe, num_warmup=3, num_measure=5, num_rounds=3).profile(
        batches[0], skip_tasks=["InputDistStart", "InputDistWait"], state=wl.state)
print(f"profiled in {time.perf_counter() - t0:.1f} s\\n")
profile.print_report()
profile.to_dataframe()"""),
    ("md", """\
The cost model takes each task's measured host time (on this CPU build all of a task's time is host time;
on CUDA the profiler also fills `device_s`). It saves to and loads from versioned JSON
(`cost_models/README.md` documents the schema)."""),
    ("code", """\
costs = CostModel.from_profile(profile, machine=f"{torch.get_num_threads()} intra-op thread, 2-core CPU")
costs.save(workdir / "dlrm_costs.json")
costs = CostModel.load(workdir / "dlrm_costs.json")
cost_table = pd.DataFrame({n: {"host_ms": costs[n].host_s * 1e3, "device_ms": costs[n].device_s * 1e3}
                           for n in TASKS}).T
print(costs.method)
cost_table.round(3)"""),
    ("md", """\
Before searching, check the model: the simulator, fed the serial plan and these costs, should predict about
the serial period just measured (it models the engine's semantics, not the machine's noise)."""),
    ("code", """\
sim_serial = simulate(serial, costs)
print(f"serial: simulated {sim_serial.period_s * 1e3:.2f} ms/it, measured {serial_s * 1e3:.2f} ms/it")"""),
    ("md", """\
## 3. Auto-generate a plan

`auto_schedule` searches stages, thread groups and the enqueue order jointly: a beam search scored by the
simulator, then CP-SAT (this graph is small enough) which proves the minimum period of its model. Constraints
say what the machine allows: here at most 3 iterations in flight and 2 CPU thread groups (2 cores). The
report gives the predicted period, the lower bound and the gap, why this depth, and what was tried. How the
search runs (its time budget, its seed) is `SolverOptions`'s."""),
    ("code", """\
auto, report = auto_schedule(serial, costs, Constraints(max_depth=3, max_threads=2),
                             solver=SolverOptions(time_limit_s=10, seed=0))
print(report)"""),
    ("code", """\
print(report.explain())"""),
    ("md", """\
## 4. Check the plan

A plan is data: it validates, prints, and simulates without running anything. The stage analysis checks the
depth against the longest decreasing subsequence of the enqueue order (a lower bound on the stages any
submission order needs) and against the exact minimum depth for this order."""),
    ("code", """\
validate(auto)
print(format_schedule(auto, num_iterations=auto.pipeline_depth + 2))
print()
print(format_stage_analysis(auto))"""),
    ("code", """\
bounds = lower_bounds(auto, costs)
sim_auto = simulate(auto, costs)
print(bounds.summary())
print()
print(sim_auto.summary())"""),
    ("md", """\
Now run it. Each plan trains a fresh model from the same seed on the same batches, so the auto plan must
reproduce the serial loop's losses **bit for bit**: pipelining changes when work runs, never what it computes.
The measured period (the fastest of two runs) is set next to the simulator's prediction. The simulator models the engine (threads, FIFO
queues, dependencies, the progress barrier), not the machine: two Python threads share one GIL and, here, two
cores with whatever else runs, so on a busy machine the measured gain can be smaller than predicted."""),
    ("code", """\
def measure(plan_of, label, repeats=2):
    # the fastest of `repeats` runs; each trains a fresh model, so every run has the same losses
    best = None
    for _ in range(repeats):
        workload = DLRMWorkload(config, env)
        with SWPipeline(plan_of(workload), device=env.device, record_timeline=True) as pipe:
            seconds = pipe.run(iter(batches))
            run = {"plan": label, "ms/it": seconds / len(batches) * 1e3, "losses": workload.loss_list(),
                   "events": list(pipe.timeline)}
        best = run if best is None or run["ms/it"] < best["ms/it"] else best
    return best

runs = [measure(serial_plan, "serial"),
        measure(lambda w: auto.bind(task_fns(w, TASKS)), "auto")]   # the same plan, bound to the fresh model
losses_match = all(torch.equal(a, b) for a, b in zip(runs[0]["losses"], runs[1]["losses"])) \\
    and len(runs[0]["losses"]) == len(runs[1]["losses"]) == len(batches)
auto_measured_s = runs[1]["ms/it"] / 1e3
pd.DataFrame([{"plan": r["plan"], "measured ms/it": round(r["ms/it"], 2),
               "simulated ms/it": round(s.period_s * 1e3, 2)} for r, s in zip(runs, (sim_serial, sim_auto))]
             ).assign(**{"losses equal serial": [True, losses_match]})"""),
    ("md", """\
The measured timeline and the simulated one, aligned at the start of iteration 10, on the same tracks (one per
thread group). The measured run also exports as a Chrome/Perfetto trace (open it at https://ui.perfetto.dev)."""),
    ("code", """\
import dataclasses
# Beyond swpipe.gantt: two timelines side by side (autosched.plots) and a timeline as a Chrome trace
# (swpipe_core.measure.trace), from the modules that define them.
from autosched.plots import compare_gantt
from swpipe_core.measure.trace import write_chrome_trace

def from_iteration(events, i, span):
    t0 = min(e.start for e in events if e.iteration == i and e.kind == "host")
    return [dataclasses.replace(e, start=e.start - t0, end=e.end - t0) for e in events
            if e.start >= t0 and e.end <= t0 + span]

span = 4 * max(sim_auto.period_s, auto_measured_s)
fig = compare_gantt(from_iteration(runs[1]["events"], 10, span), from_iteration(sim_auto.events, 10, span),
                    window=(0.0, span), titles=("measured (auto plan)", "simulated (auto plan)"))
trace_path = write_chrome_trace(runs[1]["events"], workdir / "auto_plan.trace.json", name="auto plan")
print(f"trace: {trace_path}")
fig"""),
    ("md", """\
How does TorchRec's hand-written FusedSparseDist schedule do with the same costs? Its plan has one more
task (`WaitBatch`, a no-op here: on CUDA it is where the default stream waits the batch's copy), costed at
0 with `what_if`'s change syntax; `compare` simulates every plan under one cost model."""),
    ("code", """\
from swpipe import compare, pipelines
# what_if's helpers for changed costs and sweeps live beside it, in autosched.model.whatif
from autosched.model.whatif import apply_changes, sweep
torchrec = pipelines.get("fused_sparse_dist")          # unbound: analysis and simulation only
compared = compare({"serial": serial, "TorchRec fused_sparse_dist": torchrec, "auto": auto},
                   apply_changes(costs, {"WaitBatch": {"host_s": 0.0}}))
in_ms(compared)[["depth", "period_ms", "latency_ms", "lower_bound_ms", "binding"]]"""),
    ("md", """\
## 5. What if?

`what_if` simulates the plan before and after a change of costs: here, an embedding lookup twice as slow
(a bigger table, a slower all-to-all). `sweep` varies one task's cost over a range: how much slower could the
batch copy (`H2D`: a bigger batch, a slower host-to-device link) get before it shows in the period? The plot
marks where the binding resource changes: from the embedding recurrence to the thread that runs the copy."""),
    ("code", """\
what_if_table = what_if(auto, costs, {"EmbLookup": 2.0})
in_ms(what_if_table)[["change", "period_ms", "latency_ms", "speedup", "binding"]]"""),
    ("code", """\
from autosched.plots import sweep_plot
sweep_table = sweep(auto, costs, "H2D", factors=(1, 10, 20, 40, 60, 80, 100))
shown = in_ms(sweep_table).assign(binding=sweep_table["binding"].str.split(" -dep").str[0])
print(shown[["factor", "task_cost_ms", "period_ms", "binding"]].to_string(index=False))
sweep_plot(sweep_table)"""),
    ("code", """\
summary = {
    "serial_measured_ms": round(runs[0]["ms/it"], 3),  # the serial run measured beside auto, as in the table
    "auto_depth": auto.pipeline_depth,
    "auto_threads": len({auto.sched(n).thread_group for n in auto.task_names}),
    "auto_predicted_ms": round(report.period_s * 1e3, 3),
    "auto_measured_ms": round(auto_measured_s * 1e3, 3),
    "lower_bound_ms": round(report.lower_bound_s * 1e3, 3),
    "status": report.status,
    "losses_equal_serial": losses_match,
}
env.close()
summary"""),
]
