"""The house counts of issue 40 (benchmarks/house_counts.py): what a reader trips over, counted, and held to limits."""

from __future__ import annotations

import pytest
from conftest import load_benchmark

house = load_benchmark("house_counts")

# Every count with a limit is held (any_parameters is printed, with no limit).
HELD = ("prose_matches", "private_accesses", "multi_base_classes", "wide_public_functions", "single_letter_options",
        "workloads_imports", "dir_not_all", "unmarked_sleeps", "timed_asserts")


@pytest.fixture(scope="module")
def counts():
    return house.counts()


def test_the_script_prints_every_count_with_its_limit(capsys):
    found = house.main([])
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [words[0] for words in lines] == list(found) and set(found) >= set(house.LIMITS)
    assert {words[0]: int(words[1]) for words in lines} == {name: c.value for name, c in found.items()}
    assert all(words[2] == "limit" for words in lines)


@pytest.mark.parametrize("name", HELD)
def test_a_held_count_is_within_its_limit(counts, name):
    count = counts[name]
    assert count.value <= count.limit, "\n".join(count.places)


@pytest.mark.parametrize("name", ["prose_matches", "private_accesses"])
def test_each_prose_match_and_private_read_left_says_why(counts, name):
    for place in counts[name].places:
        path, line = place.rsplit(":", 1)
        lines = (house.ROOT / path).read_text().splitlines()
        around = lines[max(0, int(line) - 4):int(line)]
        assert any("#" in text for text in around), f"{place}: {name} without a comment saying why"


@pytest.mark.parametrize("text, prose", [
    ("drain", False), ("corollary-1", False), ("('Forward', 'Step', 1)", False), (r"\['Nope'\]", False),
    ("LDS = 1", False), ("{} ms", False), ("not callable", True), ("period {} ms", False),
    ("no plan satisfies", True), ("TorchRec's pipeline", True),
])
def test_prose_is_two_words_in_a_row(text, prose):
    assert house.is_prose(text) is prose


def test_a_multi_base_class_and_a_private_read_are_found(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "src" / "m.py").write_text("class A: pass\nclass B: pass\nclass C(A, B): pass\nclass D(A, dict): pass\n")
    (tmp_path / "tests" / "test_x.py").write_text("from m import _hidden\n\ndef test_x(obj):\n"
                                                 "    assert obj._state == 1  # a comment\n    assert obj.__dict__\n")
    monkeypatch.setattr(house, "ROOT", tmp_path)
    src, tests = house.python_files(tmp_path / "src"), house.python_files(tmp_path / "tests")
    assert [p.split(" ", 1)[1] for p in house.multi_base_classes(src).places] == ["C(A, B)"]
    assert house.private_accesses(tests).places == ["tests/test_x.py:1", "tests/test_x.py:4"]


def test_a_sleep_ordering_threads_and_a_timed_assert_are_counted(tmp_path, monkeypatch):
    source = tmp_path / "test_x.py"
    source.write_text(
        "import time\n"
        "def test_a(done):\n"
        "    t0 = time.perf_counter()\n"
        "    time.sleep(0.05)  # let the worker block\n"
        "    elapsed = time.perf_counter() - t0\n"
        "    assert elapsed < 1.0\n"
        "    assert abs(time.monotonic() - t0) < 2\n"
        "    time.sleep(0.01)  # the workload\n"
        "    found = run(time.perf_counter())\n"
        "    assert found.ok and isinstance(elapsed, float)\n")
    monkeypatch.setattr(house, "ROOT", tmp_path)  # places are named relative to the root
    assert house.unmarked_sleeps([source]).places == ["test_x.py:4"]
    assert house.timed_asserts([source]).places == ["test_x.py:6", "test_x.py:7"]  # not a clock passed to run()
