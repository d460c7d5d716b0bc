"""TorchRec's pipelines next to our equivalent plans, driving the same TorchRec model, in one run.

    pip install -e ".[peer]"   # plus torch==2.13.0, fbgemm-gpu-cpu==1.8.0, torchrec==1.9.2 with --no-deps
    python benchmarks/vs_torchrec.py                 # 60 steps, 15 paired rounds (about 2 minutes)

Model: TorchRec's ``DLRMTrain(DLRM(EmbeddingBagCollection))`` under
``DistributedModelParallel`` (gloo, world size 1, table-wise sharding, fused
SGD on the tables, SGD on the dense part), sized like our demo workload, on
our synthetic batches. For each pair (TorchRec ``TrainPipelineBase`` /
``TrainPipelineSparseDist`` / ``TrainPipelineSparseDistLite`` and our
``base`` / ``sparse_dist`` / ``sparse_dist_lite`` plan) a fresh model with the
same initial weights is trained on the same batches; per-step logits are
compared with ``torch.testing.assert_close`` (as TorchRec's own
``test_equal_to_non_pipelined`` does) and also bit for bit, and the
throughput ratio is printed.

Estimator: runs are interleaved in rounds, and within a round each TorchRec
pipeline and our matching plans run back to back, in an order rotated every
round. A round gives one paired ratio ``TorchRec's time / our time`` per plan;
the printed ratio is the median over the rounds, with the middle half of the
rounds' ratios beside it. Pairing cancels the slow drift of a shared or
frequency-scaled machine that a ratio of two separately taken minima carries
(best-of-N rates are printed too). Each runner runs once untimed first.

Drop-in rows (``--rows all`` or ``--rows dropin``): ``swpipe.torchrec.TrainPipeline``,
TorchRec's interface on swpipe's engine, with each plan name next to TorchRec's
class of that name (``TrainPipelineSparseDistT`` too), and ``drop-in auto``: the
plan ``plan="auto"`` chose (measured, searched and verified once on the first
batches, before the warm-up; the time that took is printed, not in the rows),
trained from fresh weights in every round and paired with the TorchRec class
whose median is best, round by round (and, last line, against each class). The
verification's own figures are printed first: each candidate's period over
TorchRec's base plan's in the same round, the median and the middle half.

``+by_stream`` runs each stream's tasks on its own thread; the caller's
thread runs the default stream's. By default its side tasks are handed off
first in each period, beside the caller's forward pass. The rows
``+by_stream, after Forward`` hand them off after the forward pass
(:func:`swpipe_core.order.hand_off_after`; ``--hand-off-after ''`` leaves
those rows out): on a CPU host their Python then runs beside the backward
pass, which holds no interpreter lock.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import warnings

import torch

from swpipe.commands._args import add_keep_freed_memory, apply_keep_freed_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=15, help="rounds (each gives one paired ratio per plan)")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", choices=("all", "dropin"), default="all",
                        help="dropin: only the plain loop, TorchRec's classes and the drop-in's rows")
    parser.add_argument("--auto-time-limit", type=float, default=6.0, help="plan='auto': the search's budget (s)")
    parser.add_argument("--hand-off-after", default="Forward", metavar="TASK",
                        help="also run each +by_stream plan with its side threads' tasks handed off after this task "
                             "of the caller's thread ('' for none)")
    add_keep_freed_memory(parser)
    args = parser.parse_args()
    print(apply_keep_freed_memory(args))

    try:
        import swpipe.torchrec  # noqa: F401 - its error says how to install TorchRec and FBGEMM
    except ImportError as exc:
        raise SystemExit(str(exc)) from None
    from swpipe.workloads.torchrec_peer import PEERS, build_model, run_plain, run_swpipe, run_torchrec

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)

    from swpipe.workloads.dlrm import DLRMConfig, init_distributed
    from swpipe.workloads.torchrec_peer import to_torchrec_batches

    env = init_distributed()
    config = DLRMConfig.preset("demo", batch_size=args.batch_size)
    batches = to_torchrec_batches(config, args.iters)
    runners = {"plain loop": lambda: run_plain(build_model(config), batches)}
    groups = [["plain loop"]]  # each TorchRec pipeline with our plans for it: the runs one round pairs
    peer_of = {}
    dropin = _dropin_runners(config, batches, args.auto_time_limit)
    classes = dict(PEERS, sparse_dist_t="TrainPipelineSparseDistT")
    for name, cls in classes.items():
        if name in PEERS:
            runners[f"TorchRec {cls}"] = lambda name=name: run_torchrec(name, build_model(config), batches)
        else:
            runners[f"TorchRec {cls}"] = lambda cls=cls: _run_torchrec_class(cls, build_model(config), batches)
        if args.rows == "all" and name in PEERS:
            runners[f"swpipe {name}"] = lambda name=name: run_swpipe(name, build_model(config), batches)
            runners[f"swpipe {name}+by_stream"] = lambda name=name: run_swpipe(name, build_model(config), batches,
                                                                               "by_stream")
            if args.hand_off_after:
                runners[f"swpipe {name}+by_stream, after {args.hand_off_after}"] = (
                    lambda name=name: run_swpipe(name, build_model(config), batches, "by_stream",
                                                 args.hand_off_after))
        runners[f"drop-in {name}"] = dropin[name]
        groups.append([k for k in runners if k not in peer_of and k != "plain loop"])
        peer_of.update((k, f"TorchRec {cls}") for k in groups[-1])
    runners["drop-in auto"] = dropin["auto"]
    groups.append(["drop-in auto"])
    from autosched.verify.measure import turned  # the same turned order as the verification's rounds

    for fn in runners.values():  # warm-up: first-call costs, allocator, lazy init
        fn()
    times = {k: [] for k in runners}
    outputs = {}
    for r in range(args.repeats):
        for group in groups:
            for label in turned(group, r):
                logits, seconds = runners[label]()
                times[label].append(seconds)
                outputs[label] = logits
    env.close()

    ref = outputs["plain loop"]
    torchrec_rows = [k for k in runners if k.startswith("TorchRec ")]
    best = min(torchrec_rows, key=lambda k: statistics.median(times[k]))
    peer_of["drop-in auto"] = best
    choice = dropin["choice"]
    print(f"TorchRec peer comparison: {os.cpu_count()} CPU(s), torch {torch.__version__}, gloo world size 1, "
          f"batch {args.batch_size}, {args.iters} steps, {args.repeats} interleaved rounds (order rotated), "
          f"{args.threads} intra-op thread(s), load average {os.getloadavg()[0]:.2f} at the end")
    print(f"drop-in auto: plan='auto' chose {choice.label} ({choice.verdict}) in {choice.seconds:.1f} s before the "
          f"warm-up; its row is paired with the TorchRec class of best median, {best}")
    print("  its verification, each candidate's period over base's in the same round (median [middle half]):")
    for row in choice.table.rows:
        pair = choice.table.paired(row.label)
        print(f"    {row.label:44s} {pair if pair is not None and row.label != choice.table.baseline else 'baseline'}")
    print(f"{'run':50s} {'best iter/s':>11s} {'vs TorchRec':>11s} {'middle half':>13s}  logits == plain loop")
    for label in runners:
        rate = args.iters / min(times[label])
        ratio, spread = "", ""
        if label.startswith(("swpipe", "drop-in")):
            peer = times[peer_of[label]]
            assert len(peer) == len(times[label]) == args.repeats  # one run of each per round: paired
            paired = sorted(p / o for p, o in zip(peer, times[label]))
            q = statistics.quantiles(paired, n=4) if len(paired) > 1 else [paired[0]] * 3
            ratio, spread = f"{statistics.median(paired):.3f}x", f"{q[0]:.2f}-{q[2]:.2f}"
        close = all(torch.allclose(a, b, rtol=1.3e-6, atol=1e-5) for a, b in zip(outputs[label], ref))
        exact = all(torch.equal(a, b) for a, b in zip(outputs[label], ref))
        for a, b in zip(outputs[label], ref):
            torch.testing.assert_close(a, b)
        print(f"{label:50s} {rate:11.1f} {ratio:>11s} {spread:>13s}  "
              f"{'bit-identical' if exact else ('close' if close else 'DIFFERENT')}")
    paired = {k: statistics.median(p / o for p, o in zip(times[k], times["drop-in auto"])) for k in torchrec_rows}
    print("drop-in auto against each TorchRec class (median of paired rounds): "
          + ", ".join(f"{k[len('TorchRec '):]} {v:.3f}x" for k, v in paired.items()))
    worst = min(paired, key=paired.get)
    print(f"drop-in auto against the TorchRec class it ran slowest against ({worst[len('TorchRec '):]}): "
          f"{paired[worst]:.3f}x")


def _run_torchrec_class(cls_name, peer, batches):
    """A TorchRec pipeline class of ``train_pipelines`` or ``experimental_pipelines`` on ``peer``; (logits, seconds)."""
    import time

    from torchrec.distributed.train_pipeline import experimental_pipelines, train_pipelines

    cls = getattr(train_pipelines, cls_name, None) or getattr(experimental_pipelines, cls_name)
    pipeline = cls(peer.model, peer.optimizer, peer.device)
    it = iter(batches)
    logits = []
    t0 = time.perf_counter()
    while True:
        try:
            _, out_logits, _ = pipeline.progress(it)
        except StopIteration:
            break
        logits.append(out_logits)
    return logits, time.perf_counter() - t0


def _dropin_runners(config, batches, auto_time_limit):
    """``{plan name: runner}`` of ``swpipe.torchrec.TrainPipeline`` on fresh models, ``"auto"``, and ``"choice"``.

    ``plan="auto"`` chooses once here, on a model of its own (the choice leaves that model as it was, then trains
    it); the ``"auto"`` runner trains fresh models with the chosen plan.
    """
    import time

    from swpipe import SolverOptions
    from swpipe.torchrec import TORCHREC_CLASSES, TrainPipeline
    from swpipe.workloads.torchrec_peer import build_model

    def run(plan, **options):
        peer = build_model(config)
        logits = []
        with TrainPipeline(peer.model, peer.optimizer, peer.device, plan=plan, **options) as pipeline:
            it = iter(batches)
            t0 = time.perf_counter()
            while True:
                try:
                    _, out_logits, _ = pipeline.progress(it)
                except StopIteration:
                    break
                logits.append(out_logits)
            seconds = time.perf_counter() - t0
        return logits, seconds, pipeline

    _, _, chooser = run("auto", solver=SolverOptions(time_limit_s=auto_time_limit))
    runners = {name: (lambda name=name: run(name)[:2]) for name in TORCHREC_CLASSES}
    runners["auto"] = lambda: run(chooser.choice.plan)[:2]
    runners["choice"] = chooser.choice
    return runners


if __name__ == "__main__":
    main()
