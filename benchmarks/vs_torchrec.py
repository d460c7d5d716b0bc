"""TorchRec's pipelines next to our equivalent plans, driving the same TorchRec model, in one run.

    pip install -e ".[peer]"   # plus torch==2.13.0, fbgemm-gpu-cpu==1.8.0, torchrec==1.9.2 with --no-deps
    python benchmarks/vs_torchrec.py --iters 40

Model: TorchRec's ``DLRMTrain(DLRM(EmbeddingBagCollection))`` under
``DistributedModelParallel`` (gloo, world size 1, table-wise sharding, fused
SGD on the tables, SGD on the dense part), sized like our demo workload, on
our synthetic batches. For each pair (TorchRec ``TrainPipelineBase`` /
``TrainPipelineSparseDist`` / ``TrainPipelineSparseDistLite`` and our
``base`` / ``sparse_dist`` / ``sparse_dist_lite`` plan) a fresh model with the
same initial weights is trained on the same batches; per-step logits are
compared with ``torch.testing.assert_close`` (as TorchRec's own
``test_equal_to_non_pipelined`` does) and also bit for bit, and the
throughput ratio is printed. Rounds are interleaved and the fastest counts.
"""

from __future__ import annotations

import argparse
import logging
import os
import warnings

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    from swpipe.workloads.torchrec_peer import PEERS, build_model, peer_available, run_plain, run_swpipe, run_torchrec

    if not peer_available():
        raise SystemExit("TorchRec is not importable here: install the [peer] extra (see the docstring)")
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)

    from swpipe.workloads.dlrm import DLRMConfig, init_distributed
    from swpipe.workloads.torchrec_peer import to_torchrec_batches

    env = init_distributed()
    config = DLRMConfig.preset("demo", batch_size=args.batch_size)
    batches = to_torchrec_batches(config, args.iters)
    runners = {"plain loop": lambda: run_plain(build_model(config), batches)}
    for name, cls in PEERS.items():
        runners[f"TorchRec {cls}"] = lambda name=name: run_torchrec(name, build_model(config), batches)
        runners[f"swpipe {name}"] = lambda name=name: run_swpipe(name, build_model(config), batches)
        runners[f"swpipe {name}+by_stream"] = lambda name=name: run_swpipe(name, build_model(config), batches,
                                                                           "by_stream")
    best = {k: float("inf") for k in runners}
    outputs = {}
    for _ in range(args.repeats):
        for label, fn in runners.items():
            logits, seconds = fn()
            best[label] = min(best[label], seconds)
            outputs[label] = logits
    env.close()

    ref = outputs["plain loop"]
    print(f"TorchRec peer comparison: {os.cpu_count()} CPU(s), torch {torch.__version__}, gloo world size 1, "
          f"batch {args.batch_size}, {args.iters} steps, best of {args.repeats} interleaved rounds, "
          f"{args.threads} intra-op thread(s)")
    print(f"{'run':40s} {'iter/s':>8s} {'vs TorchRec':>12s}  logits == plain loop")
    for label in runners:
        rate = args.iters / best[label]
        peer = None
        if label.startswith("swpipe"):
            name = label.split()[1].split("+")[0]
            peer = args.iters / best[f"TorchRec {PEERS[name]}"]
        close = all(torch.allclose(a, b, rtol=1.3e-6, atol=1e-5) for a, b in zip(outputs[label], ref))
        exact = all(torch.equal(a, b) for a, b in zip(outputs[label], ref))
        for a, b in zip(outputs[label], ref):
            torch.testing.assert_close(a, b)
        ratio = f"{rate / peer:.2f}x" if peer else ""
        print(f"{label:40s} {rate:8.1f} {ratio:>12s}  {'bit-identical' if exact else ('close' if close else 'DIFFERENT')}")


if __name__ == "__main__":
    main()
