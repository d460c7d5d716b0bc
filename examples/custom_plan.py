"""Write your own plan over the DLRM tasks: the embedding lookup one stage ahead of the dense step.

    python examples/custom_plan.py --iters 12
    torchrun --nproc-per-node 2 examples/custom_plan.py --iters 12   # two ranks, same script

A plan is data: stages, streams, thread groups and dependencies. Here
EmbLookup(i) runs a stage before Forward(i) and must wait Backward(i-1),
which applies the fused embedding update; validate() checks the rules, the
schedule table shows the overlap, and the run reproduces the plain loop.
The dependencies are exactly the ones ``swpipe.infer_plan``
infers from the tasks' observed reads and writes.
"""

import argparse

import torch

from swpipe import PipelinePlan, SWPipeline, TaskSchedule, validate
from swpipe.workloads import (DLRMConfig, DLRMWorkload, SyntheticData, init_distributed, same_results, task_fns,
                              train_reference)
from swpipe.workloads.agree import all_ranks


def lookup_ahead_plan() -> PipelinePlan:
    schedule = {
        "H2D": TaskSchedule(stage=0, stream="memcpy", thread_group="io"),
        "InputDistStart": TaskSchedule(stage=1, stream="data_dist", thread_group="io", globally_ordered=True),
        "InputDistWait": TaskSchedule(stage=1, stream="data_dist", thread_group="io"),
        "EmbLookup": TaskSchedule(stage=2, stream="emb_lookup", thread_group="sparse"),
    }
    for name in ("ZeroGrad", "Forward", "Backward", "OptimizerStep"):
        schedule[name] = TaskSchedule(stage=3)
    return PipelinePlan(
        schedule,
        intra_iter_deps=[("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"),
                         ("EmbLookup", "InputDistWait"), ("Forward", "EmbLookup"),
                         ("Backward", "ZeroGrad"),  # writes the gradients ZeroGrad dropped
                         ("Backward", "Forward"), ("OptimizerStep", "Backward")],
        inter_iter_deps=[("EmbLookup", "Backward"),  # reads the tables Backward(i-1) updated
                         ("ZeroGrad", "OptimizerStep"),  # drops the gradients OptimizerStep(i-1) read
                         ("Forward", "OptimizerStep")],  # reads the dense weights OptimizerStep(i-1) wrote
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)

    env = init_distributed()
    config = DLRMConfig.preset("test")
    batches = SyntheticData(config, env.world_size, env.rank).batches(args.iters)  # this rank's shard
    workload = DLRMWorkload(config, env)

    plan = lookup_ahead_plan()
    validate(plan)
    plan = plan.bind(task_fns(workload, plan.task_names))
    with SWPipeline(plan, device=env.device) as pipe:
        if env.rank == 0:
            pipe.print_schedule(5)
        pipe.run(iter(batches))

    reference = train_reference(DLRMWorkload(config, env), batches)
    same = all_ranks(env, same_results(workload.loss_list(), reference))  # folds every rank's check
    if env.rank == 0:
        print(f"depth {plan.pipeline_depth}, threads {sorted({plan.sched(t).thread_group for t in plan.task_names})}; "
              f"{env.world_size} rank(s), checked on every rank; losses equal to the plain loop: {same}")
    env.close()


if __name__ == "__main__":
    main()
