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
import warnings

import torch

from swpipe.workloads import init_distributed


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

    from swpipe.torchrec import TrainPipeline, models
    from swpipe.torchrec.tasks import split_output

    with init_distributed() as env:  # joins torchrun's job, or a one-rank gloo group
        config = models.SparseNNConfig()
        batches = models.sparse_nn_batches(config, args.batches, env.world_size, env.rank)
        modes = [True] * (args.batches // 2) + [False] * 2 + [True] * (args.batches - args.batches // 2 - 2)

        model, optimizer = models.sparse_nn(config, env.device)
        torchrec_out = run(TrainPipelineSparseDist(model, optimizer, env.device), model, batches,
                           [True] * len(batches))

        model, optimizer = models.sparse_nn(config, env.device)
        # the one line that changes: TrainPipelineSparseDist(model, optimizer, device) -> TrainPipeline(...)
        with TrainPipeline(model, optimizer, env.device, plan=args.plan) as pipeline:
            swpipe_train = run(pipeline, model, batches, [True] * len(batches))
        same_as_torchrec = all(torch.equal(a, b) for a, b in zip(swpipe_train, torchrec_out)) and \
            len(swpipe_train) == len(torchrec_out)

        model, optimizer = models.sparse_nn(config, env.device)
        with TrainPipeline(model, optimizer, env.device, plan=args.plan) as pipeline:
            mixed = run(pipeline, model, batches, modes)  # train, then eval (forward only), then train again
        model, optimizer = models.sparse_nn(config, env.device)
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
        if env.rank == 0:
            print(pipeline.report)
            print(f"{env.world_size} rank(s), {len(batches)} batches: outputs equal to TorchRec's "
                  f"TrainPipelineSparseDist: {same_as_torchrec}")
            print(f"train/eval/train ({''.join('T' if m else 'E' for m in modes)}): outputs equal to the "
                  f"non-pipelined loop: {same_as_loop}")


if __name__ == "__main__":
    main()
