"""Skip connections for GPipe: layers that hand a tensor to a later layer, across partitions and devices.

``@skippable(stash=[...], pop=[...])`` declares what a layer's ``forward``
yields: ``yield stash(name, tensor)`` and ``value = yield pop(name)``.
:class:`Namespace` and ``layer.isolate(ns)`` keep two copies of one layer
apart; :func:`verify_skippables` checks a whole model.
"""

from swpipe.gpipe.skip.layout import verify_skippables
from swpipe.gpipe.skip.namespace import Namespace
from swpipe.gpipe.skip.skippable import pop, skippable, stash

__all__ = ["skippable", "stash", "pop", "Namespace", "verify_skippables"]
