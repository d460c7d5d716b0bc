"""Re-planning on two ranks (gloo on loopback, spawned): rank 0 decides, both ranks swap at the same iteration to
the same plan, and each rank's results equal the serial loop's. Rank 1's clock and cost source are scripted to
say something else (no drift, other costs, a search that must not run): only rank 0's decision counts. The ranks
exchange after every ``OPTS.exchange_every``-th iteration only (the default), so rank 0's decision point (35, as in
the one-rank test) moves to the next exchange, and so does a failure."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import tempfile
import traceback
from datetime import timedelta
from typing import Any, Dict, List

import pytest

from conftest import ScriptedClock
from swpipe.replan import exchange_step
from test_replan import COSTS0, OPTS, Scripted, Training, bound, searched_plan, serial_reference

WORLD = 2
N, SLOW_FROM = 60, 25
DETECTED, DECISION_POINT = 32, 35  # rank 0's scripted clock: as in the one-rank test
EXCHANGED = next(i for i in range(DECISION_POINT, N) if exchange_step(i, OPTS.exchange_every))  # 47
DEADLINE_S = 120.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(DEADLINE_S) + 120)]


class FailingSource(Scripted):
    """Rank 0's cost source that raises when asked (at the drift, between two exchanges)."""

    def costs_now(self):
        self.asked += 1
        raise RuntimeError("no costs")


def _rank_main(rank: int, store_path: str, out_dir: str, before_doc: Dict[str, Any], after_doc: Dict[str, Any],
               fail: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    from swpipe.replan import AdaptivePipeline, ReplanError
    from swpipe_core.planfile import plan_from_dict, plan_to_dict

    torch.set_num_threads(1)
    out: Dict[str, Any] = {}
    try:
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD,
                                timeout=timedelta(seconds=20))
        group = dist.new_group(backend="gloo")
        t = Training(SLOW_FROM)
        before, after = plan_from_dict(before_doc), plan_from_dict(after_doc)
        searched: List[int] = []
        if rank == 0:  # drifts at iteration 29 (its clock), the search finds `after`
            def search(plan, costs):
                if fail == "search":
                    raise ValueError("no plan")
                return bound(after, t)
            clock, source = ScriptedClock(switch=30), FailingSource() if fail == "costs" else Scripted()
        else:  # never drifts, says the old costs, and its search must never run
            def search(plan, costs):
                searched.append(1)
                return plan
            clock, source = ScriptedClock(switch=10 ** 9), Scripted(COSTS0)
        pipe = AdaptivePipeline(bound(before, t), COSTS0, "cpu", replan=OPTS, cost_source=source, search=search,
                                clock=clock, group=group)
        try:
            with pipe:
                out["retired"] = retired = []
                it = pipe.fill_pipeline(range(N))
                while True:
                    try:
                        retired.append(pipe.progress(it))
                    except StopIteration:
                        break
        except ReplanError as exc:
            out["error"] = [exc.iteration, exc.reason]
        except RuntimeError as exc:  # rank 0's cost source, raised by the call that retired iteration len(retired)
            out["error"] = [len(out["retired"]), str(exc)]
        out["decisions"] = [[d.decided_at, d.swapped, d.starts_at, plan_to_dict(d.plan)] for d in pipe.decisions]
        out["plan"] = plan_to_dict(pipe.plan)
        out["searched"] = len(searched)
        out["asked"] = source.asked
        ref = serial_reference(N, SLOW_FROM)
        out["losses_equal"] = t.losses == ref.losses and all(
            torch.equal(a, b) for a, b in zip(t.model.parameters(), ref.model.parameters()))
        dist.destroy_process_group()
    except BaseException:
        out["crash"] = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)


def run_ranks(before_doc, after_doc, fail="") -> List[Dict[str, Any]]:
    """Both ranks, to the end or the deadline (then killed, and the test fails)."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank_main, name=f"replan-rank{r}",
                             args=(r, os.path.join(tmp, "store"), tmp, before_doc, after_doc, fail))
                 for r in range(WORLD)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(DEADLINE_S)
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
    return out


@pytest.fixture(scope="module")
def plan_docs():
    from swpipe_core.planfile import plan_to_dict
    from test_replan import COSTS1

    t = Training()
    return plan_to_dict(searched_plan(t, COSTS0)), plan_to_dict(searched_plan(t, COSTS1))


def test_rank_0_decides_and_every_rank_swaps_at_the_same_iteration_to_the_same_plan(plan_docs):
    before_doc, after_doc = plan_docs
    rank0, rank1 = run_ranks(before_doc, after_doc)
    assert rank0["retired"] == rank1["retired"] == list(range(N))
    # rank 0's clock drifts (decision at 35, as in the one-rank test); rank 1's never does, yet it swaps there too
    depth = before_doc.get("pipeline_depth") or 1 + max(t["stage"] for t in before_doc["tasks"])
    assert EXCHANGED == 47  # the decision point 35 waits for the next exchange
    swap = [EXCHANGED, True, EXCHANGED + depth + 1, after_doc]
    assert rank0["decisions"] == [swap] and rank1["decisions"] == [swap]
    assert rank0["plan"] == rank1["plan"] == after_doc
    assert (rank0["asked"], rank1["asked"], rank1["searched"]) == (1, 0, 0)  # rank 1 neither asks nor searches
    assert rank0["losses_equal"] and rank1["losses_equal"]


def test_a_failed_search_on_rank_0_raises_on_every_rank_at_the_same_iteration(plan_docs):
    before_doc, after_doc = plan_docs
    rank0, rank1 = run_ranks(before_doc, after_doc, fail="search")
    assert rank0["error"] == [EXCHANGED, "failed"]
    assert rank1["error"] == [EXCHANGED, "failed on rank 0"]
    assert rank0["decisions"] == rank1["decisions"] == []


def test_a_failure_between_two_exchanges_is_told_at_the_next_and_every_rank_raises_there(plan_docs):
    before_doc, after_doc = plan_docs
    assert not exchange_step(DETECTED, OPTS.exchange_every)  # rank 0's cost source raises between two exchanges
    rank0, rank1 = run_ranks(before_doc, after_doc, fail="costs")
    assert rank0["error"] == [EXCHANGED, "no costs"] and rank0["asked"] == 1
    assert rank1["error"] == [EXCHANGED, "failed on rank 0"]
    assert rank0["decisions"] == rank1["decisions"] == []
