"""``swpipe pp``: its options checked before anything is launched, and the job stopped as a whole.

The flag checks run in this process with ``launch`` replaced by a recorder: a refused
option must leave it uncalled. The stop tests start the real command (torchrun, 2
ranks) in a child, wait until both ranks say in torchrun's output that they joined the
process group, then press Ctrl-C (SIGINT), send SIGTERM, or kill torchrun; every
process the command started must be gone when it exits, with its exit status and one
line on stderr. The processes are found by a variable the test puts in the command's
environment, which every process it starts inherits (torchrun starts each rank in a
session of its own, and a rank whose torchrun died has no parent of ours).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from autosched.pp import builtin_programs
from swpipe.commands.pp_launch import PPJobError
from swpipe.cli import main

_MARK = "SWPIPE_PP_CLI_TEST"
_needs_proc = pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the job's processes through /proc")


def _errors(capsys) -> List[str]:
    return capsys.readouterr().err.splitlines()


def test_schedule_names_are_read_in_any_case_and_only_the_unknown_refused(launched, capsys) -> None:
    assert main(["pp", "--schedules", "gpipe,1F1B,ZBVZEROBUBBLE", "--microbatches", "4", "--no-search"]) == 1
    assert [cfg.schedules for cfg in launched] == [("GPipe", "1F1B", "ZBVZeroBubble")]
    capsys.readouterr()
    assert main(["pp", "--schedules", "gpipe,NoSuch", "--microbatches", "4"]) == 2
    assert len(launched) == 1
    (line,) = _errors(capsys)
    assert "'NoSuch'" in line and "'gpipe'" not in line
    programs, refused = builtin_programs(2, 4)
    assert all(name in line for name in set(programs) | set(refused))  # the valid names, listed


@pytest.mark.parametrize("argv, options", [
    (["--json", "{tmp}/no-such-folder/report.json"], ["--json"]),
    (["--csv", "{tmp}"], ["--csv"]),
    (["--json", "{tmp}/missing/a.json", "--csv", "{tmp}/missing/a.csv"], ["--json", "--csv"]),
    (["--no-search", "--csv", "{tmp}/a.csv", "--memory-cap-mib", "64"], ["--csv", "--memory-cap-mib"]),
])
def test_a_refused_option_launches_nothing(launched, capsys, tmp_path, argv, options) -> None:
    assert main(["pp"] + [a.format(tmp=tmp_path) for a in argv]) == 2
    assert launched == []
    assert [line.split()[2].rstrip(":") for line in _errors(capsys)] == options  # "swpipe pp: OPTION ..."


def test_memory_cap_is_read_in_mib(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["pp", "--memory-cap-mib", "-5"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "MiB" in err and "seconds" not in err


def test_comms_is_refused_without_grid_and_adds_the_sends_to_it(launched, capsys) -> None:
    assert main(["pp", "--comms", "--microbatches", "4"]) == 2
    assert launched == [] and [line.split()[2] for line in _errors(capsys)] == ["--comms:"]
    assert main(["pp", "--grid", "gpipe", "--comms", "--microbatches", "2"]) == 0
    assert "0SEND_F0" in capsys.readouterr().out and launched == []


@pytest.mark.parametrize("reason, status", [("interrupted", 130), ("terminated", 143), ("hangup", 129),
                                            ("timeout", 124),
                                            ("torchrun_died", 1), ("failed", 1)])
def test_each_end_of_the_job_has_its_exit_status_and_one_line(monkeypatch, capsys, temp_in_tmp_path, reason,
                                                               status) -> None:
    def stopped(*args, **kwargs):
        raise PPJobError(reason, f"{reason}: stopped 3 process(es)", None, 3, "torchrun.log")

    monkeypatch.setattr("swpipe.commands.pp_launch.launch", stopped)
    assert main(["pp", "--microbatches", "4", "--no-search"]) == status
    assert _errors(capsys) == [f"swpipe pp: {reason}: stopped 3 process(es)"]


# --- the real job -------------------------------------------------------------------------------------------


def _marked(mark: str) -> Dict[int, str]:
    """Live processes whose environment holds ``SWPIPE_PP_CLI_TEST=mark``: pid -> command line.

    The test's own walk of /proc (not the command's), so that the two cannot share a mistake;
    a zombie's environment reads empty, so a dead process that is not yet reaped counts as gone.
    """
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if f"{_MARK}={mark}".encode() in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                found[int(name)] = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


class _Command:
    """The command on a tiny model with steps enough to run for hours, its stdout read by a thread, its stderr
    in a file, and the mark in its environment."""

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.mark = uuid.uuid4().hex
        self.stdout: List[str] = []
        self.stderr = tmp_path / "stderr.txt"
        cmd = [sys.executable, "-m", "swpipe.cli", "pp", "--width", "16", "--depth", "4", "--batch", "8",
               "--microbatches", "4", "--schedules", "GPipe", "--no-search", "--steps", "1000000", *extra]
        with open(self.stderr, "w") as err:
            # TMPDIR: the folder with torchrun's output, kept when the job is stopped, goes with the test's
            self.proc = subprocess.Popen(cmd, env=dict(os.environ, TMPDIR=str(tmp_path), **{_MARK: self.mark}),
                                         stdout=subprocess.PIPE, stderr=err, text=True)
        self.reader = threading.Thread(target=self._read, name="swpipe-pp-stdout", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.stdout.append(line)

    def ranks(self) -> Dict[int, int]:
        """``{rank: pid}`` once both ranks said in torchrun's output (whose path the command prints) that they
        joined the process group: a bounded poll on the output."""
        pause = threading.Event()
        ranks: Dict[int, int] = {}
        for _ in range(3000):
            logs = [line.split(": ", 1)[1].strip() for line in list(self.stdout)
                    if line.startswith("torchrun's output: ")]
            if logs and Path(logs[0]).exists():
                ranks = {int(r): int(p) for r, p in re.findall(
                    r"rank (\d+) of 2: in the process group \(pid (\d+)\)", Path(logs[0]).read_text(errors="replace"))}
            if len(ranks) == 2 or self.proc.poll() is not None:
                break
            pause.wait(0.1)
        assert len(ranks) == 2, f"the ranks did not start (exit {self.proc.poll()}): {self.stdout}"
        return ranks

    def ends(self) -> Tuple[int, List[str]]:
        """Its exit status and stderr's lines, once it exited."""
        rc = self.proc.wait(timeout=120)
        self.reader.join(timeout=60)
        return rc, self.stderr.read_text().splitlines()

    def kill_all(self) -> None:
        """If the command failed to, so that a failing test leaves nothing running."""
        for pid in _marked(self.mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=60)
        self.reader.join(timeout=60)


