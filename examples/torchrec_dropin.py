"""Switch a TorchRec training loop from TorchRec's pipeline to swpipe's in one line.

    bash scripts/install_peer.sh && pip install -e ".[peer]"         # TorchRec (CPU build) and its needs
    python examples/torchrec_dropin.py                               # plan "sparse_dist"
    python examples/torchrec_dropin.py --plan auto                   # measured, searched, verified on the first batches
    torchrun --nproc-per-node 2 examples/torchrec_dropin.py          # 2 ranks, tables sharded over them

TorchRec's own test model (``TestSparseNN``: unweighted and weighted tables,
``DistributedModelParallel``, fused SGD on the tables) trains on
``ModelInput.generate`` batches, evaluates a few, trains again: once with
TorchRec's ``TrainPipelineSparseDist`` (eval through ``model.eval()`` works in
TorchRec only for models that return ``(loss, output)`` in eval, so its run
trains only) and once with ``swpipe.torchrec.TrainPipeline``, whose outputs are
checked against TorchRec's and against the non-pipelined loop.
"""

import argparse
import logging
import os
import warnings

import torch
import torch.distributed as dist


def init_process_group() -> torch.device:
    """Join torchrun's job (its ``env://`` variables), or make a one-rank gloo group; the device this rank trains on."""
    cuda = torch.cuda.is_available()
    if "RANK" in os.environ:  # launched by torchrun
        dist.init_process_group("nccl" if cuda else "gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")


def run(pipeline, model, batches, modes):
    """TorchRec's loop: progress() until StopIteration, ``model.train(mode)`` before each batch."""
    it = iter(batches)
    outputs = []
    while True:
        if len(outputs) < len(modes):
            model.train(modes[len(outputs)])
        try:
            outputs.append(pipeline.progress(it))
        except StopIteration:
            return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", default="sparse_dist", help="a plan name of swpipe.torchrec.TORCHREC_CLASSES, or auto")
    parser.add_argument("--batches", type=int, default=12)
    args = parser.parse_args()
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)

    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    from swpipe import Constraints, SolverOptions, VerifyOptions
    from swpipe.torchrec import TrainPipeline, models
    from swpipe.torchrec.tasks import split_output

    device = init_process_group()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # plan="auto" takes swpipe's three option classes: what the plan may be, how the search runs, how it is measured
    options = dict(constraints=Constraints(max_depth=3), solver=SolverOptions(time_limit_s=4.0),
                   verify=VerifyOptions(rounds=3)) if args.plan == "auto" else {}
    try:
        config = models.SparseNNConfig()
        batches = models.sparse_nn_batches(config, args.batches, world_size, rank)
        modes = [True] * (args.batches // 2) + [False] * 2 + [True] * (args.batches - args.batches // 2 - 2)

        model, optimizer = models.sparse_nn(config, device)
        torchrec_out = run(TrainPipelineSparseDist(model, optimizer, device), model, batches,
                           [True] * len(batches))

        model, optimizer = models.sparse_nn(config, device)
        # the one line that changes: TrainPipelineSparseDist(model, optimizer, device) -> TrainPipeline(...)
        with TrainPipeline(model, optimizer, device, plan=args.plan, **options) as pipeline:
            swpipe_train = run(pipeline, model, batches, [True] * len(batches))
        same_as_torchrec = all(torch.equal(a, b) for a, b in zip(swpipe_train, torchrec_out)) and \
            len(swpipe_train) == len(torchrec_out)

        model, optimizer = models.sparse_nn(config, device)
        with TrainPipeline(model, optimizer, device, plan=args.plan, **options) as pipeline:
            mixed = run(pipeline, model, batches, modes)  # train, then eval (forward only), then train again
        model, optimizer = models.sparse_nn(config, device)
        loop = []
        for batch, train in zip(batches, modes):  # the non-pipelined loop doing the same
            model.train(train)
            if train:
                optimizer.zero_grad()
                loss, pred = model(batch)
                loss.backward()
                optimizer.step()
            else:
                with torch.no_grad():
                    pred = split_output(model(batch))
            loop.append(pred)
        same_as_loop = len(mixed) == len(loop) and all(torch.equal(a, b) for a, b in zip(mixed, loop))
        if rank == 0:
            print(pipeline.report)
            print(f"{world_size} rank(s), {len(batches)} batches: outputs equal to TorchRec's "
                  f"TrainPipelineSparseDist: {same_as_torchrec}")
            print(f"train/eval/train ({''.join('T' if m else 'E' for m in modes)}): outputs equal to the "
                  f"non-pipelined loop: {same_as_loop}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
