"""Cells of ``02_stage_analysis.ipynb`` (written by ``_build.py``; edit here, then run it)."""

from typing import List, Tuple

Cell = Tuple[str, str]  # ("md" | "code", source)

CELLS: List[Cell] = [
    ("md", """\
# Stage analysis: how many stages does a plan need?

A plan's **depth** (stages = iterations in flight) costs memory (one batch and its activations per stage) and
latency. It must be large enough that the per-period **enqueue order** never makes a thread wait for work
that was enqueued after it (a deadlock on a FIFO thread or stream). swpipe bounds and computes it:

* **LDS** (Dilworth): walk the enqueue order and look at the stages of tasks along one dependency chain; the
  longest *decreasing* subsequence of those stages is a lower bound on the stages any plan with this order
  needs. `LDS == depth` proves the depth is minimal for **every** order (Dilworth-optimal).
* **Minimum depth** (exact): the smallest stage assignment under which *this* enqueue order is
  deadlock-free (a longest path on the dependency constraints). `LDS <= minimum depth <= depth`.

This notebook runs both on all eleven TorchRec pipelines (`swpipe_core.pipelines`) under swpipe's two enqueue
policies and TorchRec's own submission order (`order="torchrec"`), then shows a plan with a removable stage
and a broken plan. It is pure analysis: nothing runs, so it takes a second."""),
    ("code", """\
%matplotlib inline
import networkx as nx
import pandas as pd
import matplotlib.pyplot as plt

from swpipe import PlanError, TaskSchedule, pipelines, validate
# Beyond `import swpipe`: this notebook looks inside the stage analysis, so it takes its parts from the modules
# that define them: swpipe_core.analysis (the analysis, LDS, minimum depth, removable stages) and
# swpipe_core.order (a plan's enqueue order).
from swpipe_core.analysis import format_stage_analysis, lds, min_depth, removable_boundaries
from swpipe_core.order import enqueue_order

ORDERS = ("ready_first", "stage_descending", "torchrec")"""),
    ("md", """\
## The table

For each pipeline and order: the depth TorchRec uses, the LDS, the exact minimum depth for that order, and the
verdict `format_stage_analysis` prints:

* **✓ Dilworth-optimal**: `LDS == depth`: no plan with this order (with any stages) is shallower;
* **✓ minimal**: `depth == minimum depth` but `LDS < depth`: this order needs every stage, though the
  lower bound alone cannot prove it;
* **+ removable**: `depth > minimum depth`: the listed stage boundaries `k|k+1` can be merged and the order
  stays deadlock-free. The extra stage is a choice, not an error: it buys overlap (work of two iterations in
  one period) and costs memory (one more batch and its context in flight), never correctness.

`staged` and `eval_sparse_dist` have no TorchRec order in swpipe (their `order="torchrec"` raises and says
why), so their row is empty there."""),
    ("code", """\
def chain_lds(plan, order):
    \"\"\"LDS of the stages along the enqueue order, counting only pairs on one dependency chain.\"\"\"
    deps = nx.DiGraph()
    deps.add_nodes_from(plan.task_names)
    deps.add_edges_from((d, t) for t, d in plan.intra_edges())
    ancestors = {n: nx.ancestors(deps, n) for n in deps}
    length, _ = lds([plan.stage(n) for n in order], related=lambda i, j: order[j] in ancestors[order[i]])
    return length

def verdict(depth, lds_, minimum, removable):
    if lds_ == depth:
        return "✓ Dilworth-optimal"
    if minimum == depth:
        return "✓ minimal"
    return "+ removable " + ", ".join(f"{k}|{k + 1}" for k in removable)

rows = []
for name in pipelines.PIPELINES:
    for order_name in ORDERS:
        try:
            plan = pipelines.get(name, order=order_name)
        except ValueError:           # no TorchRec order for this pipeline
            continue
        validate(plan)
        order = enqueue_order(plan)
        row = {"pipeline": name, "order": order_name, "depth": plan.pipeline_depth,
               "LDS": chain_lds(plan, order), "min depth": min_depth(plan)}
        row["verdict"] = verdict(row["depth"], row["LDS"], row["min depth"], removable_boundaries(plan))
        rows.append(row)
table = pd.DataFrame(rows)
verdicts = table.pivot(index="pipeline", columns="order", values="verdict").reindex(list(pipelines.PIPELINES))
verdicts[list(ORDERS)].fillna("(no TorchRec order)")"""),
    ("code", """\
wide = table.pivot(index="pipeline", columns="order", values=["LDS", "min depth"]).reindex(list(pipelines.PIPELINES))
numbers = pd.DataFrame({"depth": [pipelines.get(n).pipeline_depth for n in wide.index]}, index=wide.index)
for value, order_name in wide.columns:
    numbers[f"{value} ({order_name})"] = wide[(value, order_name)].astype("Int64")
numbers"""),
    ("md", """\
What the table says: TorchRec's depths are exactly what its own submission order needs (every `torchrec`
cell is ✓), and the same holds for swpipe's `stage_descending` (older iterations first, as TorchRec does),
except `eval_sparse_dist`. Its `H2D` runs on a `loader` thread, and with the caller's group inline both policies
hand a worker's task off before the caller's own tasks (the caller hands each one off when it reaches it in
the order), so the copy no longer waits behind the older iteration and one stage could go.
swpipe's default `ready_first` policy enqueues the input pipeline (H2D, the all-to-all) *before* the
iteration that consumes it, so most plans could run shallower with it: their extra stages are there for
overlap, and the `+` cells name which ones could go. `prefetch` under `ready_first` is the case where the
lower bound is not tight (`LDS = 2 < min depth = 3`).

The same numbers as a plot: bars are the minimum depth per order, the black tick is the depth TorchRec uses."""),
    ("code", """\
fig, ax = plt.subplots(figsize=(10, 3.8))
names = list(pipelines.PIPELINES)
width = 0.27
for k, order_name in enumerate(ORDERS):
    sub = table[table["order"] == order_name].set_index("pipeline").reindex(names)
    ax.bar([i + (k - 1) * width for i in range(len(names))], sub["min depth"].fillna(0), width, label=order_name)
ax.scatter(range(len(names)), numbers["depth"], marker="_", s=600, color="black", zorder=3, label="TorchRec depth")
ax.set_xticks(range(len(names)))
ax.set_xticklabels(names, rotation=30, ha="right")
ax.set_ylabel("stages")
ax.set_ylim(0, numbers["depth"].max() + 1.3)      # room for the legend above the bars
ax.set_title("minimum depth per enqueue order vs the depth TorchRec uses")
ax.legend(ncol=4, fontsize=8, loc="upper left")
fig.tight_layout()"""),
    ("md", """\
## A plan with a removable stage

`sparse_dist` under `ready_first`: the order enqueues `H2D` and `InputDistStart` first, so the batch copy and
the all-to-all of an iteration are issued before its forward pass in the same period. The analysis says both
stage boundaries could go, on the line starting with `+` (more stages than the order needs: a choice that
buys overlap and costs memory, not an error):"""),
    ("code", """\
plan = pipelines.get("sparse_dist")
text = format_stage_analysis(plan)
print(text)
removable_line = next(line.strip() for line in text.splitlines() if line.strip().startswith("+"))"""),
    ("md", """\
Taking the advice: merging the boundaries gives a one-stage plan that still validates (the order is still
deadlock-free). It is not necessarily better: with one stage the copy and the all-to-all of iteration *i*
no longer overlap the forward/backward of iteration *i − 1*; the stages were buying that overlap."""),
    ("code", """\
flat = plan.replace(schedule={t: TaskSchedule(0, s.stream, s.thread_group, s.globally_ordered)
                              for t, s in plan.schedule.items()}, pipeline_depth=None)
validate(flat)
print(f"depth {plan.pipeline_depth} -> {flat.pipeline_depth}; minimum depth of the merged plan: {min_depth(flat)}")
print("\\n".join(line for line in format_stage_analysis(flat).splitlines() if "✓" in line or line.strip().startswith("+")))"""),
    ("md", """\
## A broken plan and its `PlanError`

Move `Forward` to stage 1 of `sparse_dist` while the all-to-all it waits on stays at stage 1 and its own
`WaitBatch` stays at stage 2: within one iteration `WaitBatch` would run a period *after* `Forward`, which
waits on it. `validate` (also run by `SWPipeline`, `simulate` and `auto_schedule`) rejects the plan before
anything runs, naming the rule, the tasks and the fix:"""),
    ("code", """\
broken = plan.replace(schedule={**plan.schedule, "Forward": TaskSchedule(stage=1)})
try:
    validate(broken)
except PlanError as err:
    error = err
    print(f"PlanError: {err}")
print()
print(f"rule: {error.rule}\\ntasks: {error.tasks}\\nfix: {error.fix}")"""),
]
