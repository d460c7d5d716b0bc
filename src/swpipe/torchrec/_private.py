"""Every TorchRec internal :mod:`swpipe.torchrec` touches, in this one module, behind a version check.

TorchRec has no public API for what its pipelines do between the calls of
``progress()``: rewrite the sharded modules' forward into a pipelined one,
point those forwards at a batch's context, start a module's embedding
lookup. :class:`Toolbox` wraps a TorchRec pipeline object of the class a plan
stands for and uses its machinery only: the FX rewrite
(``_pipeline_model``), ``_set_module_context``, and
``utils._start_embedding_lookup``. Its public methods are used as they are:
``start_sparse_data_dist``, ``wait_sparse_data_dist``, ``embedding_backward``.

Streams are swpipe's: the toolbox's own memcpy / data-dist / lookup streams
are set to ``None`` (so TorchRec's stream contexts and waits do nothing) and
each task runs on the stream its plan names, the engine ordering the streams
with events. On a CPU device the embedding-pipelined forwards (fused, semi-sync) ask CPU
for the current stream and record none (TorchRec's ask CUDA, and record one
unconditionally, which CPU tensors do not support):
``_cpu_forward_type``.

:func:`check_torchrec` runs once on first use: TorchRec versions tested here
(:data:`TESTED`) pass; another version passes when every internal named in
:data:`NEEDED` is there (with a warning, once), and otherwise fails with an
error naming the missing internal and how to install a tested version.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

__all__ = ["TESTED", "NEEDED", "TorchRecVersionError", "check_torchrec", "torchrec_version", "Toolbox",
           "TOOLBOX_CLASSES"]

#: TorchRec (major, minor) versions whose internals this module was written against and tested with
TESTED: Tuple[Tuple[int, int], ...] = ((1, 9),)

#: every private name used, as (module, attribute path)
NEEDED: Tuple[Tuple[str, str], ...] = (
    ("torchrec.distributed.train_pipeline.train_pipelines", "TrainPipelineSparseDist._pipeline_model"),
    ("torchrec.distributed.train_pipeline.train_pipelines", "TrainPipelineSparseDist._set_module_context"),
    ("torchrec.distributed.train_pipeline.train_pipelines", "TrainPipelineSparseDist._pipelined_forward_type"),
    ("torchrec.distributed.train_pipeline.train_pipelines", "TrainPipelineSparseDist.detach"),
    ("torchrec.distributed.train_pipeline.train_pipelines", "TrainPipelineSemiSync.embedding_backward"),
    ("torchrec.distributed.train_pipeline.utils", "_start_embedding_lookup"),
    ("torchrec.distributed.train_pipeline.runtime_forwards", "EmbeddingPipelinedForward.detach_embeddings"),
    ("torchrec.distributed.train_pipeline.runtime_forwards", "InSyncEmbeddingPipelinedForward"),
    ("torchrec.distributed.train_pipeline.pipeline_context", "EmbeddingTrainPipelineContext"),
)

#: attributes of a TorchRec pipeline object the toolbox reads or resets (checked on each one made)
_INSTANCE_ATTRIBUTES = ("_pipelined_modules", "_pipelined_postprocs", "_stream_context", "_model_attached",
                        "_data_dist_stream", "_memcpy_stream")

#: toolbox kind -> the TorchRec class whose machinery it uses
TOOLBOX_CLASSES: Dict[str, str] = {
    "sparse_dist": "TrainPipelineSparseDist",
    "fused": "TrainPipelineFusedSparseDist",
    "semi_sync": "TrainPipelineSemiSync",
}

_INSTALL = ("install a tested TorchRec with `bash scripts/install_peer.sh` (fbgemm-gpu-cpu==1.8.0, torchrec==1.9.2, "
            "--no-deps) and its pure-Python needs with `pip install -e \".[peer]\"`")


class TorchRecVersionError(RuntimeError):
    """The installed TorchRec lacks an internal :mod:`swpipe.torchrec` needs.

    ``version`` is the installed TorchRec's, ``missing`` the internals (modules' or classes' attributes) it lacks.
    """

    def __init__(self, message: str, version: str = "", missing: Sequence[str] = ()) -> None:
        self.version, self.missing = version, list(missing)
        super().__init__(message)


_checked: Optional[str] = None


def torchrec_version() -> str:
    """The installed TorchRec's version string (``"unknown"`` when it does not say).

    Examples
    --------
    >>> isinstance(torchrec_version(), str)
    True
    """
    import torchrec

    return str(getattr(torchrec, "__version__", "unknown"))


def _major_minor(version: str) -> Optional[Tuple[int, int]]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _resolve(module: str, path: str) -> Any:
    obj: Any = importlib.import_module(module)
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def check_torchrec() -> str:
    """Check once that the TorchRec internals in :data:`NEEDED` are there; return the version.

    Returns
    -------
    str
        TorchRec's version.

    Raises
    ------
    TorchRecVersionError
        An internal is missing (named, with the version found and the versions tested).

    Warns
    -----
    UserWarning
        Once, for a version outside :data:`TESTED` that has every internal.

    Examples
    --------
    >>> check_torchrec() == torchrec_version()
    True
    """
    global _checked
    if _checked is not None:
        return _checked
    version = torchrec_version()
    missing = []
    for module, path in NEEDED:
        try:
            _resolve(module, path)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{path}")
    tested = ", ".join(f"{a}.{b}.x" for a, b in TESTED)
    if missing:
        raise TorchRecVersionError(
            f"swpipe.torchrec uses TorchRec internals that torchrec {version} does not have: {', '.join(missing)} "
            f"(tested with torchrec {tested}); {_INSTALL}, or report the version so src/swpipe/torchrec/_private.py "
            "can follow it", version, missing)
    if _major_minor(version) not in TESTED:
        warnings.warn(f"swpipe.torchrec was tested with torchrec {tested}; torchrec {version} has every internal it "
                      "uses, but check the drop-in's outputs against TorchRec's own pipeline once "
                      "(tests/test_torchrec_dropin.py)", UserWarning, stacklevel=2)
    _checked = version
    return version


@functools.lru_cache(maxsize=None)
def _cpu_forward_type(base: type) -> type:
    """TorchRec's embedding-pipelined forward ``base`` on a CPU device: it asks CPU, not CUDA, for the current
    stream, and records none (CPU tensors have no streams; TorchRec records one unconditionally)."""

    class CpuForward(base):  # type: ignore[misc, valid-type]
        __doc__ = f"``{base.__name__}`` on a CPU device: no CUDA stream asked for, no stream recorded."

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if self._stream is None:
                self._device = torch.device("cpu")  # TorchRec defaults to CUDA's current stream

        def detach_embeddings(self, embeddings: Any, cur_stream: Any) -> None:
            if self._stream is None and hasattr(embeddings, "record_stream"):
                embeddings.record_stream = lambda stream: None  # this object only
                try:
                    super().detach_embeddings(embeddings, cur_stream)
                finally:
                    del embeddings.record_stream
            else:
                super().detach_embeddings(embeddings, cur_stream)

    CpuForward.__name__ = CpuForward.__qualname__ = f"Cpu{base.__name__}"
    return CpuForward


class Toolbox:
    """One TorchRec pipeline object's machinery: rewrite the model, contexts, input dist, embedding lookup.

    Parameters
    ----------
    kind : {"sparse_dist", "fused", "semi_sync"}
        Which TorchRec class's pipelined forward and context the tasks use
        (:data:`TOOLBOX_CLASSES`): ``PipelinedForward`` (lookup inside the
        forward), ``InSyncEmbeddingPipelinedForward`` (lookup as a task of its
        own) or ``EmbeddingPipelinedForward`` (semi-sync: detached embeddings,
        their own backward).
    model, optimizer : the user's
    device : torch.device

    Examples
    --------
    The tests drive it through :class:`swpipe.torchrec.TrainPipeline`; alone it needs a sharded model.
    """

    def __init__(self, kind: str, model: torch.nn.Module, optimizer: Any, device: torch.device) -> None:
        check_torchrec()
        from torchrec.distributed.train_pipeline import train_pipelines
        from torchrec.distributed.train_pipeline.pipeline_context import (EmbeddingTrainPipelineContext,
                                                                           TrainPipelineContext)

        if kind not in TOOLBOX_CLASSES:
            raise ValueError(f"toolbox kind {kind!r}; use one of {sorted(TOOLBOX_CLASSES)}")
        self.kind = kind
        cls = getattr(train_pipelines, TOOLBOX_CLASSES[kind])
        self.pipe = cls(model, optimizer, device)
        lacking = [a for a in _INSTANCE_ATTRIBUTES if not hasattr(self.pipe, a)]
        if lacking:
            raise TorchRecVersionError(f"swpipe.torchrec uses attributes {lacking} of TorchRec's {cls.__name__}, which "
                                       f"torchrec {torchrec_version()} does not set; {_INSTALL}", torchrec_version(),
                                       [f"{cls.__name__}.{a}" for a in lacking])
        # swpipe's streams: TorchRec's stream contexts and waits become no-ops, the engine orders the streams
        for attr in ("_memcpy_stream", "_data_dist_stream", "_emb_lookup_stream"):
            if hasattr(self.pipe, attr):
                setattr(self.pipe, attr, None)
        self._context_type = TrainPipelineContext if kind == "sparse_dist" else EmbeddingTrainPipelineContext
        self._forward_type = self.pipe._pipelined_forward_type
        if kind != "sparse_dist" and device.type == "cpu":
            self._forward_type = _cpu_forward_type(self._forward_type)

    @property
    def rewritten(self) -> bool:
        """Whether the model's sharded modules run TorchRec's pipelined forward now."""
        return bool(self.pipe._pipelined_modules)

    def new_context(self, index: int) -> Any:
        """A fresh per-batch context (TorchRec's ``version=1`` contexts)."""
        return self._context_type(index=index, version=1)

    def start_input_dist(self, batch: Any, context: Any) -> None:
        """Phase 1 of the input dist (the splits all-to-all); the first call rewrites the model first."""
        if not self.pipe._pipelined_modules:
            self.pipe._pipeline_model(batch, context, self._forward_type)  # rewrites, then starts the dist
        else:
            self.pipe.start_sparse_data_dist(batch, context)

    def wait_input_dist(self, context: Any) -> None:
        """Phase 2: wait the splits, start the values all-to-alls."""
        self.pipe.wait_sparse_data_dist(context)

    def set_context(self, context: Any) -> None:
        """Point the pipelined forwards (and post-processing modules) at this batch's context."""
        self.pipe._set_module_context(context)

    def start_embedding_lookup(self, context: Any) -> None:
        """Each pipelined module's lookup and output all-to-all, on the current stream."""
        from torchrec.distributed.train_pipeline.utils import _start_embedding_lookup

        for module in self.pipe._pipelined_modules:
            _start_embedding_lookup(module, context, source_stream=None, target_stream=None,
                                    stream_context=self.pipe._stream_context)

    def embedding_backward(self, context: Any) -> None:
        """Semi-sync: backward through the detached embeddings (their fused update)."""
        self.pipe.embedding_backward(context)

    def detach(self) -> None:
        """Give the sharded modules their own forward back; the next input dist rewrites again."""
        if self.pipe._pipelined_modules:
            self.pipe.detach()
            self.pipe._pipelined_modules = []
            self.pipe._pipelined_postprocs = []
            self.pipe._model_attached = True


def describe_internals() -> List[str]:
    """The private names this module uses, for reports (one line each).

    Examples
    --------
    >>> describe_internals()[0]
    'torchrec.distributed.train_pipeline.train_pipelines.TrainPipelineSparseDist._pipeline_model'
    """
    return [f"{m}.{p}" for m, p in NEEDED]
