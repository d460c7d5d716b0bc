"""Ctrl-C keeps working after a search: the solver must not take SIGINT over.

CP-SAT installs its own SIGINT handler while it solves and, unless told not to,
leaves SIGINT at its default action afterwards, so a later Ctrl-C (or the
engine's KeyboardInterrupt path) killed the whole process instead of raising
KeyboardInterrupt. Checked in a child process so a regression cannot kill pytest.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_CHILD = textwrap.dedent(
    """
    import os, signal, threading
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interactive Python, however pytest was started
    from autosched.model.costs import CostModel, TaskCost
    from autosched.search.options import Constraints, SolverOptions
    from swpipe import auto_schedule

    costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003), "C": TaskCost(0.001)})
    plan, report = auto_schedule((["A", "B", "C"], [("B", "A"), ("C", "B")]), costs,
                                 Constraints(max_depth=2, max_threads=2), solver=SolverOptions(time_limit_s=5))
    assert report.search.model_period_s is not None, "CP-SAT did not run"
    try:
        os.kill(os.getpid(), signal.SIGINT)
        threading.Event().wait(2.0)  # the signal is handled at the next bytecode
        print("no KeyboardInterrupt")
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
    """
)


def test_ctrl_c_still_raises_keyboard_interrupt_after_cpsat_search():
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"child died (rc={out.returncode}); stderr:\n{out.stderr[-2000:]}"
    assert out.stdout.strip().splitlines()[-1] == "KeyboardInterrupt"