@pytest.mark.slow
@_needs_proc
@pytest.mark.timeout(400)
@pytest.mark.parametrize("sig, status, said", [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM"),
                                                  (signal.SIGHUP, 129, "SIGHUP")])
def test_a_signal_to_the_command_stops_torchrun_and_both_ranks(ctrl_c, tmp_path, sig, status, said) -> None:
    command = _Command(tmp_path)
    try:
        ranks = command.ranks()
        running = _marked(command.mark)
        assert set(ranks.values()) | {command.proc.pid} <= set(running)
        assert any(c.split()[1:3] == ["-m", "torch.distributed.run"] for c in running.values())
        command.proc.send_signal(sig)
        rc, err = command.ends()
        assert rc == status
        assert len(err) == 1 and err[0].split()[:2] == ["swpipe", "pp:"] and said in err[0]
        assert _marked(command.mark) == {}  # torchrun and both ranks gone, as the command returned
    finally:
        command.kill_all()


@pytest.mark.slow
@_needs_proc
@pytest.mark.timeout(400)
def test_torchrun_killed_the_command_stops_the_ranks_it_left(tmp_path) -> None:
    command = _Command(tmp_path)
    try:
        command.ranks()
        (torchrun,) = [pid for pid, c in _marked(command.mark).items()
                       if c.split()[1:3] == ["-m", "torch.distributed.run"]]
        os.kill(torchrun, signal.SIGKILL)
        rc, err = command.ends()
        assert rc == 1
        assert len(err) == 1 and "(SIGKILL)" in err[0].split()
        assert _marked(command.mark) == {}
    finally:
        command.kill_all()


@pytest.mark.slow
@_needs_proc
@pytest.mark.timeout(400)
def test_the_timeout_stops_the_job(tmp_path) -> None:
    command = _Command(tmp_path, "--timeout", "15")
    try:
        rc, err = command.ends()
        assert rc == 124
        assert len(err) == 1 and err[0].split()[:2] == ["swpipe", "pp:"]
        assert _marked(command.mark) == {}
    finally:
        command.kill_all()
