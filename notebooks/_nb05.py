"""Cells of ``05_gpipe.ipynb`` (written by ``_build.py``; edit here, then run it)."""

from typing import List, Tuple

Cell = Tuple[str, str]  # ("md" | "code", source)

CELLS: List[Cell] = [
    ("md", """\
# GPipe on swpipe: the schedule, its bubble and its memory, with and without checkpointing

`swpipe.gpipe.GPipe` trains an `nn.Sequential` in partitions, micro-batches pipelined through them, as
torchgpipe does; its schedule is a swpipe plan. This notebook takes a small model in two partitions on the
CPU (a thread each) and

1. prints the plan of a training step (the clock cycles),
2. profiles the layers and **predicts** the step by simulating the plan: time, bubble, activation memory,
   with and without checkpointing and by 1F1B,
3. draws the predicted **Gantt charts with and without checkpointing** (the recomputation lengthens every
   backward; the memory it saves is in the table),
4. **measures** the same steps and puts the figures beside the predictions, and the measured timeline
   beside the simulated one.

About 20 s on a 2-core CPU."""),
    ("code", """\
%matplotlib inline
import pandas as pd
import torch
from torch import nn

from swpipe import gantt
from autosched.plots import compare_gantt
from swpipe.gpipe import GPipe
from swpipe.gpipe.balance import profile_layers
from swpipe.gpipe.measure import measure_step
from swpipe.gpipe.predict import LayerModel, predict_step, what_if

torch.set_num_threads(1)   # one intra-op thread: the partitions' threads use the cores

def model():
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(256, 256), nn.ReLU())])

x, target = torch.randn(128, 256), torch.randn(128, 256)
loss_fn = nn.functional.mse_loss
balance, chunks = [4, 4], 4
gpipe = GPipe(model(), balance, devices=["cpu", "cpu"], chunks=chunks, checkpoint="never")
print(gpipe.training_plan())"""),
    ("md", """\
## Predicted: time, bubble and activation memory

Each layer's forward and backward time and the bytes it keeps for backward are measured once by swpipe's
profiler, at two micro-batch sizes (time is affine in the micro-batch: a fixed cost per call). A partition
costs the sum of its layers; with checkpointing its backward also recomputes its forward, and it keeps only
its input. The simulator runs the step's plan with those costs."""),
    ("code", """\
layers = LayerModel.fit([profile_layers(model(), x[:32], timeout=0.3), profile_layers(model(), x[:16], timeout=0.3)])
configs = [("GPipe", "never"), ("GPipe", "always"), ("1F1B", "never"), ("1F1B", "always")]
predicted = {c: predict_step(layers, balance, len(x), chunks, checkpoint=c[1], schedule=c[0]) for c in configs}
pd.DataFrame([p.row() for p in predicted.values()]).round(3)"""),
    ("md", """\
## The Gantt chart, without and with checkpointing

One row per partition's thread; `F<j>` is partition `j`'s forward of a micro-batch, `B<j>` its backward.
The bubble is the white space: the first partition waits for the last one's backward at the end of the
step, the last one for the first one's forward at its start."""),
    ("code", """\
never, always = predicted[("GPipe", "never")], predicted[("GPipe", "always")]
compare_gantt(never.sim.events, always.sim.events,
              titles=(f"GPipe, no checkpointing: {never.step_s * 1e3:.1f} ms, bubble {never.bubble:.0%}, "
                      f"{never.activation_bytes / 1e6:.2f} MB of activations",
                      f"GPipe, checkpointing: {always.step_s * 1e3:.1f} ms, bubble {always.bubble:.0%}, "
                      f"{always.activation_bytes / 1e6:.2f} MB of activations"))"""),
    ("md", """\
## What if?

Eight micro-batches shrink the bubble (and each micro-batch's fixed costs add up); a lopsided balance makes
one partition the bottleneck; 1F1B keeps fewer micro-batches' activations at the same step time."""),
    ("code", """\
rows = what_if(never, layers, [{"chunks": 8}, {"balance": [6, 2]}, {"schedule": "1F1B"},
                               {"schedule": "1F1B", "chunks": 8}])
pd.DataFrame([r.row() for r in rows]).round(3)"""),
    ("md", """\
## Measured beside the prediction

`measure_step` runs each step (median of a few), counts the activations autograd keeps while it runs, and
reads the bubble off the step's timeline. The machine's load changes the measured times; the activation
bytes do not depend on it."""),
    ("code", """\
measured = {}
for sched, ck in configs:
    g = GPipe(model(), balance, devices=["cpu", "cpu"], chunks=chunks, checkpoint=ck, schedule=sched)
    measured[(sched, ck)] = measure_step(g, x, target, loss_fn, repeats=3)
table = pd.DataFrame([{"schedule": s, "checkpoint": ck,
                       "predicted_ms": predicted[(s, ck)].step_s * 1e3, "measured_ms": measured[(s, ck)].step_s * 1e3,
                       "predicted_bubble": predicted[(s, ck)].bubble, "measured_bubble": measured[(s, ck)].bubble,
                       "predicted_MB": predicted[(s, ck)].activation_bytes / 1e6,
                       "measured_MB": measured[(s, ck)].activation_bytes / 1e6} for s, ck in configs])
table.round(3)"""),
    ("code", """\
m = measured[("GPipe", "never")]
start = min(e.start for e in m.events)
shifted = [e.__class__(e.task, e.iteration, e.thread_group, e.stream, e.start - start, e.end - start, e.kind)
           for e in m.events]
compare_gantt(shifted, never.sim.events, titles=("measured GPipe step", "simulated"))"""),
]
