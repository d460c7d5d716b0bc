"""init_distributed under launcher environments (one process): joins, falls back, or says exactly what is wrong."""

from __future__ import annotations

import argparse
from datetime import timedelta

import pytest
import torch.distributed as dist

from autosched.model.costs import CostModel, TaskCost
from swpipe.commands import demo
from swpipe.workloads import agree
from swpipe.workloads.agree import PlanMismatchError, check_same_plan, combine_slowest
from swpipe.workloads.distenv import LAUNCHER_VARS, group_timeout, init_distributed, launcher_env
from swpipe_core.distributed import agree_on_end
from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.planfile import plan_to_dict
from conftest import free_port


@pytest.fixture
def clean_env(monkeypatch):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    yield monkeypatch
    if dist.is_initialized():
        dist.destroy_process_group()


def _launcher(monkeypatch, rank="0", world="1", local="0"):
    for var, value in dict(RANK=rank, WORLD_SIZE=world, LOCAL_RANK=local, MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(var, value)


@pytest.mark.parametrize("present, missing", [
    ({"RANK": "0"}, "WORLD_SIZE, MASTER_ADDR, MASTER_PORT"),
    ({"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "RANK"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "MASTER_ADDR, MASTER_PORT"),
])
def test_half_set_launcher_environment_is_an_error_naming_the_missing_variables(clean_env, present, missing):
    for var, value in present.items():
        clean_env.setenv(var, value)
    with pytest.raises(ValueError, match=f"{missing}.*`torchrun") as info:  # what is missing, then the launcher
        init_distributed()
    assert ", ".join(present) in str(info.value)
    assert not dist.is_initialized()


def test_rank_outside_the_world_or_not_a_number_is_an_error(clean_env):
    _launcher(clean_env, rank="2", world="2")
    with pytest.raises(ValueError, match=r"RANK=2.*WORLD_SIZE=2.*\[0, WORLD_SIZE\)"):  # the values, the range
        init_distributed()
    clean_env.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK='zero'"):
        init_distributed()


def test_no_launcher_environment_falls_back_to_a_private_single_rank_group(clean_env, temp_in_tmp_path):
    assert launcher_env() is None
    with init_distributed() as env:
        assert (env.rank, env.world_size, env.launcher, env.backend) == (0, 1, False, "gloo")
    assert list(temp_in_tmp_path.iterdir()) == []  # the single rank's rendezvous leaves nothing behind


def test_a_complete_launcher_environment_is_joined_through_env(clean_env):
    _launcher(clean_env, rank="0", world="1", local="0")
    with init_distributed(timeout=timedelta(seconds=20)) as env:
        assert (env.rank, env.world_size, env.local_rank, env.launcher) == (0, 1, 0, True)
        assert env.device.type == "cpu"
    assert not dist.is_initialized()


def test_existing_group_that_disagrees_with_the_launcher_world_size_is_an_error(clean_env):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    _launcher(clean_env, rank="0", world="2")
    with pytest.raises(ValueError, match=r"\b1\b.*\(RANK, WORLD_SIZE\).*\b2\b"):  # the group's size, the launcher's
        init_distributed()


def test_every_group_the_workload_creates_gets_the_timeout(clean_env):
    with init_distributed(timeout=timedelta(seconds=13)) as env:
        groups = [env.control, env.new_group(), agree_on_end(range(1)).group, *env.groups.values()]
        assert {group_timeout(g) for g in groups} == {timedelta(seconds=13)}
        # torch's own default for a new group is 30 minutes: the reason for passing it everywhere
        assert group_timeout(dist.new_group([0], backend="gloo")) == timedelta(minutes=30)


def test_demo_with_a_half_set_environment_exits_2_naming_the_variables(clean_env, capsys):
    clean_env.setenv("WORLD_SIZE", "2")
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    assert demo.run(parser.parse_args(["--iters", "1"])) == 2
    assert "RANK, MASTER_ADDR, MASTER_PORT" in capsys.readouterr().err  # the variables missing


def test_demo_world_size_that_contradicts_the_launcher_exits_2(clean_env, capsys):
    _launcher(clean_env, rank="0", world="1")
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    assert demo.run(parser.parse_args(["--world-size", "3", "--iters", "1"])) == 2
    assert "--world-size" in capsys.readouterr().err  # the flag to drop


def test_plans_that_differ_between_ranks_raise_naming_rank_and_fields(clean_env, monkeypatch):
    mine = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1, "s")}, [("B", "A")])
    theirs = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1, "t")}, [("B", "A")],
                          enqueue_policy="enqueue_order", enqueue_order=["A", "B"])
    monkeypatch.setattr(agree, "gather", lambda env, obj: [obj, plan_to_dict(theirs)])
    with pytest.raises(PlanMismatchError) as info:
        check_same_plan(None, mine, "test plan")
    assert info.value.differences == {1: ["tasks", "enqueue_order", "enqueue_policy"]}
    assert info.value.tasks == {1: ["B"]}  # the task whose schedule differs


def test_combined_costs_take_the_slowest_rank_per_task_and_refuse_different_tasks():
    a = CostModel({"A": TaskCost(0.001, 0.005, ("comm:x",)), "B": TaskCost(0.004)})
    b = CostModel({"A": TaskCost(0.002, 0.001, ("comm:x",)), "B": TaskCost(0.003)})
    c = combine_slowest([a, b])
    assert (c["A"].host_s, c["A"].device_s, c["A"].resources, c["B"].host_s) == (0.002, 0.005, ("comm:x",), 0.004)
    with pytest.raises(ValueError, match=r"\b1\b.*\['A'\]"):  # the cost model and the tasks it covers
        combine_slowest([a, CostModel({"A": TaskCost(0.001)})])
