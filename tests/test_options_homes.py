"""The homes a misplaced option is sent to (``swpipe_core.engine.options.OPTION_HOMES``) list the keywords their signatures
take: options.py cannot read the signatures itself (the engine and the profiler build on it; issue 46.6)."""

from __future__ import annotations

import dataclasses

import pytest

from swpipe_core.engine.options import OPTION_HOMES, OptionError, Timeouts, keyword_options
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.measure.profiler import TaskProfiler
from swpipe_core.plan import PipelinePlan, TaskSchedule

#: Each home's callable: where its keywords really are.
SIGNATURES = {"SWPipeline": SWPipeline.__init__, "SWPipeline.run": SWPipeline.run,
              "TaskProfiler": TaskProfiler.__init__, "TaskProfiler.profile": TaskProfiler.profile}


@pytest.mark.parametrize("home", [h for h, _, _ in OPTION_HOMES])
def test_each_homes_keywords_are_its_signatures(home):
    keywords = dict((h, k) for h, k, _ in OPTION_HOMES)[home]
    if home == "Timeouts":
        assert list(keywords) == [f.name for f in dataclasses.fields(Timeouts)]
    else:
        assert list(keywords) == keyword_options(SIGNATURES[home])


def test_a_misplaced_option_is_sent_home_without_the_home_imported_by_options():
    plan = PipelinePlan({"A": TaskSchedule()})
    with pytest.raises(OptionError) as caught:
        SWPipeline(plan, device="cpu", num_rounds=2)
    assert (caught.value.field, caught.value.home, caught.value.fix) == (
        "num_rounds", "TaskProfiler", "TaskProfiler(pipe, num_rounds=2)")
    with pytest.raises(OptionError) as caught:
        SWPipeline(plan, device="cpu", emit_nvtx=True)
    assert (caught.value.home, caught.value.fix) == ("SWPipeline.run", "pipe.run(data, emit_nvtx=True)")
