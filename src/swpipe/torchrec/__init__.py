"""swpipe for TorchRec users: ``TrainPipeline(model, optimizer, device, plan=...)``, TorchRec's interface.

Switch from TorchRec's pipeline in one line::

    from swpipe.torchrec import TrainPipeline
    pipeline = TrainPipeline(model, optimizer, device, plan="sparse_dist")   # or "auto", or a PipelinePlan

``plan="auto"`` takes swpipe's three option classes as they are: ``constraints=Constraints(...)`` (what the plan
may be), ``solver=SolverOptions(...)`` (how the search runs), ``verify=VerifyOptions(...)`` (how its answer is
measured). ``replan=True`` (or ``replan=ReplanOptions(...)``) re-plans while training runs.

======================  =============================================================
module                  holds
======================  =============================================================
``pipeline``            :class:`TrainPipeline`: ``progress(dataloader_iter)`` on swpipe's engine
``tasks``               the task functions over a TorchRec model (train and eval per batch)
``plans``               which plans run (TorchRec's class for each name), making one runnable
``auto``                ``plan="auto"``: measure, search, verify, restore the model
``replan``              ``replan=``: the plan re-planned on drift (``swpipe.replan.AdaptivePipeline``)
``models``              TorchRec's own test models and its DLRM, sharded, with batches for them
``_private``            the TorchRec internals used, behind a version check
======================  =============================================================

TorchRec is optional: importing this package without it raises a
``ModuleNotFoundError`` (an ``ImportError``) that says how to install it, so
``pytest.importorskip("swpipe.torchrec")`` skips under every pytest version.
"""

from __future__ import annotations

try:
    import fbgemm_gpu  # noqa: F401
    import torchrec  # noqa: F401
    from torchrec.distributed.train_pipeline import train_pipelines  # noqa: F401
except Exception as _exc:  # noqa: BLE001 - missing, or a build that does not load (ABI): not usable either way
    raise ModuleNotFoundError(
        "swpipe.torchrec needs TorchRec and FBGEMM, which swpipe does not install by default (a plain dependency "
        "would pull a CUDA build of torch). Install them with `bash scripts/install_peer.sh` (fbgemm-gpu-cpu==1.8.0 "
        "and torchrec==1.9.2, --no-deps) and their pure-Python needs with `pip install -e \".[peer]\"`; "
        f"the import failed with: {type(_exc).__name__}: {_exc}", name="torchrec") from _exc

from swpipe.torchrec.auto import AutoChoice  # noqa: E402
from swpipe.torchrec.pipeline import TrainPipeline  # noqa: E402
from swpipe.torchrec.plans import TORCHREC_CLASSES, UNSUPPORTED  # noqa: E402

__all__ = ["TrainPipeline", "AutoChoice", "TORCHREC_CLASSES", "UNSUPPORTED"]
