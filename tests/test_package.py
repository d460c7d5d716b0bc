"""The package looks finished: one version, ``--version``, ``python -m swpipe``, ``py.typed``, every public name listed."""

from __future__ import annotations

import configparser
import pathlib
import subprocess
import sys

import pytest

import autosched
import sw_pipeline
import swpipe
import swpipe_core
from swpipe.cli import main

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def test_version_is_one_constant_that_setup_cfg_reads():
    assert swpipe.__version__ and swpipe.__version__[0].isdigit()
    assert _setup_cfg()["metadata"]["version"].strip() == "attr: swpipe._version.__version__"


def test_swpipe_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"swpipe {swpipe.__version__}"


def test_python_dash_m_swpipe_runs_the_command():
    out = subprocess.run([sys.executable, "-m", "swpipe", "list"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "sparse_dist" in out.stdout


def test_license_file_matches_the_declared_licence():
    meta = _setup_cfg()["metadata"]
    assert meta["license"].strip() == "BSD-3-Clause"
    text = (ROOT / meta["license_files"].strip()).read_text()
    # the licence's and the author's wording is the behaviour: what the package declares and ships
    assert text.startswith("BSD 3-Clause License") and "swpipe developers" in text
    assert meta["author"].strip() == "swpipe developers"
    assert "License :: OSI Approved :: BSD License" in meta["classifiers"]


def test_py_typed_marker_ships_as_package_data():
    assert (ROOT / "src" / "swpipe" / "py.typed").exists()
    assert _setup_cfg()["options.package_data"]["swpipe"].strip() == "py.typed"


@pytest.mark.parametrize("module", [swpipe, swpipe_core, autosched, sw_pipeline], ids=lambda m: m.__name__)
def test_dir_lists_every_lazy_public_name(module):
    listed = set(dir(module))
    missing = sorted(set(module.__all__) - listed)
    assert not missing, f"dir({module.__name__}) misses {missing}"
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_dir_of_the_face_package_is_its_public_api_and_help_names_the_users_entry_points():
    assert dir(swpipe) == swpipe.__all__ == sorted(swpipe.__all__)  # no Any, importlib or annotations
    assert {"SWPipeline", "auto_schedule", "CostModel", "TaskProfiler"} <= set(dir(swpipe))
    import pydoc

    text = pydoc.render_doc(swpipe, renderer=pydoc.plaintext)
    for name in ("SWPipeline", "auto_schedule", "CostModel", "simulate"):
        assert name in text, f"help(swpipe) does not list {name}"


def test_the_api_references_import_gives_swpipes_own_objects_and_ships_with_the_package():
    from setuptools import find_packages

    from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule  # the reference's first line

    assert (PipelinePlan, PipelineTask, SWPipeline, TaskSchedule) == (
        swpipe.PipelinePlan, swpipe.PipelineTask, swpipe.SWPipeline, swpipe.TaskSchedule)
    assert all(getattr(sw_pipeline, name) is getattr(swpipe, name) for name in sw_pipeline.__all__)
    assert dir(sw_pipeline) == sw_pipeline.__all__ and set(sw_pipeline.__all__) <= set(swpipe.__all__)
    include = _setup_cfg()["options.packages.find"]["include"].split()
    assert "sw_pipeline" in find_packages(where=str(ROOT / "src"), include=include)  # what an install ships


def test_task_ref_the_references_type_of_a_task_reference_is_public():
    import typing

    from swpipe_core.plan import TaskRef

    assert "TaskRef" in swpipe.__all__ and swpipe.TaskRef is TaskRef
    assert set(typing.get_args(swpipe.TaskRef)) == {str, swpipe.PipelineTask}


def test_torch_requirement_is_a_range_the_cpu_and_cuda_builds_of_the_tested_version_satisfy():
    """Installing swpipe beside a user's CUDA torch must keep it: a range, not a pin to one build."""
    from packaging.requirements import Requirement

    reqs = [Requirement(line.strip()) for line in _setup_cfg()["options"]["install_requires"].splitlines()
            if line.strip()]
    torch_req = next(r for r in reqs if r.name == "torch")
    assert "==" not in str(torch_req.specifier)
    for build in ("2.13.0", "2.13.0+cpu", "2.13.0+cu126", "2.13.1+cu128", "2.14.1"):
        assert torch_req.specifier.contains(build), f"torch {build} does not satisfy {torch_req}"
    assert not torch_req.specifier.contains("2.12.1"), "older than any tested torch"


def test_a_checkout_named_swpipe_in_the_current_folder_does_not_hide_the_package(tmp_path):
    """Python started in the parent of a clone named ``swpipe`` imports the installed package, not the clone's
    folder as an empty namespace package (the packages live under src/)."""
    (tmp_path / "swpipe").symlink_to(ROOT, target_is_directory=True)
    out = subprocess.run([sys.executable, "-c", "from swpipe import SWPipeline; import swpipe; print(swpipe.__file__)"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert pathlib.Path(out.stdout.strip()).resolve() == (ROOT / "src" / "swpipe" / "__init__.py").resolve()


def test_a_reader_that_goes_away_ends_the_command_quietly(monkeypatch, tmp_path):
    """``swpipe list | head -1``: the pipe closes under the command, which ends with status 0, no traceback."""
    target = open(tmp_path / "stdout", "w")

    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

        def fileno(self):
            return target.fileno()

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    try:
        assert main(["list"]) == 0
    finally:
        target.close()
