"""swpipe_core.measure.state: a run that trains, then restore_state, leaves every state_dict as it was."""

from __future__ import annotations

import pytest
import torch

from conftest import requires_torchrec
from swpipe_core.measure.state import restore_state, snapshot_state


def _equal(a, b, where=""):
    """Deep equality of state_dicts (tensors bit for bit, sharded tensors by their local shards)."""
    if callable(getattr(a, "local_shards", None)):
        _equal([s.tensor for s in a.local_shards()], [s.tensor for s in b.local_shards()], where)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        for k in a:
            _equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _clone(sd):
    if callable(getattr(sd, "local_shards", None)):
        return type("Shards", (), {"local_shards": lambda self, s=[type("S", (), {"tensor": x.tensor.clone()})()
                                                                    for x in sd.local_shards()]: s})()
    if isinstance(sd, torch.Tensor):
        return sd.detach().clone()
    if isinstance(sd, dict):
        return {k: _clone(v) for k, v in sd.items()}
    if isinstance(sd, (list, tuple)):
        return type(sd)(_clone(v) for v in sd)
    return sd


def _train(model, opts, steps=3, sched=None):
    for _ in range(steps):
        for o in opts:
            o.zero_grad()
        model(torch.randn(8, 4)).pow(2).sum().backward()
        for o in opts:
            o.step()
        if sched is not None:
            sched.step()


def test_state_dicts_grads_and_rng_are_identical_after_a_run_that_trains():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    sgd = torch.optim.SGD(model[0].parameters(), lr=0.1, momentum=0.9)
    adam = torch.optim.Adam(list(model[1].parameters()) + list(model[2].parameters()), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.5)
    _train(model, [sgd, adam], steps=2, sched=sched)  # some optimizer state and gradients exist already
    before = [_clone(x.state_dict()) for x in (model, sgd, adam, sched)]
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    state = [model, sgd, adam, sched]
    snap = snapshot_state(state)

    _train(model, [sgd, adam], steps=3, sched=sched)
    model[0].weight.grad = None
    assert not torch.equal(torch.get_rng_state(), rng)
    restore_state(state, snap)

    for x, sd in zip((model, sgd, adam, sched), before):
        _equal(x.state_dict(), sd, type(x).__name__)
    for p, g in zip(model.parameters(), grads):
        assert (p.grad is None and g is None) or torch.equal(p.grad, g)
    assert torch.equal(torch.get_rng_state(), rng)
    # the same steps again give the same result as a run that never measured anything
    ref = torch.randn(3)
    restore_state(state, snap)
    assert torch.equal(torch.randn(3), ref)


def test_state_created_after_the_snapshot_is_removed_and_replaced_tensors_come_back():
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    weight = model.weight
    snap = snapshot_state([model, opt], rng=False)
    _train(model, [opt])
    assert opt.state_dict()["state"] and model.weight.grad is not None
    model.weight = torch.nn.Parameter(torch.zeros(1, 4))  # a run that swaps a parameter
    opt.param_groups[0]["lr"] = 7.0
    restore_state([model, opt], snap)
    assert model.weight is weight and opt.state_dict()["state"] == {} and model.weight.grad is None
    assert opt.param_groups[0]["lr"] == 0.1


def test_a_different_state_is_an_error_naming_the_objects():
    snap = snapshot_state(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="Linear"):  # the object that is not the one snapshotted
        restore_state([torch.nn.Linear(2, 2)], snap)
    with pytest.raises(TypeError, match="int"):  # the type given
        snapshot_state([3])


@pytest.mark.peer
@requires_torchrec
def test_torchrec_sharded_model_and_fused_combined_optimizer_restored_exactly():
    """DMP with a fused Adagrad (state inside the embedding kernel) + dense Adam, combined."""
    import copy
    import logging
    import warnings

    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.test_utils.emb_sharder import TestEBCSharder
    from torchrec.distributed.test_utils.test_model import ModelInput, TestSparseNN
    from torchrec.distributed.types import ShardingEnv, ShardingType
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        tables = [EmbeddingBagConfig(num_embeddings=40, embedding_dim=4, name=f"t{i}", feature_names=[f"f{i}"])
                  for i in range(2)]
        torch.manual_seed(0)
        module = TestSparseNN(tables=tables, dense_device=torch.device("cpu"), sparse_device=torch.device("meta"))
        sharder = TestEBCSharder(ShardingType.TABLE_WISE.value, EmbeddingComputeKernel.FUSED.value,
                                 {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1})
        model = DistributedModelParallel(module=copy.deepcopy(module), device=torch.device("cpu"),
                                         env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
                                         sharders=[sharder])
        dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                      lambda p: torch.optim.Adam(p, lr=0.01))
        opt = CombinedOptimizer([model.fused_optimizer, dense])
        batches = [ModelInput.generate(batch_size=8, world_size=1, num_float_features=10, tables=tables,
                                       weighted_tables=[], random_seed=i)[0] for i in range(4)]

        def step(b):
            opt.zero_grad()
            loss, pred = model(b)
            loss.backward()
            opt.step()
            return pred

        step(batches[0])  # Adam and the fused Adagrad hold state now
        before_model, before_opt = _clone(model.state_dict()), _clone(opt.state_dict())
        snap = snapshot_state([model, opt])
        first = [step(b) for b in batches[1:]]
        restore_state([model, opt], snap)
        _equal(model.state_dict(), before_model, "model")
        _equal(opt.state_dict(), before_opt, "optimizer")
        again = [step(b) for b in batches[1:]]
        for a, b in zip(first, again):
            assert torch.equal(a, b)
    finally:
        if owns:
            dist.destroy_process_group()
