"""keep_freed_memory: a step that allocates and frees the same large tensors stops faulting their pages back in."""

from __future__ import annotations

import platform
import statistics
import subprocess
import sys

import pytest

from swpipe_core.measure import allocator

_STEPS = """
import sys, torch
from swpipe_core.measure.allocator import keep_freed_memory, minor_faults
if sys.argv[1] == "keep":
    assert keep_freed_memory()
for step in range(8):
    before = minor_faults()
    torch.empty(1 << 24).fill_(1.0)  # 64 MiB: above the largest threshold glibc sets by itself (32 MiB)
    print(minor_faults() - before)
"""


def _faults_per_step(mode: str) -> float:
    """The median step's faults (a small allocation can split the kept block once: the next step maps a new one)."""
    out = subprocess.run([sys.executable, "-c", _STEPS, mode], capture_output=True, text=True, timeout=120, check=True)
    return statistics.median(int(n) for n in out.stdout.split())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_kept_memory_is_not_faulted_in_again_each_step():
    released, kept = _faults_per_step("system"), _faults_per_step("keep")
    assert released >= 30, released  # 64 MiB mapped afresh each step: thousands of 4 KiB pages (32 huge pages at least)
    assert kept < released / 10, (kept, released)


def test_not_glibc_changes_nothing(monkeypatch):
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda *_: pytest.fail("mallopt called without glibc"))
    assert allocator.keep_freed_memory() is False


def test_threshold_beyond_a_c_int_is_rejected():
    with pytest.raises(ValueError, match=r"threshold_bytes.*\[0, 2147483647\]"):  # the argument, its C int range
        allocator.keep_freed_memory(-1)


_PROFILE = """
from swpipe import PipelinePlan, SWPipeline, TaskProfiler, TaskSchedule

def churn(ctx):  # 64 MiB allocated, touched and freed each step: above glibc's largest own threshold
    ctx.zeros = bytearray(1 << 26)[:: 1 << 12].count(0)

plan = PipelinePlan({"churn": TaskSchedule(0)}).bind({"churn": churn})
with SWPipeline(plan, device="cpu") as pipe:
    result = TaskProfiler(pipe, num_warmup=1, num_measure=2, num_rounds=1).profile(0, task_times=False)
print(result.meta["page_faults_per_iteration"])
print(result.format_report())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the threshold it relies on is glibc's")
def test_the_profile_counts_the_serial_iterations_page_faults():
    # a fresh process: how many pages a step faults in depends on the process's malloc history, which the tests
    # run before this one in a shared worker would decide
    out = subprocess.run([sys.executable, "-c", _PROFILE], capture_output=True, text=True, timeout=120, check=True)
    first, _, report = out.stdout.partition("\n")
    faults = float(first)
    assert faults >= 30, faults  # the 64 MiB is mapped afresh each step (4 KiB pages, or 2 MiB ones at least)
    printed = [line.partition(":")[2].split() for line in report.splitlines() if "faults" in line]
    assert [words[0] for words in printed] == [f"{faults:.0f}"]  # the report's one line of page faults
