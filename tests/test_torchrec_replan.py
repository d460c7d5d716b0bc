"""``swpipe.torchrec.TrainPipeline(replan=...)``: the drop-in re-plans on drift, its outputs those of the loop.

The drop-in's re-planning needs no TorchRec of its own: TorchRec's ``base`` plan on a plain module builds no
TorchRec machinery (its tasks are the model's own forward). Without TorchRec installed, :func:`dropin` imports
``swpipe.torchrec`` past the package's check with empty stand-ins for ``torchrec`` and ``fbgemm_gpu`` (removed
again after the module), so those tests run everywhere; the test on TorchRec's own model and plans is a peer test.
Every decision is scripted (the clock, the costs, the search), as in tests/test_replan.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import multiprocessing as mp
import os
import sys
import tempfile
import traceback
import types
from datetime import timedelta

import pytest
import torch

from autosched.model.costs import CostModel
from autosched.model.taskcost import TaskCost
from swpipe.replan import CostSnapshot, ReplanOptions, exchange_step, predicted_period
from swpipe_core import pipelines
from swpipe_core.engine.options import OptionError
from conftest import ScriptedClock, requires_torchrec, swpipe_threads, torchrec_usable

pytestmark = pytest.mark.timeout(120)

OPTS = ReplanOptions(warmup=2, window=4, patience=3, search_periods=3, min_noise=0.05)
NOCORE = ("nocore",)
#: the costs the scripted source says after the drift: the copy is the slow task
COSTS = CostModel({"H2D": TaskCost(0.004, resources=NOCORE), "ZeroGrad": TaskCost(0.0005, resources=NOCORE),
                   "WaitBatch": TaskCost(0.0001, resources=NOCORE), "Forward": TaskCost(0.001, resources=NOCORE),
                   "Backward": TaskCost(0.001, resources=NOCORE), "OptimizerStep": TaskCost(0.0005, resources=NOCORE)})
_STAND_INS = ("fbgemm_gpu", "torchrec", "torchrec.distributed", "torchrec.distributed.train_pipeline",
              "torchrec.distributed.train_pipeline.train_pipelines")


def stand_ins():
    """Empty modules under the names ``swpipe.torchrec`` checks for at import (nothing of them is used by a plan
    over the model's own forward)."""
    modules = {name: types.ModuleType(name) for name in _STAND_INS}
    modules["torchrec.distributed.train_pipeline"].train_pipelines = modules[_STAND_INS[-1]]
    return modules


@pytest.fixture(scope="module")
def dropin():
    """``(swpipe.torchrec.pipeline, swpipe.torchrec.replan)``: with TorchRec when it is installed, else past the
    package's import check on empty stand-ins (the modules imported so are forgotten after the test module)."""
    if torchrec_usable():
        import swpipe.torchrec.pipeline as pipeline
        import swpipe.torchrec.replan as replan

        yield pipeline, replan
        return
    before = set(sys.modules)
    modules = stand_ins()
    with pytest.MonkeyPatch.context() as patch:
        for name, module in modules.items():
            patch.setitem(sys.modules, name, module)
        import swpipe
        import swpipe.torchrec.pipeline as pipeline
        import swpipe.torchrec.replan as replan

        try:
            yield pipeline, replan
        finally:
            for name in set(sys.modules) - before:
                if name.startswith("swpipe.torchrec"):
                    del sys.modules[name]
            patch.delattr(swpipe, "torchrec", raising=False)


class Tiny(torch.nn.Module):
    """A model as TorchRec's pipelines take it: ``forward(batch) -> (losses, output)``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, batch):
        out = self.lin(batch)
        return (out ** 2).mean(dim=1), out.detach()


def batches(n):
    return [torch.randn(3, 4, generator=torch.Generator().manual_seed(k)) for k in range(n)]


def model_and_optimizer():
    model = Tiny()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def drive(pipeline, model, data, evals=()):
    """``progress`` until StopIteration, the model in eval for the calls numbered in ``evals``."""
    it, out = iter(data), []
    while True:
        model.train(len(out) not in evals)
        try:
            out.append(pipeline.progress(it))
        except StopIteration:
            return out


def loop(data, evals=()):
    """The non-pipelined loop: each batch trained (or, numbered in ``evals``, evaluated) in turn."""
    model, opt = model_and_optimizer()
    out = []
    for k, batch in enumerate(data):
        if k in evals:
            with torch.no_grad():
                out.append(model(batch)[1])
            continue
        opt.zero_grad()
        losses, output = model(batch)
        torch.sum(losses, dim=0).backward()
        opt.step()
        out.append(output)
    return out, model


class Scripted:
    """A cost source that says COSTS whenever asked."""

    instrument = None

    def costs_now(self):
        return CostSnapshot(COSTS)


def copy_on_its_own_thread():
    """TorchRec's ``base`` plan with the copy on a thread of its own (unbound: the drop-in binds it)."""
    base = pipelines.get("base")
    return base.replace(schedule={k: dataclasses.replace(v, thread_group="io") if base.task(k).name == "H2D" else v
                                  for k, v in base.schedule.items()})


def scripted(monkeypatch, dropin, search, switch=30):
    """The drop-in's engine made with a scripted clock, cost source and search (``adaptive_engine``'s keywords)."""
    pipeline, replan = dropin
    monkeypatch.setattr(pipeline, "adaptive_engine", functools.partial(
        replan.adaptive_engine, clock=ScriptedClock(switch=switch), cost_source=Scripted(), search=search))


def test_the_drop_in_swaps_its_plan_on_drift_and_its_outputs_equal_the_loop_in_train_and_eval(dropin, monkeypatch):
    pipeline_module, _ = dropin
    new = copy_on_its_own_thread()
    assert predicted_period(new, COSTS) < 0.9 * predicted_period(pipelines.get("base"), COSTS)  # worth a swap
    scripted(monkeypatch, dropin, lambda plan, costs: new)
    n, evals = 50, {20, 36, 38, 39}  # eval batches around the swap: each batch's mode is keyed by its index
    model, opt = model_and_optimizer()
    with pipeline_module.TrainPipeline(model, opt, "cpu", plan="base", replan=OPTS) as pipeline:
        assert pipeline.plan.sched("H2D").thread_group == "default"
        out = drive(pipeline, model, batches(n), evals)
        [swap] = pipeline.replanner.swaps
        assert (swap.detected_at, swap.decided_at, swap.starts_at) == (32, 35, 38)  # 36 and 37 drained
        assert pipeline.plan.sched("H2D").thread_group == "io"  # the plan running now
        assert pipeline.engine is pipeline.replanner.pipeline and pipeline.engine.plan is pipeline.plan
        assert "re-planned" in pipeline.report
    expected, trained = loop(batches(n), evals)
    assert len(out) == n and all(torch.equal(a, b) for a, b in zip(out, expected))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), trained.parameters()))
    assert swpipe_threads() == []


