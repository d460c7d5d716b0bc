"""Cells of ``03_what_if.ipynb`` (written by ``_build.py``; edit here, then run it)."""

from typing import List, Tuple

Cell = Tuple[str, str]  # ("md" | "code", source)

CELLS: List[Cell] = [
    ("md", """\
# What if? Period and latency under changed costs, threads and depth

Before buying a faster link or rewriting a kernel, ask the simulator what it would change. This notebook
takes a **measured** cost model of TorchRec's `FusedSparseDist` pipeline on the DLRM workload
(`cost_models/dlrm_cpu/fused_sparse_dist.json`: median host time per task of a recorded run on a 2-core CPU)
and asks:

1. what if the all-to-all got slower (a bigger cluster) or the batch copy (`H2D`) did: when does the
   **binding resource** change?
2. what does one more thread group buy, and depth 2 instead of 3?
3. does the simulator's schedule look like a measured run of the same plan (Gantt charts side by side)?
4. on a GPU (a CUDA cost model), how much overlap would streams give?

The simulator models the engine's semantics (FIFO thread queues, dependency waits, the progress barrier,
streams and events on CUDA), so its answers are about the plan, not the machine's noise. About 20 s."""),
    ("code", """\
%matplotlib inline
import dataclasses
import pathlib
import pandas as pd
import matplotlib.pyplot as plt
import torch

from swpipe import CostModel, TaskSchedule, SWPipeline, simulate, lower_bounds, what_if, compare, validate, gantt
from swpipe import pipelines
# Beyond `import swpipe`: what_if's helpers for changed costs and sweeps (autosched.model.whatif), their charts
# (autosched.plots) and the schedule table as text (swpipe_core.analysis), from the modules that define them.
from swpipe_core.analysis import format_schedule
from autosched.plots import compare_gantt, sweep_plot
from autosched.model.whatif import apply_changes, sweep

REPO = pathlib.Path.cwd().parent          # the notebook runs in notebooks/
costs = CostModel.load(REPO / "cost_models" / "dlrm_cpu" / "fused_sparse_dist.json")
print(f"machine: {costs.machine}\\nmethod:  {costs.method}")

def in_ms(table):
    \"\"\"A results table with its ``*_s`` columns in milliseconds (``*_ms``), rounded for reading.\"\"\"
    seconds = [c for c in table.columns if c.endswith("_s")]
    return table.assign(**{c[:-2] + "_ms": (table[c] * 1e3).round(3) for c in seconds}).drop(columns=seconds)

def short(binding):
    \"\"\"The binding resource without the cycle that explains it.\"\"\"
    return binding.split(":")[0] if binding.startswith(("recurrence", "progress barrier")) else binding

pd.DataFrame({n: {"host_ms": round(costs[n].host_s * 1e3, 3)} for n in costs}).T"""),
    ("md", """\
## The plans

TorchRec's plan runs every task on the training loop's thread. On a CPU that thread is the bottleneck, so the
first what-if is structural: move the input pipeline (`H2D` and the two halves of the all-to-all) to a
second thread group `io`, and, one more, the embedding lookup to a third group `emb`. `depth2` is the
two-thread plan with the all-to-all in stage 0 next to the copy (2 iterations in flight instead of 3)."""),
    ("code", """\
torchrec = pipelines.get("fused_sparse_dist")
IO = ("H2D", "InputDistStart", "InputDistWait")

def regroup(plan, groups, stages=None):
    \"\"\"The plan with some tasks moved to other thread groups (and stages).\"\"\"
    stages = stages or {}
    return plan.replace(pipeline_depth=None, schedule={
        t: dataclasses.replace(s, thread_group=groups.get(t.name, s.thread_group), stage=stages.get(t.name, s.stage))
        for t, s in plan.schedule.items()})

two = regroup(torchrec, {n: "io" for n in IO})
three = regroup(torchrec, {**{n: "io" for n in IO}, "EmbLookup": "emb"})
depth2 = regroup(torchrec, {n: "io" for n in IO},
                 stages={"H2D": 0, "InputDistStart": 0, "InputDistWait": 0,
                         **{n: 1 for n in torchrec.task_names if n not in IO}})
plans = {"TorchRec (1 thread, depth 3)": torchrec, "io thread (2 threads, depth 3)": two,
         "io + emb threads (3 threads, depth 3)": three, "io thread, depth 2": depth2}
for plan in plans.values():
    validate(plan)
print(format_schedule(two, num_iterations=5))"""),
    ("code", """\
compared = compare(plans, costs)
compared["binding"] = compared["binding"].map(short)
in_ms(compared)[["depth", "period_ms", "latency_ms", "lower_bound_ms", "binding"]]"""),
    ("md", """\
Reading it: the second thread takes the input pipeline off the training thread (the period drops by the
input pipeline's host time, and the training thread still binds). A third thread for the lookup buys a
little more, and then the plan is bound by a **recurrence** through the progress barrier: `EmbLookup(i)`
waits for `Backward(i-1)` (it reads the tables `Backward` updated), so one iteration's lookup, forward and
backward form a cycle no extra thread can shorten. Depth 2 has the same period as depth 3 here: the deeper
pipeline only adds latency (and a batch of memory) on this machine.

## Sweeps: where does the binding resource change?

The all-to-all (`InputDistStart` + `InputDistWait`, both scaled) and the batch copy (`H2D`) run on the `io`
thread of the two-thread plan. They are free until the `io` thread's work exceeds the training thread's;
then every extra millisecond shows in the period. The points where the binding resource changes are where
an investment starts (or stops) paying."""),
    ("code", """\
def sweep_tasks(plan, costs, tasks, factors):
    \"\"\"Period and latency as several tasks' costs are scaled together (what_if's change syntax).\"\"\"
    rows = []
    for f in factors:
        r = simulate(plan, apply_changes(costs, {t: f for t in tasks}))
        rows.append({"factor": f, "task_cost_s": sum(costs[t].host_s for t in tasks) * f,
                     "period_s": r.period_s, "latency_s": r.latency, "binding": short(r.binding)})
    table = pd.DataFrame(rows)
    table.attrs["task"] = " + ".join(tasks)
    return table

a2a_sweep = sweep_tasks(two, costs, ["InputDistStart", "InputDistWait"], (1, 4, 8, 12, 16, 20, 24, 32))
h2d_sweep = sweep(two, costs, "H2D", factors=(1, 20, 40, 60, 70, 80, 100, 150))
h2d_sweep["binding"] = h2d_sweep["binding"].map(short)

def first_change(table):
    changed = table[table["binding"] != table["binding"].iloc[0]]
    return None if changed.empty else changed.iloc[0]

for label, table in (("all-to-all", a2a_sweep), ("H2D", h2d_sweep)):
    row = first_change(table)
    print(f"{label}: binding {table['binding'].iloc[0]} until x{row['factor']:g} "
          f"({row['task_cost_s'] * 1e3:.2f} ms), then {row['binding']}")
in_ms(a2a_sweep)[["factor", "task_cost_ms", "period_ms", "latency_ms", "binding"]]"""),
    ("code", """\
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
for ax, table, label in ((axes[0], a2a_sweep, "all-to-all (InputDistStart + InputDistWait)"), (axes[1], h2d_sweep, "H2D")):
    ax.plot(table["task_cost_s"] * 1e3, table["period_s"] * 1e3, "o-", label="period")
    ax.plot(table["task_cost_s"] * 1e3, table["latency_s"] * 1e3, "s--", label="latency")
    row = first_change(table)
    if row is not None:
        ax.axvline(row["task_cost_s"] * 1e3, color="grey", lw=0.8)
        ax.annotate(f"binding -> {row['binding']}", (row["task_cost_s"] * 1e3, row["period_s"] * 1e3),
                    textcoords="offset points", xytext=(-120, 25), fontsize=8, arrowprops={"arrowstyle": "->"})
    ax.set_xlabel(f"{label} cost (ms/iteration)")
    ax.set_ylabel("ms/iteration")
    ax.legend(fontsize=8)
axes[0].set_title("what if the all-to-all were slower?")
axes[1].set_title("what if the batch copy were slower?")
fig.tight_layout()"""),
    ("md", """\
`sweep_plot` draws a single-task sweep (here `H2D`) with the lower bound, marking where the binding resource
changes:"""),
    ("code", """\
sweep_plot(h2d_sweep)"""),
    ("md", """\
## Simulated vs measured

Does the simulator's schedule match a real run? Run the two-thread plan on the DLRM workload (a real gloo
process group, world size 1), record its timeline, build a cost model from that run
(`CostModel.from_timeline`) and simulate the same plan with it. The two Gantt charts share their tracks (one
per thread group) and time axis, aligned at the start of iteration 10. (This run uses one intra-op thread
per torch op, the committed model two, so its task times differ from the table above: the comparison is of
the run with its own costs.)"""),
    ("code", """\
from swpipe.workloads.dlrm import DLRMConfig, DLRMWorkload, SyntheticData, init_distributed
from swpipe.workloads.tasks import task_fns

torch.set_num_threads(1)        # the pipeline's threads are the parallelism on a small CPU
env = init_distributed()
config = DLRMConfig.preset("demo", batch_size=256, seed=0)
batches = SyntheticData(config, env.world_size, env.rank).batches(24)
workload = DLRMWorkload(config, env)
with SWPipeline(two.bind(task_fns(workload, two.task_names)), device=env.device, record_timeline=True) as pipe:
    seconds = pipe.run(iter(batches))
    events = list(pipe.timeline)
measured_costs = CostModel.from_timeline([e for e in events if e.iteration >= 2])
sim = simulate(two, measured_costs)
measured_period = seconds / len(batches)
print(f"measured {measured_period * 1e3:.2f} ms/it (whole run, fill and drain included); "
      f"simulated {sim.period_s * 1e3:.2f} ms/it (steady state)")
print(sim.summary())"""),
    ("code", """\
def from_iteration(events, i, span):
    t0 = min(e.start for e in events if e.iteration == i and e.kind == "host")
    return [dataclasses.replace(e, start=e.start - t0, end=e.end - t0) for e in events
            if e.start >= t0 and e.end <= t0 + span]

span = 4 * max(sim.period_s, measured_period)
compare_gantt(from_iteration(events, 10, span), from_iteration(sim.events, 10, span), window=(0.0, span),
              titles=("measured: two-thread plan, DLRM on CPU", "simulated: same plan, costs from the run"))"""),
    ("md", """\
## On a GPU: the overlap streams would give

`cost_models/fused_sparse_dist.json` is a hand-written CUDA model of the same pipeline (assumed 8x A100 over
NVLink; its `notes` say what was assumed). In `device="cuda"` mode a task's `host_s` runs on its thread and
its `device_s` on its stream; `device="cpu"` charges both to the thread: no overlap at all. The ratio is
what the streams buy, and the Gantt shows where the device is busy."""),
    ("code", """\
cuda_costs = CostModel.load(REPO / "cost_models" / "fused_sparse_dist.json")
on_gpu = simulate(torchrec, cuda_costs, device="cuda")
no_overlap = simulate(torchrec, cuda_costs, device="cpu")
overlap = no_overlap.period_s / on_gpu.period_s
print(f"{cuda_costs.machine}")
print(f"no overlap: {no_overlap.period_s * 1e3:.2f} ms/it; with streams: {on_gpu.period_s * 1e3:.2f} ms/it "
      f"-> {overlap:.2f}x from overlap")
print(on_gpu.summary())
gpu_what_if = what_if(torchrec, cuda_costs, {"EmbLookup": 2.0}, device="cuda")
gpu_what_if["binding"] = gpu_what_if["binding"].map(short)
in_ms(gpu_what_if)[["change", "period_ms", "latency_ms", "speedup", "binding"]]"""),
    ("code", """\
t0 = min(e.start for e in on_gpu.events if e.iteration == 20)
gantt([dataclasses.replace(e, start=e.start - t0, end=e.end - t0) for e in on_gpu.events
       if t0 <= e.start and e.end <= t0 + 3 * on_gpu.period_s],
      title="simulated CUDA timeline (FusedSparseDist, hand-written A100 costs)")"""),
    ("code", """\
env.close()
summary = {
    "periods_ms": {k: round(v * 1e3, 3) for k, v in compared["period_s"].items()},
    "a2a_binding_changes_at": float(first_change(a2a_sweep)["factor"]),
    "h2d_binding_changes_at": float(first_change(h2d_sweep)["factor"]),
    "gpu_overlap": round(overlap, 2),
}
summary"""),
]
