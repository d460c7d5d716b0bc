"""How ``swpipe pp`` runs its job: ``torchrun`` started in a session of its own, and stopped whole.

:func:`launch` starts ``torchrun`` (``python -m torch.distributed.run``) on the loopback
with gloo; each rank runs :mod:`swpipe.commands.pp_job`. On SIGINT (Ctrl-C), SIGTERM or
SIGHUP to this process, past the timeout, or when torchrun dies or fails, every process
of the job (torchrun and its ranks, each rank in a session of its own) is stopped and
:class:`PPJobError` says which of those ended it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Dict, List, Optional

if TYPE_CHECKING:
    from swpipe.commands.pp_job import PPRunConfig

__all__ = ["PPJobError", "launch"]

_JOB_MODULE = "swpipe.commands.pp_job"  # what each rank runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_JOB_VAR = "SWPIPE_PP_JOB"  # in the environment of every process a launch starts: how its stop finds them
_SIGNAL_REASONS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hangup"}
_POLL_S = 0.05  # how often a wait looks again at torchrun, the signals and /proc


class PPJobError(RuntimeError):
    """The torchrun job of :func:`launch` ended without a report; every process it started has been stopped.

    Attributes
    ----------
    reason : str
        ``"interrupted"`` (SIGINT, Ctrl-C), ``"terminated"`` (SIGTERM), ``"hangup"`` (SIGHUP), ``"timeout"`` (past
        ``timeout_s``), ``"torchrun_died"`` (torchrun killed by a signal), ``"failed"``
        (torchrun exited non-zero: a rank failed), ``"no_report"`` (it exited 0 without one).
    line : str
        One line saying what happened and where torchrun's output is.
    returncode : int or None
        torchrun's exit status (negative: the signal that killed it); None when it was
        still running.
    stopped : int
        The processes of the job (torchrun, its ranks) still running that were stopped.
    log_path : str
        torchrun's and the ranks' output.
    output_tail : str
        The output's last lines, for ``"failed"`` and ``"no_report"`` ("" otherwise).
    """

    def __init__(self, reason: str, line: str, returncode: Optional[int] = None, stopped: int = 0,
                 log_path: str = "", output_tail: str = "") -> None:
        super().__init__(f"{line}\n{output_tail}" if output_tail else line)
        self.reason, self.line, self.returncode = reason, line, returncode
        self.stopped, self.log_path, self.output_tail = stopped, log_path, output_tail


def _job_pids(token: str) -> set:
    """The live processes whose environment holds ``SWPIPE_PP_JOB=token`` (Linux's /proc; empty elsewhere).

    torchrun starts each rank in a session of its own, and a rank whose torchrun died
    belongs to no one: the environment every process of the job inherits is what finds
    them all. A zombie's environment reads empty: it counts as gone.
    """
    mark = f"{_JOB_VAR}={token}".encode()
    try:
        names = os.listdir("/proc")
    except OSError:
        return set()
    found = set()
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    found.add(int(name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def _stop_job(proc: "subprocess.Popen[bytes]", token: str, grace_s: float) -> int:
    """SIGTERM to torchrun's process group and to every process of the job, SIGKILL to what is left after
    ``grace_s``; returns when none is left (or ``grace_s`` after the SIGKILL). How many were running."""
    seen: set = set()
    signalled: set = set()
    sig, deadline = signal.SIGTERM, time.monotonic() + grace_s
    while True:
        torchrun = proc.poll() is None
        left = _job_pids(token) | ({proc.pid} if torchrun else set())
        seen |= left
        if not left:
            return len(seen)
        if time.monotonic() > deadline:
            if sig == signal.SIGKILL:
                return len(seen)
            sig, deadline, signalled = signal.SIGKILL, time.monotonic() + grace_s, set()
        for pid in sorted(left - signalled):
            try:
                if pid == proc.pid:
                    os.killpg(pid, sig)  # torchrun and whatever it started in its own group
                else:
                    os.kill(pid, sig)  # a rank: torchrun starts each in a session of its own
            except (ProcessLookupError, PermissionError):
                pass
            signalled.add(pid)
        if torchrun:
            try:
                proc.wait(timeout=_POLL_S)
            except subprocess.TimeoutExpired:
                pass
        else:
            threading.Event().wait(_POLL_S)  # a poll interval: processes that are not our children cannot be waited on


class _Signals:
    """While the job runs, SIGINT, SIGTERM and SIGHUP (the terminal closed) are recorded (the wait looks at them) instead of raising or killing
    this process at once, so that the job is stopped first. Only on the main thread, and only where the handler
    is Python's default (a caller's own handler stays)."""

    def __init__(self) -> None:
        self.received: List[int] = []
        self._previous: Dict[int, Any] = {}

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL),
                                 (signal.SIGHUP, signal.SIG_DFL)):
                if signal.getsignal(sig) == default:
                    self._previous[sig] = signal.signal(sig, lambda signum, frame: self.received.append(signum))
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail(path: str, n_chars: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - n_chars))
            return f.read().decode(errors="replace")
    except OSError as exc:
        return f"(torchrun's output {path} could not be read: {exc.strerror})"


def launch(cfg: "PPRunConfig", nproc: int = 2, out_path: Optional[str] = None, timeout_s: float = 600.0,
           log_path: Optional[str] = None, grace_s: float = 5.0) -> Dict[str, Any]:
    """Run :func:`swpipe.commands.pp_job.run_rank` under ``torchrun --nproc-per-node nproc`` (gloo, loopback); the rank-0 report.

    torchrun runs in a session of its own, its output (and the ranks') goes to
    ``log_path`` (default: a new temporary folder's ``torchrun.log``). When the job
    ends without a report, every process it started (torchrun and its ranks, each in a
    session of its own) is sent SIGTERM, SIGKILL after ``grace_s`` seconds, and
    :class:`PPJobError` is raised once none is left: on SIGINT (Ctrl-C) or SIGTERM to
    this process while the job runs, past ``timeout_s``, when torchrun dies, and when it
    fails. The ranks are found by a variable in their environment (``/proc``: on a
    system without it only torchrun's group is signalled, and torchrun stops its ranks).

    Raises
    ------
    PPJobError
        ``reason`` says which of those ended the job.
    """
    folder = tempfile.mkdtemp(prefix="swpipe-pp-") if out_path is None or log_path is None else None
    out_path = out_path or os.path.join(folder, "report.json")
    log_path = log_path or os.path.join(folder, "torchrun.log")
    token = f"{os.getpid()}-{uuid.uuid4().hex}"
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # the ranks import swpipe from where this process did, and the --model factory from where it was found
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg.threads), **{_JOB_VAR: token},
               PYTHONPATH=os.pathsep.join(filter(None, [src, cfg.model_root, os.environ.get("PYTHONPATH")])))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--nnodes=1",
           "--master-addr=127.0.0.1", f"--master-port={_free_port()}", "--max-restarts=0",
           "-m", _JOB_MODULE, "--config", json.dumps(asdict(cfg)), "--out", out_path]
    where = f"torchrun's output: {log_path}"
    with _Signals() as signals, open(log_path, "wb") as log:
        # the output goes to a file, not a pipe: a rank that outlives torchrun would hold a pipe open
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        reason = None
        try:
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None:
                if signals.received:
                    reason = _SIGNAL_REASONS[signals.received[0]]
                    break
                if time.monotonic() >= deadline:
                    reason = "timeout"
                    break
                try:
                    proc.wait(timeout=min(_POLL_S, max(0.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    pass
        except KeyboardInterrupt:  # SIGINT with a handler of the caller's that raises it
            reason = "interrupted"
        except BaseException:
            _stop_job(proc, token, grace_s)
            raise
        stopped = _stop_job(proc, token, grace_s)  # a rank torchrun left running, too
    if reason is not None:
        what = {"interrupted": "interrupted (SIGINT, Ctrl-C)", "terminated": "terminated (SIGTERM)",
                "hangup": "the terminal closed (SIGHUP)",
                "timeout": f"the job ran past its timeout of {timeout_s:g} s"}[reason]
        raise PPJobError(reason, f"{what}: stopped {stopped} process(es) of the job (torchrun and its ranks); "
                                 f"{where}", None, stopped, log_path)
    if proc.returncode < 0:
        raise PPJobError("torchrun_died", f"torchrun died ({_signal_name(-proc.returncode)}) before the job "
                                          f"finished: stopped the {stopped} process(es) it left; {where}",
                         proc.returncode, stopped, log_path)
    if proc.returncode != 0:
        raise PPJobError("failed", f"torchrun failed (exit {proc.returncode}); {where}; its last lines:",
                         proc.returncode, stopped, log_path, _tail(log_path, 6000))
    try:
        with open(out_path) as f:
            report = json.load(f)
    except (OSError, ValueError) as exc:
        raise PPJobError("no_report", f"torchrun exited 0 but the report {out_path} cannot be read ({exc}); "
                                      f"{where}; its last lines:", 0, stopped, log_path, _tail(log_path, 6000)) from exc
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    return report