def test_a_plan_found_that_the_drop_in_cannot_drive_is_no_swap(dropin, monkeypatch):
    pipeline_module, _ = dropin
    base = pipelines.get("base")
    early = base.replace(schedule={k: dataclasses.replace(v, stage=0) if base.task(k).name in (
        "H2D", "ZeroGrad", "WaitBatch", "Forward") else v for k, v in base.schedule.items()})
    assert early.pipeline_depth == 2 and early.stage("Forward") == 0  # the forward not in the last stage
    scripted(monkeypatch, dropin, lambda plan, costs: early)
    model, opt = model_and_optimizer()
    with pipeline_module.TrainPipeline(model, opt, "cpu", plan="base", replan=OPTS) as pipeline:
        running = pipeline.plan
        out = drive(pipeline, model, batches(45))
        [kept] = pipeline.replanner.decisions
        assert not kept.swapped and kept.plan is running  # the search's answer was the running plan
        assert kept.predicted_new_s == kept.predicted_old_s
        assert pipeline.plan is running
    expected, _ = loop(batches(45))
    assert all(torch.equal(a, b) for a, b in zip(out, expected))


@pytest.mark.parametrize("name", ["base", "sparse_dist", "semi_sync"])
def test_the_default_search_at_a_named_plans_depth_finds_a_plan_the_drop_in_can_drive(dropin, name):
    from autosched.search.options import Constraints
    from swpipe.replan import default_search
    from swpipe.torchrec.plans import at_depth, check_shape, named_plan, runnable

    plan = runnable(named_plan(name), {})
    costs = CostModel({n: TaskCost(0.001 * (1 + i % 3)) for i, n in enumerate(plan.task_names)})
    search = default_search(ReplanOptions(time_limit_s=0.3, constraints=at_depth(
        Constraints(), plan.task_names, plan.pipeline_depth, plan.caller_group)))
    found = search(plan, costs)
    check_shape(found)  # the forward and the tasks after it in the last stage
    assert found.pipeline_depth == plan.pipeline_depth
    assert predicted_period(found, costs) <= predicted_period(plan, costs)
    assert predicted_period(runnable(found, {}), costs) == predicted_period(found, costs)  # as the drop-in runs it


