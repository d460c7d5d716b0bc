"""Timeline events (what ran where, and when) and their Chrome/Perfetto trace export.

A :class:`TimelineEvent` is one task execution for one iteration: its host
time on its thread group's track (``kind="host"``) or its device time on its
stream's track (``kind="device"``). Times are seconds from the run's origin.
The engine records them when built with ``record_timeline=True``; the
simulator of :mod:`autosched` produces the same events, so a measured and a
simulated timeline can be compared and viewed side by side.

:func:`to_chrome_trace` turns events into the Chrome trace-event JSON that
``chrome://tracing`` and https://ui.perfetto.dev open: one process for host
tracks (one thread per thread group) and one for device tracks (one thread per
stream).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Union

__all__ = ["TimelineEvent", "TimelineRecorder", "to_chrome_trace", "write_chrome_trace", "read_chrome_trace"]

_HOST_PID = 1
_DEVICE_PID = 2
_KIND_OF_PID = {_HOST_PID: "host", _DEVICE_PID: "device"}


@dataclass
class TimelineEvent:
    """One task execution on one track.

    Parameters
    ----------
    task : str
        Task name.
    iteration : int
        Iteration (batch) index the task worked on.
    thread_group : str
        Thread group whose worker ran it (``"serial"`` for serial runs).
    stream : str
        Readable stream name (``"default"`` for the default stream).
    start, end : float
        Seconds from the run's origin.
    kind : {"host", "device"}
        ``"host"``: CPU time on the thread group's track; ``"device"``: time on
        the stream's track.

    Examples
    --------
    >>> e = TimelineEvent("Forward", 3, "compute", "default", 0.010, 0.012)
    >>> round(e.duration, 3), e.kind
    (0.002, 'host')
    """

    task: str
    iteration: int
    thread_group: str
    stream: str
    start: float
    end: float
    kind: str = "host"

    @property
    def duration(self) -> float:
        """``end - start`` in seconds."""
        return self.end - self.start


class TimelineRecorder:
    """Collects :class:`TimelineEvent` s relative to an origin taken from ``time.perf_counter``.

    ``record`` takes absolute ``perf_counter`` times and is safe to call from
    several threads (``list.append`` is atomic).

    Parameters
    ----------
    origin : float, optional
        ``perf_counter`` value that becomes time 0; now if omitted.

    Examples
    --------
    >>> rec = TimelineRecorder(origin=100.0)
    >>> rec.record("H2D", 0, "io", "memcpy", 100.5, 100.75)
    >>> rec.events
    [TimelineEvent(task='H2D', iteration=0, thread_group='io', stream='memcpy', start=0.5, end=0.75, kind='host')]
    """

    def __init__(self, origin: Optional[float] = None) -> None:
        self.origin = time.perf_counter() if origin is None else origin
        self.events: List[TimelineEvent] = []

    def record(self, task: str, iteration: int, thread_group: str, stream: str,
               start: float, end: float, kind: str = "host") -> None:
        """Append one event given absolute ``perf_counter`` start and end times."""
        self.events.append(TimelineEvent(task, iteration, thread_group, stream,
                                         start - self.origin, end - self.origin, kind))

    def clear(self, origin: Optional[float] = None) -> None:
        """Drop all events and restart the clock (now, or at ``origin``)."""
        self.events = []
        self.origin = time.perf_counter() if origin is None else origin


def _track_ids(events: List[TimelineEvent]) -> Dict[tuple, int]:
    """Stable small integer ids per (pid, track name), in order of first appearance."""
    ids: Dict[tuple, int] = {}
    for e in events:
        key = (_HOST_PID, e.thread_group) if e.kind == "host" else (_DEVICE_PID, e.stream)
        if key not in ids:
            ids[key] = sum(1 for k in ids if k[0] == key[0]) + 1
    return ids


def to_chrome_trace(events: Iterable[TimelineEvent], name: str = "swpipe") -> Dict[str, Any]:
    """Chrome/Perfetto trace-event JSON (as a dict) for a list of events.

    Host events go to process ``"<name> host"`` with one thread per thread
    group; device events to ``"<name> device"`` with one thread per stream.
    Each event is a complete ("X") event named ``"<task>/iter<N>"`` with
    microsecond ``ts``/``dur`` and ``args`` holding task, iteration, thread
    group and stream.

    Parameters
    ----------
    events : iterable of TimelineEvent
    name : str
        Trace name, used in the process names and ``otherData``.

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.

    Raises
    ------
    ValueError
        For an event whose ``kind`` is neither ``"host"`` nor ``"device"``.

    Examples
    --------
    >>> evs = [TimelineEvent("H2D", 0, "io", "memcpy", 0.0, 0.001),
    ...        TimelineEvent("Forward", 0, "compute", "default", 0.001, 0.003)]
    >>> trace = to_chrome_trace(evs)
    >>> [(e["name"], e["tid"], e["ts"], e["dur"]) for e in trace["traceEvents"] if e["ph"] == "X"]
    [('H2D/iter0', 1, 0.0, 1000.0), ('Forward/iter0', 2, 1000.0, 2000.0)]
    """
    events = list(events)
    for e in events:
        if e.kind not in ("host", "device"):
            raise ValueError(f"TimelineEvent {e.task}/iter{e.iteration} has kind={e.kind!r}; use 'host' or 'device'")
    ids = _track_ids(events)
    out: List[Dict[str, Any]] = []
    for pid, label in ((_HOST_PID, "host"), (_DEVICE_PID, "device")):
        if any(k[0] == pid for k in ids):
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"{name} {label}"}})
    for (pid, track), tid in ids.items():
        prefix = "thread " if pid == _HOST_PID else "stream "
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": prefix + track}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    for e in events:
        pid = _HOST_PID if e.kind == "host" else _DEVICE_PID
        tid = ids[(pid, e.thread_group if pid == _HOST_PID else e.stream)]
        out.append({
            "ph": "X", "name": f"{e.task}/iter{e.iteration}", "cat": e.kind, "pid": pid, "tid": tid,
            "ts": round(e.start * 1e6, 3), "dur": round((e.end - e.start) * 1e6, 3),
            "args": {"task": e.task, "iteration": e.iteration, "thread_group": e.thread_group, "stream": e.stream},
        })
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"name": name}}


def write_chrome_trace(events: Iterable[TimelineEvent], path: Union[str, "os.PathLike[str]"],
                       name: str = "swpipe") -> str:
    """Write :func:`to_chrome_trace` JSON to ``path``; open it in https://ui.perfetto.dev.

    Parameters
    ----------
    events : iterable of TimelineEvent
    path : str or path-like
    name : str

    Returns
    -------
    str
        The path written.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.json")
    >>> _ = write_chrome_trace([TimelineEvent("A", 0, "default", "default", 0.0, 0.5)], path)
    >>> read_chrome_trace(path)[0].end
    0.5
    """
    path = os.fspath(path)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(to_chrome_trace(events, name=name), f)
    return path


def read_chrome_trace(source: Union[str, "os.PathLike[str]", Dict[str, Any]]) -> List[TimelineEvent]:
    """Read back the events of a trace written by :func:`write_chrome_trace` (or its dict).

    Parameters
    ----------
    source : path or dict
        A file path, or the dict returned by :func:`to_chrome_trace`.

    Returns
    -------
    list of TimelineEvent
        In file order; times rounded to the microsecond precision of the file.

    Raises
    ------
    ValueError
        If the JSON is not a trace with ``traceEvents`` written by this module.

    Examples
    --------
    >>> evs = [TimelineEvent("A", 1, "io", "memcpy", 0.25, 0.5, "device")]
    >>> read_chrome_trace(to_chrome_trace(evs)) == evs
    True
    """
    if isinstance(source, dict):
        data = source
    else:
        with open(os.fspath(source), encoding="utf-8") as f:
            data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError("not a Chrome trace: expected a JSON object with a 'traceEvents' list "
                         "(write it with swpipe_core.measure.trace.write_chrome_trace)")
    events = []
    for rec in data["traceEvents"]:
        if rec.get("ph") != "X":
            continue
        args = rec.get("args", {})
        try:
            start = rec["ts"] / 1e6
            events.append(TimelineEvent(args["task"], int(args["iteration"]), args["thread_group"], args["stream"],
                                        start, start + rec["dur"] / 1e6, _KIND_OF_PID.get(rec.get("pid"), "host")))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"trace event {rec!r} lacks the fields swpipe writes (args.task/iteration/"
                             f"thread_group/stream, ts, dur): {exc}") from exc
    return events
