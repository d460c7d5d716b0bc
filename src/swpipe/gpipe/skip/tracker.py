"""Where stashed values wait for their pop: the calling thread's current tracker.

Outside GPipe each thread has a tracker of its own, so a skippable layer
works as a plain module. Inside GPipe, a partition runs with a tracker
holding what earlier partitions stashed for it (copied to its device);
what it stashes and does not pop itself is what it hands on.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Hashable, Iterator, Optional, Tuple

from swpipe.gpipe.errors import SkipDeclarationError

__all__ = ["SkipTracker", "current_tracker", "use_tracker"]

#: A skip's key: (namespace, name).
SkipKey = Tuple[Hashable, str]


class SkipTracker:
    """Stashed values by key, until popped.

    Parameters
    ----------
    incoming : dict, optional
        Values stashed elsewhere (by earlier partitions) that layers may pop here.
    """

    def __init__(self, incoming: Optional[Dict[SkipKey, Any]] = None) -> None:
        self.values: Dict[SkipKey, Any] = dict(incoming or {})
        self.stashed: Dict[SkipKey, Any] = {}  # stashed here and not popped here: handed on

    def save(self, key: SkipKey, value: Any) -> None:
        self.values[key] = value
        self.stashed[key] = value

    def load(self, key: SkipKey, layer: str) -> Any:
        if key not in self.values:
            raise SkipDeclarationError(layer, key[1], "pop_missing",
                                       f"{layer} pops {key[1]!r}, but nothing stashed it before (a layer that "
                                       f"stashes {key[1]!r} must run earlier in the same forward)")
        self.stashed.pop(key, None)
        return self.values.pop(key)


_local = threading.local()


def current_tracker() -> SkipTracker:
    """The calling thread's tracker (one of its own, made on first use, when none is in use)."""
    tracker = getattr(_local, "tracker", None)
    if tracker is not None:
        return tracker
    default = getattr(_local, "default", None)
    if default is None:
        default = _local.default = SkipTracker()
    return default


@contextlib.contextmanager
def use_tracker(tracker: SkipTracker) -> Iterator[SkipTracker]:
    """Make ``tracker`` the calling thread's current tracker for the block."""
    before = getattr(_local, "tracker", None)
    _local.tracker = tracker
    try:
        yield tracker
    finally:
        _local.tracker = before