def test_the_default_search_predicts_the_plan_as_the_drop_in_runs_it_with_the_forward_on_the_callers_thread(dropin):
    from autosched.search.options import Constraints
    from swpipe.replan import default_search
    from swpipe.torchrec.plans import at_depth, named_plan, runnable

    plan = runnable(named_plan("base"), {})
    search = default_search(ReplanOptions(time_limit_s=30.0, constraints=at_depth(
        Constraints(), plan.task_names, plan.pipeline_depth, plan.caller_group)))
    found = search(plan, COSTS)  # the copy the slow task: it leaves the caller's thread, the forward stays
    assert found.sched("Forward").thread_group == found.caller_group == plan.caller_group
    assert found.sched("H2D").thread_group != found.caller_group
    assert predicted_period(runnable(found, {}), COSTS) == predicted_period(found, COSTS) == pytest.approx(0.004)


def test_with_the_default_search_the_drop_in_swaps_to_the_plan_for_the_costs_now(dropin, monkeypatch):
    pipeline_module, replan = dropin
    monkeypatch.setattr(pipeline_module, "adaptive_engine", functools.partial(
        replan.adaptive_engine, clock=ScriptedClock(switch=30), cost_source=Scripted()))
    model, opt = model_and_optimizer()
    # a search cut short by its time limit may return the running plan (no swap): the limit is far above what the
    # search takes to prove its plan optimal here (well under a second), so a loaded machine cannot cut it
    options = dataclasses.replace(OPTS, time_limit_s=60.0)
    with pipeline_module.TrainPipeline(model, opt, "cpu", plan="base", replan=options) as pipeline:
        out = drive(pipeline, model, batches(50))
        [swap] = pipeline.replanner.swaps
        assert swap.predicted_new_s < swap.predicted_old_s
        assert pipeline.plan.pipeline_depth == 2 and pipeline.plan.stage("Forward") == 1
        assert pipeline.plan.caller_group == pipeline.plan.sched("Forward").thread_group  # made runnable
    expected, _ = loop(batches(50))
    assert all(torch.equal(a, b) for a, b in zip(out, expected))


def test_replan_is_off_by_default_and_takes_true_or_replan_options(dropin):
    pipeline_module, _ = dropin
    model, opt = model_and_optimizer()
    with pipeline_module.TrainPipeline(model, opt, "cpu", plan="base") as plain:
        assert plain.replanner is None and "re-planned" not in plain.report
    with pipeline_module.TrainPipeline(model, opt, "cpu", plan="base", replan=True) as on:
        assert on.replanner.replan == ReplanOptions()
        assert sorted(on.replanner.cost_source.base.tasks) == sorted(on.plan.task_names)  # the window's tasks
    with pytest.raises(OptionError) as caught:
        pipeline_module.TrainPipeline(model, opt, "cpu", plan="base", replan={"window": 4})
    assert (caught.value.given_to, caught.value.field) == ("TrainPipeline", "replan")


WORLD, N_RANKS, EVALS_RANKS = 2, 50, {40, 42}
#: the ranks exchange after every 8th batch: rank 0's decision point (35) waits for the exchange after batch 39
RANKS_OPTS = dataclasses.replace(OPTS, exchange_every=8)


