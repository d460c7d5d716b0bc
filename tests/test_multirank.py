"""Multi-rank ordering on real torch.distributed (gloo on loopback, two spawned ranks).

Each rank runs the same pipeline: two thread groups issue an ``all_reduce``
each in ``globally_ordered`` tasks. The sequence of collectives must be
identical on both ranks for 500 iterations, and every reduction must pair
the same task and iteration on both ranks (a mispairing shows as a wrong
sum). Then, on the same process group: uneven data wrapped in
:func:`swpipe_core.distributed.agree_on_end` stops both ranks at the same
iteration; and a rank whose task raises makes the other rank's pipeline fail
(gloo timeout) instead of hanging, after which every process exits by itself;
and uneven data *without* ``agree_on_end`` makes the longer rank fail the
same way (the hang of hand-written pipelines, turned into an error). Each
scenario uses a process group of its own, so one that breaks its group spares
the next.

The ranks are spawned by the test (``spawn`` start method, ``FileStore``
rendezvous); the test has a hard deadline and kills children that outlive
it, then fails.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional

import pytest
from conftest import drive as _drive
from conftest import spawned_ranks

WORLD = 2
ORDER_ITERS = 500
GLOO_TIMEOUT_S = 5.0       # a collective whose peer never comes fails after this
FAIL_RANK, FAIL_ITER = 1, 20
UNEVEN = {0: 12, 1: 9}     # batches per rank
SESSION_DEADLINE_S = 240.0
TASK_IDS = {"SyncA": 1, "SyncB": 2}


# ----------------------------------------------------------------------------- rank side

def _plan(rank: int, log: List[Any], bad: List[Any], group: Any, fail_at: Optional[int] = None,
          ordered: bool = True):
    """Load (io) -> SyncA (comm_a) + SyncB (comm_b), both all_reduce, globally ordered -> Step (compute)."""
    import torch
    import torch.distributed as dist

    from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

    def load(ctx):
        ctx.n = int(ctx.batch)

    def sync(name):
        tid = TASK_IDS[name]

        def fn(ctx):
            if fail_at is not None and ctx.iter_idx == fail_at:
                raise RuntimeError(f"injected-failure rank={rank} task={name} iteration={ctx.iter_idx}")
            # same shape for both tasks, so a mispairing gives a wrong sum instead of a shape error
            t = torch.tensor([tid, ctx.iter_idx, rank + 1], dtype=torch.int64)
            log.append((name, ctx.iter_idx))
            dist.all_reduce(t, group=group)
            want = [WORLD * tid, WORLD * ctx.iter_idx, WORLD * (WORLD + 1) // 2]
            if t.tolist() != want:
                bad.append((name, ctx.iter_idx, t.tolist()))
            setattr(ctx, name, t)
        return fn

    def step(ctx):
        ctx.done = ctx.SyncA[1].item() + ctx.SyncB[1].item()

    sched = {
        PipelineTask("Load", load): TaskSchedule(0, thread_group="io"),
        PipelineTask("SyncA", sync("SyncA")): TaskSchedule(1, "dist_a", "comm_a", globally_ordered=ordered),
        PipelineTask("SyncB", sync("SyncB")): TaskSchedule(1, "dist_b", "comm_b", globally_ordered=ordered),
        PipelineTask("Step", step): TaskSchedule(2, thread_group="compute"),
    }
    return PipelinePlan(sched, intra_iter_deps=[("SyncA", "Load"), ("SyncB", "Load"),
                                                ("Step", "SyncA"), ("Step", "SyncB")])


def _pipe(rank: int, log: List[Any], bad: List[Any], **kw: Any):
    """A pipeline on a process group of its own, so a scenario that breaks its group spares the next ones
    (``new_group`` rendezvous through the store, not through a possibly broken gloo group)."""
    import torch.distributed as dist

    from swpipe import Timeouts
    from swpipe_core.engine.pipeline import SWPipeline

    # new_group does not inherit init_process_group's timeout (its default is 30 min): without one, a worker
    # stuck in a collective whose peer is gone outlives the error and the process aborts at exit
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=GLOO_TIMEOUT_S))
    return SWPipeline(_plan(rank, log, bad, group, **kw), device="cpu",
                      timeouts=Timeouts(signal_s=20, sequencer_s=20, progress_s=30))


def _drive_until_error(pipe, data) -> Dict[str, Any]:
    """Run to the end or the first error; what happened, and the seconds since the last retired iteration."""
    import threading

    from swpipe_core.engine.pipeline import PipelineTaskError

    out: Dict[str, Any] = {"error": None, "retired": []}
    t_last = time.perf_counter()
    it = pipe.fill_pipeline(data)
    try:
        while True:
            out["retired"].append(pipe.progress(it))
            t_last = time.perf_counter()
    except StopIteration:
        pass
    except PipelineTaskError as err:
        out.update(error=type(err).__name__, task=err.task, iteration=err.iteration, message=str(err),
                   cause=type(err.__cause__).__name__)
    except BaseException as err:  # recorded for the parent's assertion, not swallowed silently
        out.update(error=type(err).__name__, message=str(err))
    out["seconds"] = time.perf_counter() - t_last
    pipe.close()
    out["threads_after"] = [t.name for t in threading.enumerate() if t.name.startswith("swpipe-")]
    return out


def scenario_order(rank: int, events: Dict[str, Any], iters: int = ORDER_ITERS, ordered: bool = True) -> Dict[str, Any]:
    log: List[Any] = []
    bad: List[Any] = []
    pipe = _pipe(rank, log, bad, ordered=ordered)
    t0 = time.perf_counter()
    retired = _drive(pipe, range(iters))
    pipe.close()
    return {"sequence": log, "mispaired": bad, "retired": len(retired), "seconds": time.perf_counter() - t0}


def scenario_uneven(rank: int, events: Dict[str, Any]) -> Dict[str, Any]:
    from swpipe_core.distributed import agree_on_end

    log: List[Any] = []
    bad: List[Any] = []
    pipe = _pipe(rank, log, bad)
    data = agree_on_end(range(UNEVEN[rank]), timeout=timedelta(seconds=GLOO_TIMEOUT_S))
    retired = _drive(pipe, data)
    pipe.close()
    return {"retired": retired, "mispaired": bad, "leftover": list(data.leftover), "rest": list(data.rest()),
            "ended_ranks": list(data.ended_ranks), "batches": data.batches}


def _wait_or_signal(rank: int, waiter: int, event: Any, out: Dict[str, Any]) -> None:
    """Rank ``waiter`` stays alive (no collective, no exit) until the other rank has failed: that rank
    cannot rely on a closed connection, only on timeouts."""
    if rank == waiter:
        out["peer_failed_in_time"] = event.wait(SESSION_DEADLINE_S / 2)
    else:
        event.set()


def scenario_fail(rank: int, events: Dict[str, Any]) -> Dict[str, Any]:
    """Rank FAIL_RANK raises in SyncA at FAIL_ITER; the other rank blocks in that all_reduce."""
    pipe = _pipe(rank, [], [], fail_at=FAIL_ITER if rank == FAIL_RANK else None)
    out = _drive_until_error(pipe, range(10 * FAIL_ITER))
    _wait_or_signal(rank, FAIL_RANK, events["fail"], out)
    return out


def scenario_uneven_raw(rank: int, events: Dict[str, Any]) -> Dict[str, Any]:
    """Uneven data without agree_on_end: the hang of hand-written pipelines, turned into an error."""
    pipe = _pipe(rank, [], [])
    out = _drive_until_error(pipe, range(UNEVEN[rank]))
    short = min(UNEVEN, key=UNEVEN.get)
    _wait_or_signal(rank, short, events["uneven_raw"], out)
    return out


SCENARIOS: Dict[str, Callable[..., Dict[str, Any]]] = {
    "order": scenario_order,
    "order_unordered": lambda rank, events: scenario_order(rank, events, iters=200, ordered=False),
    "uneven": scenario_uneven,
    "fail": scenario_fail,
    "uneven_raw": scenario_uneven_raw,
}


def _rank_main(rank: int, store_path: str, out_dir: str, world: int, scenarios: List[str],
               events: Dict[str, Any]) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    results: Dict[str, Any] = {}
    path = os.path.join(out_dir, f"rank{rank}.json")
    try:
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=GLOO_TIMEOUT_S))
        for name in scenarios:
            results[name] = SCENARIOS[name](rank, events)
            with open(path, "w") as fh:  # after each scenario: partial results survive a crash
                json.dump(results, fh)
        dist.destroy_process_group()
    except BaseException:
        results["crash"] = traceback.format_exc()
        with open(path, "w") as fh:
            json.dump(results, fh)
        raise


# ----------------------------------------------------------------------------- parent side

def run_ranks(scenarios: List[str], world: int = WORLD, deadline_s: float = SESSION_DEADLINE_S) -> Dict[str, Any]:
    """Spawn ``world`` ranks running ``scenarios`` in order; return per-rank results and exit facts.

    Children that outlive ``deadline_s`` are killed and reported in ``killed``.
    """
    ctx = mp.get_context("spawn")
    events = {"fail": ctx.Event(), "uneven_raw": ctx.Event()}
    t0 = time.perf_counter()
    session = spawned_ranks(_rank_main, world, scenarios, events, world=world, deadline_s=deadline_s)
    return {**session, "seconds": time.perf_counter() - t0}


@pytest.fixture(scope="module")
def session():
    return run_ranks(["order", "uneven", "fail", "uneven_raw"])


def _no_crash(session):
    assert session["killed"] == [], f"ranks did not exit by themselves: {session['killed']}"
    for r, res in enumerate(session["ranks"]):
        assert "crash" not in res, f"rank {r} crashed:\n{res['crash']}"
    assert session["exitcodes"] == [0] * WORLD


pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(SESSION_DEADLINE_S) + 120)]


def test_globally_ordered_collectives_have_identical_sequence_on_every_rank(session):
    _no_crash(session)
    a, b = (session["ranks"][r]["order"] for r in range(WORLD))
    assert a["retired"] == b["retired"] == ORDER_ITERS
    assert len(a["sequence"]) == 2 * ORDER_ITERS
    assert a["sequence"] == b["sequence"]
    # the order is the enqueue order: SyncA(i) then SyncB(i), iteration after iteration
    assert a["sequence"] == [[n, i] for i in range(ORDER_ITERS) for n in ("SyncA", "SyncB")]
    assert a["mispaired"] == [] and b["mispaired"] == []


def test_uneven_data_stops_every_rank_at_the_same_iteration_and_keeps_the_extra_batches(session):
    _no_crash(session)
    r0, r1 = (session["ranks"][r]["uneven"] for r in range(WORLD))
    shortest = min(UNEVEN.values())
    assert r0["retired"] == r1["retired"] == list(range(shortest))
    assert r0["batches"] == r1["batches"] == shortest
    assert r0["ended_ranks"] == r1["ended_ranks"] == [1]
    # rank 0 had more: the batch it had already taken is kept, and rest() gives back everything not trained
    assert r0["leftover"] == [shortest] and r0["rest"] == list(range(shortest, UNEVEN[0]))
    assert r1["leftover"] == [] and r1["rest"] == []
    assert r0["mispaired"] == [] and r1["mispaired"] == []


def test_a_failing_rank_makes_the_peer_fail_in_that_collective_and_every_process_exits(session):
    _no_crash(session)
    failer, peer = session["ranks"][FAIL_RANK]["fail"], session["ranks"][1 - FAIL_RANK]["fail"]
    assert (failer["error"], failer["task"], failer["iteration"]) == ("PipelineTaskError", "SyncA", FAIL_ITER)
    assert f"injected-failure rank={FAIL_RANK} task=SyncA iteration={FAIL_ITER}" in failer["message"]
    # the peer blocks in SyncA(FAIL_ITER)'s all_reduce until gloo's timeout, then fails naming it (not a wait of
    # the engine's, whose timeouts are longer: that would name another task); how long it took is a figure
    # of benchmarks/reliability.py
    assert (peer["error"], peer["task"], peer["iteration"]) == ("PipelineTaskError", "SyncA", FAIL_ITER)
    assert failer["peer_failed_in_time"] is True
    assert failer["threads_after"] == [] and peer["threads_after"] == []


def test_uneven_data_without_agreement_fails_the_longer_rank_in_its_collective_instead_of_hanging(session):
    """The field's hang, without agree_on_end: rank 0 waits in iteration 9's all_reduce for a rank that has
    finished; gloo's timeout turns it into a PipelineTaskError naming the collective and the iteration."""
    _no_crash(session)
    short = min(UNEVEN, key=UNEVEN.get)
    longer = 1 - short
    s, lng = session["ranks"][short]["uneven_raw"], session["ranks"][longer]["uneven_raw"]
    n = UNEVEN[short]
    assert s["error"] is None and s["retired"] == list(range(n))
    assert lng["error"] == "PipelineTaskError" and lng["task"] == "SyncA" and lng["iteration"] == n
    assert lng["retired"] == list(range(n - 1)) or lng["retired"] == list(range(n))
    assert s["peer_failed_in_time"] is True and lng["threads_after"] == [] and s["threads_after"] == []
