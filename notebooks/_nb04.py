"""Cells of ``04_dataflow_and_memory.ipynb`` (written by ``_build.py``; edit here, then run it)."""

from typing import List, Tuple

Cell = Tuple[str, str]  # ("md" | "code", source)

CELLS: List[Cell] = [
    ("md", """\
# Dataflow and memory: which dependencies a plan needs, and how many bytes it keeps in flight

Two questions a hand-written pipeline answers by convention and hope:

1. **Which dependencies must the plan declare?** A forgotten one does not crash: the pipelined run silently
   computes something else (a race on `ctx`, weights read before or after the wrong optimizer step).
   `swpipe_core.dataflow` *observes* the tasks: every `ctx` attribute they read, write or delete, and through
   PyTorch's dispatcher every tensor (parameters, gradients, optimizer state, named by the modules you pass).
2. **How much memory does a deeper plan cost?** Each stage keeps one more iteration's context alive.
   `swpipe_core.measure.memory` measures what each task adds to and frees from the context, the simulator turns that
   into bytes in flight over time, and `auto_schedule` can search under a cap.

Everything here runs the DLRM workload of `swpipe demo` (small `test` preset, one CPU rank) for a few
iterations."""),
    ("code", """\
%matplotlib inline
import pandas as pd
import torch

from swpipe import (SWPipeline, simulate, Constraints, SolverOptions, auto_schedule, CostModel, check_dataflow,
                    infer_plan, pipelines)
from swpipe.workloads import DLRMConfig, DLRMWorkload, SyntheticData, emb_staleness, fns_for, init_distributed
# Beyond `import swpipe`: the memory figures this notebook looks inside come from the modules that compute them
# (per task: swpipe_core.measure.memory; the least any plan needs: autosched.model.memory), and the error a cap
# no plan meets raises (a ValueError with the minimum as a field) from the search's memory module.
from swpipe_core.measure.memory import measure_task_memory
from autosched.model.memory import format_bytes, min_memory
from autosched.search.memcap import MemoryCapError

torch.set_num_threads(1)
env = init_distributed()                     # one gloo rank on this machine
config = DLRMConfig.preset("test")
batches = SyntheticData(config).batches(12)

def bound(name, **opts):
    \"\"\"TorchRec's plan `name`, bound to the tasks of a fresh workload (recording and runs train it).\"\"\"
    wl = DLRMWorkload(config, env)
    return wl, pipelines.get(name, fns_for(name, wl, compile_backend=None, compiled_autograd=None), **opts)"""),
    ("md", """\
## 1. Inferred dependencies

`infer_plan` runs the tasks of TorchRec's `sparse_dist` plan serially on two batches under the recorder and
returns the minimal dependencies: intra-iteration read-after-write as `(reader, writer)`, and across
iterations `(reader, writer, 1)` where a task reads state another wrote in the previous iteration (or
overwrites state another still needs). Each row of the table is one observed hazard, the edge that orders it
(`dep`: declared by the inference; `implied`: ordered through other edges) and what is behind it."""),
    ("code", """\
wl, sparse_dist = bound("sparse_dist")
inferred = infer_plan(sparse_dist, batches[:2], state=[wl.model, wl.dense_opt])
print(inferred)"""),
    ("md", """\
Next to the hand-written plan: every dependency TorchRec's plan declares, and whether the inference found
dataflow behind it (and the reverse). The plan's extra edges are ordering it wants for speed or for a
stream (e.g. keeping the all-to-all's two halves together), not dataflow."""),
    ("code", """\
declared = set(sparse_dist.intra_edges()) | set(sparse_dist.inter_edges())
observed = set(inferred.intra) | set(inferred.inter)
edges = pd.DataFrame(
    [{"edge": str(e), "declared by the plan": e in declared, "inferred from dataflow": e in observed}
     for e in sorted(declared | observed, key=str)])
edges"""),
    ("md", """\
## 2. A caught missing dependency

A move a searcher (or a person) might make for speed: run `OptimizerStep` one stage later on a thread of
its own, and drop the edge `("Forward", "OptimizerStep", 1)` that looks redundant. TorchRec's plan relied on
its single thread's FIFO to run `ZeroGrad(i)` after `OptimizerStep(i - 1)`; on two threads nothing orders
them any more, and `ZeroGrad` could clear the gradients the step is still reading. `check_dataflow` names the
tasks, the gradients behind the hazard, its kind, and the exact tuple to add; the forward pass's read of the
weights is folded into that fix (`ZeroGrad` comes before `Forward` in every iteration):"""),
    ("code", """\
from swpipe import TaskSchedule

wl, plan = bound("sparse_dist")
later = {k: TaskSchedule(3, v.stream, "optim") if plan.task(k).name == "OptimizerStep" else v
         for k, v in plan.schedule.items()}
broken = plan.replace(schedule=later, inter_iter_deps=[
    d for d in plan.inter_iter_deps if (plan.task(d[0]).name, plan.task(d[1]).name) != ("Forward", "OptimizerStep")])
report = check_dataflow(broken, batches[:3], state=[wl.model, wl.dense_opt])
for finding in report.missing:
    print(finding)
fixed = broken.replace(inter_iter_deps=[*broken.inter_iter_deps, ("ZeroGrad", "OptimizerStep", 1)])
print("\\nwith the fix:", "OK" if check_dataflow(fixed, record=report.record).ok else "still missing")"""),
    ("md", """\
## 3. Staleness on purpose: semi-sync

TorchRec's semi-synchronous pipeline overlaps the embedding lookup of the next batch with the current batch's
backward. Whether the lookup then reads tables one update old depends on the per-period order: with
swpipe's order the lookup is queued after the embedding backward and reads fresh tables; with the lookup
first it reads them one iteration stale. The checker reports that as staleness, not as an error, so a
user sees exactly what is traded for speed (and it agrees with the workload's own staleness model,
`emb_staleness`)."""),
    ("code", """\
lookup_first = ["H2D", "InputDistStart", "ZeroGrad", "InputDistWait", "Forward", "Backward",
                "EmbLookup", "EmbBackward", "OptimizerStep"]
rows = []
for label, order in (("swpipe's order", None), ("lookup first", lookup_first)):
    wl, plan = bound("semi_sync")
    if order is not None:
        plan = plan.replace(enqueue_order=order, pipeline_depth=plan.pipeline_depth)
    found = check_dataflow(plan, batches[:3], state=[wl.model, wl.dense_opt])
    stale = [f for f in found.stale if "emb_weights" in f.message]
    rows.append({"order": label, "errors": len(found.missing), "embedding staleness (checker)":
                 max([f.stale_by for f in stale] + [0]), "emb_staleness (model)": emb_staleness(plan),
                 "message": stale[0].message if stale else ""})
staleness = pd.DataFrame(rows).set_index("order")
staleness"""),
    ("md", """\
## 4. Memory: bytes in flight per plan

`measure_task_memory` runs three serial iterations and records, per task, the bytes it adds to and frees
from the context (each tensor storage counted once) and what it holds only while it runs. With the task
times of a timeline run, the simulator predicts the bytes every plan keeps in flight: a context lives from
its first task until its iteration retires, so a deeper plan holds more contexts at once. `min_memory` is
the least any plan of the same tasks needs at its period (a lower bound, like the period's)."""),
    ("code", """\
wl, plan = bound("sparse_dist")
with SWPipeline(plan, device="cpu", record_timeline=True) as pipe:
    figures = measure_task_memory(pipe, batches[0], num_iterations=3)
    pipe.run_serial(iter(batches))
    events = [e for e in pipe.timeline if e.iteration >= 2]
costs = CostModel.from_timeline(events).with_memory(figures)
pd.DataFrame({name: {"adds": format_bytes(t.add_bytes), "frees": format_bytes(t.free_bytes),
                     "held while running": format_bytes(t.transient_bytes)}
              for name, t in figures.tasks.items()}).T"""),
    ("code", """\
rows = []
for depth_name in ("base", "sparse_dist_lite", "sparse_dist", "semi_sync"):
    p = pipelines.get(depth_name)
    if sorted(p.task_names) != sorted(plan.task_names):
        continue  # a different task graph: these figures do not cover it
    sim = simulate(p, costs, num_iterations=40)
    rows.append({"plan": depth_name, "depth": p.pipeline_depth, "period ms": round(sim.period_s * 1e3, 3),
                 "peak bytes": sim.memory.peak_bytes, "peak": format_bytes(sim.memory.peak_bytes),
                 "mean": format_bytes(sim.memory.mean_bytes), "contexts at peak": sim.memory.iterations_at_peak})
by_depth = pd.DataFrame(rows).set_index("plan")
least = min_memory(plan.task_names, plan.intra_edges(), costs)
print("no plan of these tasks holds less than", format_bytes(least.value), "at its peak")
by_depth"""),
    ("md", """\
## 5. Searching under a memory cap

`Constraints(max_memory_bytes=...)` searches one depth cap at a time and returns the fastest plan whose
predicted peak fits. The cap below sits between what TorchRec's depth-2 and depth-3 plans hold, so
`sparse_dist`'s three iterations in flight do not fit; the search returns the fastest plan that does. The table and the plot show the trade-off (the Pareto front is marked); a cap below what
any plan needs is an error that names the minimum."""),
    ("code", """\
tasks_only = plan.replace(enqueue_order=None, pipeline_depth=plan.pipeline_depth)
peaks = by_depth["peak bytes"]
cap = (peaks.min() + peaks.max()) / 2
fitting, capped = auto_schedule(tasks_only, costs, Constraints(max_depth=3, max_threads=2, max_memory_bytes=cap),
                                solver=SolverOptions(time_limit_s=4))
print(capped.tradeoff_table())
print(f"chosen: depth {fitting.pipeline_depth}, predicted peak {format_bytes(capped.peak_bytes)} "
      f"under the cap {format_bytes(cap)}")
capped.plot_tradeoff()"""),
    ("code", """\
try:
    auto_schedule(tasks_only, costs, Constraints(max_depth=3, max_memory_bytes=least.value / 2),
                  solver=SolverOptions(time_limit_s=2))
except MemoryCapError as err:
    impossible = err
    print(err)"""),
]
