"""Uneven data across ranks: every rank stops at the same batch, nothing hangs, nothing is lost.

A hand-written data-parallel pipeline hangs when one rank's loader ends
first: that rank stops issuing collectives while the others wait in their
next ``all_reduce`` until the NCCL/gloo timeout kills the job (by default
30 minutes later). :func:`agree_on_end` wraps each rank's data iterator so
that, before every batch is handed to the pipeline, the ranks exchange one
status per rank ("I have a batch", "my data ended", "my loader raised").
A batch is yielded only when every rank has one, so every rank's pipeline
sees the same number of batches and stops at the same iteration.

The batches that ranks with more data already took from their loader are
not trained: they stay in :attr:`AgreedIterator.leftover`, and
:meth:`AgreedIterator.rest` yields them followed by whatever the loader has
not produced yet, so the caller decides what to do with them (train them
alone, carry them into the next epoch, or drop them knowingly).

The exchange is a gloo ``all_reduce`` of a small CPU tensor on the caller's
thread, on a process group of its own (created with
``torch.distributed.new_group(backend="gloo")`` unless one is given): the
pipeline's collectives run on worker threads in the sequencer's order, and
an exchange on the same group from the main thread would interleave with
them differently on each rank.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Iterable, Iterator, List, Optional, Tuple

import torch

__all__ = ["agree_on_end", "AgreedIterator", "group_timeout"]

# Per-rank status codes; 0 means "not this rank's slot" in the summed vector.
_HAVE, _END, _ERROR = 1, 2, 3


class AgreedIterator(Iterator[Any]):
    """A data iterator that yields a batch only when every rank of ``group`` has one.

    Built by :func:`agree_on_end`; see there for the parameters.

    Attributes
    ----------
    group : torch.distributed.ProcessGroup
        The group the per-batch status is exchanged on (reuse it for the next
        epoch: ``agree_on_end(loader, group=it.group)``).
    batches : int
        Batches yielded so far (identical on every rank).
    leftover : list
        Batches this rank took from its loader but did not yield because
        another rank's data had ended (at most one).
    ended_ranks : tuple of int
        The ranks whose data ended at the stop (empty while running).
    """

    def __init__(self, data: Iterable[Any], group: Any) -> None:
        import torch.distributed as dist

        self._dist = dist
        self._source = iter(data)
        self.group = group
        self._rank = dist.get_rank(group)
        self._world = dist.get_world_size(group)
        self.batches = 0
        self.leftover: List[Any] = []
        self.ended_ranks: Tuple[int, ...] = ()
        self._stopped = False

    def __iter__(self) -> "AgreedIterator":
        return self

    def __next__(self) -> Any:
        if self._stopped:
            raise StopIteration
        status, batch, error = _HAVE, None, None
        try:
            batch = next(self._source)
        except StopIteration:
            status = _END
        except Exception as exc:  # tell the other ranks before raising here, so they stop too
            status, error = _ERROR, exc
        flags = torch.zeros(self._world, dtype=torch.int32)
        flags[self._rank] = status
        self._dist.all_reduce(flags, group=self.group)
        statuses = flags.tolist()
        if all(s == _HAVE for s in statuses):
            self.batches += 1
            return batch
        self._stopped = True
        if status == _HAVE:
            self.leftover.append(batch)
        if error is not None:
            raise error
        failed = [r for r, s in enumerate(statuses) if s == _ERROR]
        if failed:
            raise RuntimeError(
                f"the data iterator of rank(s) {failed} raised at batch {self.batches}; rank {self._rank} stops "
                f"too so that no rank waits for the others (see those ranks' logs for the error)"
            )
        self.ended_ranks = tuple(r for r, s in enumerate(statuses) if s == _END)
        raise StopIteration

    def rest(self) -> Iterator[Any]:
        """The batches this rank did not yield: :attr:`leftover`, then what its loader still holds.

        Returns
        -------
        iterator
            Local only (no exchange with other ranks).

        Examples
        --------
        See :func:`agree_on_end` (one rank); with two ranks holding 12 and 9
        batches, rank 0 stops after 9 with ``leftover == [9]`` and ``rest()``
        yields 9, 10, 11 (``tests/test_multirank.py``).
        """
        while self.leftover:
            yield self.leftover.pop(0)
        yield from self._source


def agree_on_end(data: Iterable[Any], group: Optional[Any] = None,
                 timeout: Optional[timedelta] = None) -> AgreedIterator:
    """Wrap a rank's data so that all ranks stop at the same batch.

    Every ``next()`` exchanges one status per rank (a gloo ``all_reduce`` of
    ``world_size`` integers) before yielding; when any rank's data has ended
    (or its loader raised), every rank stops at that same batch. Pass the
    result to :meth:`SWPipeline.fill_pipeline` / ``run`` as the data.

    Parameters
    ----------
    data : iterable
        This rank's batches.
    group : torch.distributed.ProcessGroup, optional
        A group used only for this exchange. ``None`` creates one with
        ``torch.distributed.new_group(backend="gloo")``, which is itself a
        collective: every rank must call ``agree_on_end`` at the same point.
        Do not pass the group the pipeline's tasks use for their collectives.
    timeout : datetime.timedelta, optional
        Timeout of the group created when ``group`` is None. A new group does
        not inherit ``init_process_group``'s timeout by itself (its own default
        is 30 minutes), so ``None`` copies the default group's timeout: a rank
        whose peer died fails, and can exit, within the time the job chose.

    Returns
    -------
    AgreedIterator
        Yields this rank's batches; ``.leftover`` / ``.rest()`` hold the
        batches not yielded because another rank ran out first.

    Raises
    ------
    RuntimeError
        ``torch.distributed`` is not initialised; or (from ``next()``) another
        rank's loader raised, in which case this rank stops too.
    Exception
        This rank's loader error, unchanged (after telling the other ranks).

    Examples
    --------
    A one-rank group shows the mechanics (with more ranks, the shortest data decides):

    >>> import torch.distributed as dist
    >>> from swpipe import agree_on_end
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> it = agree_on_end(range(3))
    >>> list(it), it.batches, it.ended_ranks, it.leftover, list(it.rest())
    ([0, 1, 2], 3, (0,), [], [])
    >>> dist.destroy_process_group()
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("agree_on_end needs torch.distributed: call torch.distributed.init_process_group(...) "
                           "on every rank first (a single process can use world_size=1)")
    if group is None:
        group = dist.new_group(backend="gloo", timeout=timeout if timeout is not None else group_timeout())
    return AgreedIterator(data, group)


def group_timeout(group: Optional[Any] = None) -> Optional[timedelta]:
    """The timeout a process group's collectives wait before failing (default: the default group's).

    A group made by ``torch.distributed.new_group`` does not inherit the job's
    timeout by itself; pass this to it to keep the one the job chose.

    Parameters
    ----------
    group : torch.distributed.ProcessGroup, optional

    Returns
    -------
    datetime.timedelta or None
        ``None`` when the group's backend does not expose it (torch's default then applies).

    Examples
    --------
    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=9))
    >>> group_timeout(), group_timeout(dist.new_group(backend="gloo", timeout=timedelta(seconds=5)))
    (datetime.timedelta(seconds=9), datetime.timedelta(seconds=5))
    >>> dist.destroy_process_group()
    """
    import torch.distributed as dist

    group = dist.group.WORLD if group is None else group
    device = torch.device("cuda") if dist.get_backend(group) == "nccl" else torch.device("cpu")
    try:
        return group._get_backend(device).options._timeout
    except Exception:  # noqa: BLE001 - private API, absent on some backends/versions
        return None
