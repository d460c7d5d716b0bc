"""``order="torchrec"``: each factory reproduces TorchRec's CPU submission order, and it is a valid enqueue order."""

from __future__ import annotations

import networkx as nx
import pytest

from swpipe.cli import main
from swpipe_core import pipelines, validate
from swpipe_core.order import enqueue_order, period_local_graph
from swpipe_core.pipelines.orders import TORCHREC_ORDERS

# The sequences TorchRec's progress() issues (task [iteration]), written out here a second
# time from TorchRec's train_pipelines.py (semi_sync: the stage-descending order orders.py
# derives for it), so a typo in TORCHREC_ORDERS fails this test.
DOCUMENTED = {
    "base": "ZeroGrad[i] WaitBatch[i] Forward[i] H2D[i+1] Backward[i] OptimizerStep[i]",
    "pt2": "LoadBatch[i] H2D[i] InputTransform[i] ZeroGrad[i] Forward[i] Backward[i] OptimizerStep[i]",
    "sparse_dist": "ZeroGrad[i] WaitBatch[i] InputDistStart[i+1] H2D[i+2] Forward[i] InputDistWait[i+1] "
                   "Backward[i] OptimizerStep[i]",
    "sparse_dist_lite": "ZeroGrad[i] WaitBatch[i] InputDistStart[i] InputDistWait[i] Forward[i] Backward[i] "
                        "H2D[i+1] OptimizerStep[i]",
    "fused_sparse_dist": "EmbLookup[i] ZeroGrad[i] WaitBatch[i] InputDistStart[i+1] H2D[i+2] Forward[i] "
                         "InputDistWait[i+1] Backward[i] OptimizerStep[i]",
    "semi_sync": "ZeroGrad[i] Forward[i] Backward[i] EmbBackward[i] OptimizerStep[i] EmbLookup[i+1] "
                 "InputDistStart[i+2] InputDistWait[i+2] H2D[i+3]",
    "prefetch": "ZeroGrad[i] WaitBatch[i] H2D[i+2] InputDistWait[i+1] Forward[i] EmbPrefetch[i+1] Backward[i] "
                "OptimizerStep[i] InputDistStart[i+2]",
    "eval_fused_sparse_dist": "EmbLookup[i] WaitBatch[i] InputDistStart[i+1] H2D[i+2] Forward[i] InputDistWait[i+1]",
    "sparse_dist_comp_autograd": "ZeroGrad[i] WaitBatch[i] InputDistStart[i+1] H2D[i+2] Forward[i] "
                                "InputDistWait[i+1] Backward[i] OptimizerStep[i]",
    "sparse_dist_t": "ZeroGrad[i] WaitBatch[i] InputDistStart[i+1] H2D[i+2] Forward[i] InputDistWait[i+1] "
                     "Backward[i] OptimizerStep[i]",
}


def _parse(text):
    """``"H2D[i+2] ..."`` -> ``[("H2D", 2), ...]``."""
    out = []
    for item in text.split():
        name, _, rest = item.partition("[")
        offset = rest.rstrip("]")[1:]
        out.append((name, int(offset) if offset else 0))
    return out


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_torchrec_order_matches_the_documented_sequence(name):
    plan = pipelines.get(name, order="torchrec")
    documented = _parse(DOCUMENTED[name])
    assert enqueue_order(plan) == [task for task, _ in documented]
    # TorchRec's batch i+k is the iteration the plan's stage puts there: stage = last stage - k
    last = plan.pipeline_depth - 1
    assert [(t, last - plan.stage(t)) for t, _ in documented] == documented


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_torchrec_order_is_a_topological_order_of_the_period_local_graph(name):
    plan = pipelines.get(name, order="torchrec")
    validate(plan)  # the enqueue-order rule
    order = enqueue_order(plan)
    position = {t: k for k, t in enumerate(order)}
    graph = period_local_graph(plan)
    assert sorted(order) == sorted(graph.nodes)
    assert all(position[d] < position[t] for d, t in graph.edges), "a task is enqueued before a same-period dependency"
    assert nx.is_directed_acyclic_graph(graph)


def test_every_pipeline_has_a_torchrec_order_or_says_why_not():
    assert set(TORCHREC_ORDERS) == set(DOCUMENTED)
    for name in sorted(set(pipelines.PIPELINES) - set(DOCUMENTED)):
        with pytest.raises(ValueError, match=rf"'{name}'.*order="):  # the pipeline, then the orders it has
            pipelines.get(name, order="torchrec")


def test_policy_orders_and_a_bad_order_name():
    assert pipelines.get("sparse_dist").enqueue_order is None
    assert pipelines.get("sparse_dist", order="stage_descending").enqueue_policy == "stage_descending"
    with pytest.raises(ValueError, match=r"order='torch'.*\['torchrec', 'ready_first', 'stage_descending'\]"):
        pipelines.get("sparse_dist", order="torch")


def test_torchrec_order_keeps_the_fused_lookup_stream_option():
    plan = pipelines.get("fused_sparse_dist", emb_lookup="data_dist", order="torchrec")
    assert plan.stream_of("EmbLookup") == "data_dist" and enqueue_order(plan)[0] == "EmbLookup"


def test_show_says_which_order_it_prints(capsys):
    assert main(["show", "prefetch", "--order", "torchrec"]) == 0
    header, analysis = _enqueue_orders(capsys.readouterr().out)
    assert "TorchRec's" in header[0] and header[1] == ["ZeroGrad", "WaitBatch", "H2D", "InputDistWait", "Forward",
                                                        "EmbPrefetch", "Backward", "OptimizerStep", "InputDistStart"]
    assert "(explicit)" in analysis[0] and analysis[1] == header[1]  # the stage analysis is of that order
    assert main(["show", "prefetch"]) == 0
    header, analysis = _enqueue_orders(capsys.readouterr().out)
    assert "ready_first" in header[0] and "(ready_first)" in analysis[0]
    assert main(["show", "staged", "--order", "torchrec"]) == 2
    assert "'staged'" in capsys.readouterr().err


def _enqueue_orders(out: str) -> list:
    """The ``(label, [task, ...])`` of each printed enqueue order line: the header's, then the stage analysis's."""
    return [(line.rsplit(": ", 1)[0], line.rsplit(": ", 1)[1].split(" (")[0].split(", ")) for line in out.splitlines()
            if line.lower().split()[:2] == ["enqueue", "order:"] or line.startswith("Enqueue order (")]
