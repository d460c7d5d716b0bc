"""benchmarks/fake_vs_real.py: the fake's side of each of the six semantics, and a clear skip without a GPU."""

from __future__ import annotations

import pytest
import torch

from conftest import load_benchmark

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(120)]


def test_the_fakes_side_of_every_probe_says_what_cuda_does():
    script = load_benchmark("fake_vs_real")
    facts = {name: script.fake_facts(name, probe) for name, probe in script.PROBES}
    assert len(facts) == 6
    for name, got in facts.items():
        claims = {k: v for k, v in got.items() if k != "races the fake named"}
        assert claims and all(v is True or isinstance(v, str) for v in claims.values()), (name, got)
    assert facts["events belong to one device"] == {
        "recording on another device's stream raised": "Event device 0 does not match recording stream's device 1."}
    # where a read is unordered the fake names the race; where everything is ordered it names none
    assert [got["races the fake named"] for name, got in facts.items() if "races the fake named" in got] == [
        0, 1, 1, 0, 0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip is for machines without a GPU")
def test_without_a_gpu_the_script_says_it_skipped_and_succeeds(capsys):
    assert load_benchmark("fake_vs_real").main([]) == 0
    assert capsys.readouterr().out.split(":")[:2] == ["fake_vs_real", " skipped"]  # one line: it skipped, and why
