"""The CUDA mutation table (``benchmarks/cuda_mutations.py``): every injected engine fault is caught on the fake.

The table runs the fake-device suite and the six semantics' scenarios once
against the engine as it is, then once per fault monkeypatched into it. The
engine as is must pass every check (else "caught" below would mean nothing);
each fault must fail at least one, and the one that is deterministic for it:
the happens-before race report for the ordering and lifetime faults (a)-(e),
(h)-(j) and (m) (the values are wrong only when the timing lets the race
bite), the lag bound for (f), the hang turned into an error for (g) and (l),
the device's refusal of an event of another device for (k). A behaviour of
the test suite, read from the table the script prints (its exit status says
whether the engine as is passed and every fault was caught).
"""

from __future__ import annotations

import pytest

from conftest import load_benchmark

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(300)]

# the check that must catch each fault whatever the timing of the run
DETERMINISTIC = {"a": "race report", "b": "race report", "c": "race report", "d": "race report",
                 "e": "race report", "f": "lag bound exceeded", "g": "hang turned into an error",
                 "h": "race report", "i": "race report", "j": "race report", "k": "device error",
                 "l": "hang turned into an error", "m": "race report"}


def test_every_injected_engine_fault_is_caught_and_the_engine_as_is_passes_every_check(capsys):
    status = load_benchmark("cuda_mutations").main([])
    table = capsys.readouterr().out
    assert status == 0, table  # the engine as is clean, every fault caught
    rows = {line.split(")", 1)[0][3:]: line for line in table.splitlines() if line.startswith("| (")}
    assert sorted(rows) == sorted(DETERMINISTIC), table
    for key, check in DETERMINISTIC.items():
        caught_by = rows[key].split("|")[2]
        assert check in caught_by, f"({key}) not caught by the {check}\n{table}"
        assert "run raised" not in caught_by, table  # a fault caught as such, not a broken harness
