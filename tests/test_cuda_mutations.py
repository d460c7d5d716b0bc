"""The CUDA mutation table (``benchmarks/cuda_mutations.py``): every injected engine fault is caught on the fake.

The table runs the fake-device suite once against the engine as it is, then
once per fault monkeypatched into it. The engine as is must pass every check
(else "caught" below would mean nothing); each fault must fail at least one,
and the one that is deterministic for it: the happens-before race report for
the ordering and lifetime faults (a)-(e) (the values are wrong only when the
timing lets the race bite), the lag bound for (f), the hang turned into an
error for (g).
"""

from __future__ import annotations

import pytest

from conftest import load_benchmark

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(180)]

# the check that must catch each fault whatever the timing of the run
DETERMINISTIC = {"a": "race report", "b": "race report", "c": "race report", "d": "race report",
                 "e": "race report", "f": "lag bound exceeded", "g": "hang turned into an error"}


def test_every_injected_engine_fault_is_caught_and_the_engine_as_is_passes_every_check():
    bench = load_benchmark("cuda_mutations")
    rows = bench.mutation_table()
    table = bench.format_table(rows) + "\n" + bench.format_details(rows)
    baseline, faults = rows[0], rows[1:]
    assert baseline.fault is None and baseline.findings.caught_by() == [], table
    assert [r.fault.key for r in faults] == sorted(DETERMINISTIC)
    for row in faults:
        assert row.caught, f"({row.fault.key}) {row.fault.name} missed\n{table}"
        assert DETERMINISTIC[row.fault.key] in row.findings.caught_by(), table
        assert "run raised" not in row.findings.caught_by(), table  # a fault caught as such, not a broken harness
    assert "| missed |" not in bench.format_table(rows)


def test_each_fault_is_undone_after_its_row():
    """The patches live for their row only: the engine the rest of the tests see is the real one."""
    bench = load_benchmark("cuda_mutations")
    from swpipe.testing import FakeCudaDevice
    from swpipe_core.engine import SWPipeline
    from swpipe_core.streams import StreamPool
    import swpipe_core.engine as engine_mod

    watched = [(SWPipeline, "_prune_device"), (SWPipeline, "_bound_device_lag"), (SWPipeline, "_release"),
               (SWPipeline, "_run_items"), (StreamPool, "wait"), (StreamPool, "batch_ready"), (FakeCudaDevice, "use"),
               (engine_mod, "_GuardedContext"), (engine_mod, "_context_keeper")]
    before = [getattr(owner, name) for owner, name in watched]
    for fault in bench.FAULTS:
        with fault.inject():
            assert any(getattr(owner, name) is not b for (owner, name), b in zip(watched, before)), fault.key
    assert all(getattr(owner, name) is b for (owner, name), b in zip(watched, before))