def _rank_main(rank: int, store_path: str, out_dir: str) -> None:
    """One rank of the two-rank test: rank 0's clock drifts, rank 1's never does and its search must not run."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.distributed as dist

    out = {}
    try:
        if not torchrec_usable():
            sys.modules.update(stand_ins())
        import swpipe.torchrec.pipeline as pipeline_module
        import swpipe.torchrec.replan as replan_module

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD,
                                timeout=timedelta(seconds=20))
        new, searched = copy_on_its_own_thread(), []

        def search(plan, costs):
            searched.append(1)
            return new

        pipeline_module.adaptive_engine = functools.partial(
            replan_module.adaptive_engine, clock=ScriptedClock(switch=30 if rank == 0 else 10 ** 9),
            cost_source=Scripted(), search=search)
        model, opt = model_and_optimizer()
        with pipeline_module.TrainPipeline(model, opt, "cpu", plan="base", replan=RANKS_OPTS) as pipeline:
            outputs = drive(pipeline, model, batches(N_RANKS), EVALS_RANKS)
            out["decisions"] = [[d.decided_at, d.swapped, d.starts_at] for d in pipeline.replanner.decisions]
            out["copy_thread"] = pipeline.plan.sched("H2D").thread_group
        expected, _ = loop(batches(N_RANKS), EVALS_RANKS)
        out["equal"] = len(outputs) == N_RANKS and all(torch.equal(a, b) for a, b in zip(outputs, expected))
        out["searched"] = len(searched)
        dist.destroy_process_group()
    except BaseException:
        out["crash"] = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_on_two_ranks_rank_0_decides_and_both_drop_ins_swap_at_the_same_batch():
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank_main, name=f"dropin-rank{r}", args=(r, os.path.join(tmp, "store"), tmp))
                 for r in range(WORLD)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(180)
        killed = [p.name for p in procs if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
        assert killed == [], f"ranks did not end by themselves: {killed}"
        out = []
        for r in range(WORLD):
            with open(os.path.join(tmp, f"rank{r}.json")) as fh:
                out.append(json.load(fh))
    for r, res in enumerate(out):
        assert "crash" not in res, f"rank {r} crashed:\n{res['crash']}"
    rank0, rank1 = out
    assert exchange_step(39, RANKS_OPTS.exchange_every) and not exchange_step(35, RANKS_OPTS.exchange_every)
    assert rank0["decisions"] == rank1["decisions"] == [[39, True, 42]]  # rank 1's clock never drifted; 40, 41 drained
    assert rank0["copy_thread"] == rank1["copy_thread"] == "io"
    assert (rank0["searched"], rank1["searched"]) == (1, 0)
    assert rank0["equal"] and rank1["equal"]


@requires_torchrec
@pytest.mark.peer
@pytest.mark.timeout(300)
def test_on_torchrecs_model_a_swap_to_one_thread_per_stream_gives_the_outputs_of_the_unswapped_plan(monkeypatch):
    import torch.distributed as dist
    from swpipe.torchrec import TrainPipeline, models
    from swpipe.torchrec.plans import named_plan
    from swpipe_core.engine.workers import with_thread_map

    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        import swpipe.torchrec.pipeline as pipeline_module
        import swpipe.torchrec.replan as replan_module

        costs = CostModel({n: TaskCost(0.001, resources=NOCORE) for n in named_plan("sparse_dist").task_names})
        source = type("Source", (), {"instrument": None, "costs_now": lambda self: CostSnapshot(costs)})()
        new = with_thread_map(named_plan("sparse_dist"), "by_stream")
        monkeypatch.setattr(pipeline_module, "adaptive_engine", functools.partial(
            replan_module.adaptive_engine, clock=ScriptedClock(switch=30), cost_source=source,
            search=lambda plan, c: new))
        n = 45
        outs = []
        for replan in (None, ReplanOptions(warmup=2, window=4, patience=3, search_periods=3)):
            model, optimizer = models.sparse_nn()
            pipeline = TrainPipeline(model, optimizer, torch.device("cpu"), plan="sparse_dist", replan=replan)
            it, out = iter(models.sparse_nn_batches(models.SparseNNConfig(), n)), []
            while True:
                try:
                    out.append(pipeline.progress(it))
                except StopIteration:
                    break
            if replan is not None:
                assert [d.swapped for d in pipeline.replanner.decisions] in ([True], [False])
            pipeline.close()
            outs.append(out)
        assert len(outs[0]) == len(outs[1]) == n
        for a, b in zip(*outs):
            torch.testing.assert_close(a, b)
    finally:
        if owns:
            dist.destroy_process_group()
