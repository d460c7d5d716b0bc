"""``swpipe pp --model pkg.module:factory`` (issue 47 item 6) and the summary under its table (issue 47's finding).

The factory is a module written into ``tmp_path`` and put on ``sys.path``; what is wrong with
it is refused before torchrun starts (``launch`` replaced by a recorder that must stay
uncalled), naming the field. The slow test trains a user model under torchrun (2 gloo ranks)
and compares its losses with the unsplit model trained here. The summary's test builds a
report by hand and reads the printed table and summary back.
"""

from __future__ import annotations

import json
import sys
from typing import Dict, Iterator, List

import pytest

from swpipe.cli import main
from swpipe.commands.pp import format_report, summarise
from swpipe.commands.pp_model import PPModelError, load_model
from swpipe.pp import PPCpsatRun

_FACTORIES = '''
import torch
from swpipe.pp import PPModel

def tiny():
    """Two stages given as modules, a cross-entropy loss on class targets."""
    torch.manual_seed(3)
    g = torch.Generator().manual_seed(4)
    stages = [torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU()), torch.nn.Linear(12, 3)]
    return PPModel(stages=stages, batch=torch.randn(8, 6, generator=g),
                   target=torch.randint(0, 3, (8,), generator=g), loss_fn=torch.nn.functional.cross_entropy, lr=0.1)

def split():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(4)])
    return PPModel(model=model, split_points=[1], batch=torch.randn(8, 4), target=torch.randn(8, 4),
                   loss_fn=torch.nn.functional.mse_loss)

def unseeded():
    return PPModel(stages=[torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)], batch=torch.ones(8, 4),
                   target=torch.ones(8, 4), loss_fn=torch.nn.functional.mse_loss)

def both():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]
    return PPModel(stages=layers, model=torch.nn.Sequential(*layers), batch=torch.ones(8, 4),
                   target=torch.ones(8, 4), loss_fn=torch.nn.functional.mse_loss)

def not_sequential():
    torch.manual_seed(0)
    return PPModel(model=torch.nn.Linear(4, 4), batch=torch.ones(8, 4), target=torch.ones(8, 4),
                   loss_fn=torch.nn.functional.mse_loss)

def bad_points():
    torch.manual_seed(0)
    return PPModel(model=torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)), split_points=[2],
                   batch=torch.ones(8, 4), target=torch.ones(8, 4), loss_fn=torch.nn.functional.mse_loss)

def short_target():
    torch.manual_seed(0)
    return PPModel(stages=[torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)], batch=torch.ones(8, 4),
                   target=torch.ones(6, 4), loss_fn=torch.nn.functional.mse_loss)

def a_dict():
    return {"stages": []}

def raises():
    raise RuntimeError("no weights here")

NOT_CALLABLE = 3
'''


@pytest.fixture
def factories(tmp_path, monkeypatch) -> Iterator[str]:
    """The module's name, importable here (and, through the command, on the ranks); imported afresh from this
    test's folder (the command reads where it was imported from)."""
    (tmp_path / "swpipe_pp_user_models.py").write_text(_FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "swpipe_pp_user_models"
    sys.modules.pop("swpipe_pp_user_models", None)


@pytest.mark.parametrize("name, field", [
    ("no_colon", "spec"), ("swpipe_pp_no_such_module:tiny", "module"), (":nothing", "factory"),
    (":NOT_CALLABLE", "factory"), (":raises", "factory"), (":a_dict", "returned"), (":both", "stages"),
    (":not_sequential", "model"), (":bad_points", "split_points"), (":short_target", "target"),
    (":unseeded", "weights"),
])
def test_a_factory_that_cannot_be_used_is_named_with_its_field(factories, name, field) -> None:
    spec = name if not name.startswith(":") else factories + name
    with pytest.raises(PPModelError) as error:
        load_model(spec, check_twice=True)
    assert (error.value.spec, error.value.field) == (spec, field)


@pytest.mark.parametrize("argv, option", [
    (["--model", "swpipe_pp_no_such_module:tiny"], "--model"),
    (["--model", "{m}:unseeded"], "--model"),
    (["--model", "{m}:tiny", "--width", "8"], "--width"),
    (["--model", "{m}:tiny", "--microbatches", "3"], "--microbatches"),   # 8 samples
    (["--model", "{m}:tiny", "--ranks", "3"], "--ranks"),                 # 2 stages: 3 or 6 needed
    (["--model", "{m}:tiny", "--schedules", "Interleaved1F1B"], "--schedules"),  # 4 stages, the model has 2
])
def test_the_model_is_checked_before_torchrun_starts(factories, launched, capsys, argv, option) -> None:
    assert main(["pp", *[a.format(m=factories) for a in argv]]) == 2
    assert launched == []
    assert [line.split()[2].rstrip(":") for line in capsys.readouterr().err.splitlines()] == [option]


def test_the_factory_and_where_it_was_found_go_to_the_ranks(factories, launched, tmp_path) -> None:
    assert main(["pp", "--model", f"{factories}:split", "--microbatches", "2,4", "--no-search"]) == 1
    (cfg,) = launched
    assert (cfg.model, cfg.model_options, cfg.model_root) == (f"{factories}:split", {}, str(tmp_path))
    assert set(cfg.schedules) == set()  # every schedule its cut runs: the job picks them


def test_the_builtin_model_is_a_factory_of_the_same_contract(launched) -> None:
    assert main(["pp", "--width", "16", "--depth", "4", "--batch", "8", "--microbatches", "4", "--no-search"]) == 1
    (cfg,) = launched
    model = load_model(cfg.model, cfg.model_options)
    assert (cfg.model_options, model.samples, len(model.model), model.stage_counts(2)) == (
        {"width": 16, "depth": 4, "batch": 8}, 8, 4, (2, 4))


def _unsplit_losses(spec: str, n_mb: int, n_steps: int) -> List[float]:
    """The factory's model trained here, unsplit: per step the mean of the micro-batches' losses, then SGD."""
    import torch

    model = load_model(spec)
    whole = torch.nn.Sequential(*model.stages)
    opt = torch.optim.SGD(whole.parameters(), lr=model.lr)
    xs, ys = model.microbatches(n_mb)
    out = []
    for _ in range(n_steps):
        opt.zero_grad()
        loss = sum(model.loss_fn(whole(x), y) for x, y in zip(xs, ys)) / n_mb
        loss.backward()
        opt.step()
        out.append(float(loss.detach()))
    return out


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_a_user_model_trains_under_torchrun_like_the_unsplit_model(factories, tmp_path) -> None:
    path = tmp_path / "report.json"
    rc = main(["pp", "--model", f"{factories}:tiny", "--ranks", "2", "--microbatches", "4",
               "--schedules", "GPipe,1F1B", "--steps", "2", "--warmup", "1", "--time-limit", "1",
               "--json", str(path), "--timeout", "400"])
    assert rc == 0
    data = json.loads(path.read_text())
    rows: Dict[str, dict] = {r["schedule"]: r for r in data["results"] if "refused" not in r}
    assert set(rows) == {"GPipe", "1F1B", "swpipe-searched"} and data["stage_counts"] == [2]
    expected = _unsplit_losses(f"{factories}:tiny", 4, 1 + 2 + 1)
    for name, r in rows.items():
        assert r["losses"] == pytest.approx(expected, rel=1e-4), name
        assert expected[-1] < expected[0]  # it trains


# --- the summary under the table ------------------------------------------------------------------------------

def _row(name: str, predicted_ms: float, measured_ms: float, n_stages: int = 2) -> dict:
    return {"schedule": name, "n_microbatches": 4, "n_stages": n_stages, "predicted_step_s": predicted_ms / 1e3,
            "measured_step_s": measured_ms / 1e3, "noise": 0.01, "predicted_peak_bytes": {"0": 2048, "1": 1024},
            "measured_peak_bytes": {"0": 2048, "1": 1024}, "predicted_bubble": {"0": 0.2, "1": 0.2},
            "loss_rel_err": 0.0}


@pytest.fixture
def report() -> dict:
    """What the job of issue 47 reported: the search's own figure (54.717 ms, on the costs before the runs)
    disagrees with 1F1B's row (53.46 ms, on the costs of the whole run); CP-SAT's makespans lie below both."""
    return {"results": [_row("GPipe", 55.10, 56.00), _row("1F1B", 53.46, 55.20),
                        _row("swpipe-searched", 53.90, 54.80, 4),
                        {"schedule": "DualPipeV", "n_microbatches": 4, "refused": "too few micro-batches"}],
            "searched": {"origin": "cpsat(B) loop2", "search_step_s": 0.054717, "cut": "",
                         "cpsat": [{"layout": "loop1", "n_microbatches": 4, "split": False, "status": "OPTIMAL",
                                    "makespan_s": 0.0501},
                                   {"layout": "v2", "n_microbatches": 4, "split": True, "status": "UNKNOWN",
                                    "makespan_s": None}]},
            "p2p": {"latency_s": 1e-4, "seconds_per_byte": 1e-9, "post_s": 1e-4}, "load": [1.0, 1.0, 1.0]}


def test_the_summary_reads_the_tables_rows(report) -> None:
    s = summarise(report)
    rows = report["results"]
    assert s.predicted_fastest is rows[1] and s.measured_fastest is rows[2]
    assert s.searched is rows[2] and s.fastest_pytorch is rows[1]
    printed = format_report(report).splitlines()
    table = {line.split()[0]: line.split() for line in printed[2:6]}
    summary = {line.split(":")[0]: line for line in printed[6:]}
    # "predicted fastest: 1F1B (4 micro-batches, 2 stages): 53.46 ms predicted, ..." and 1F1B's row: pred 53.46
    fastest = summary["predicted fastest"].split(": ")
    assert fastest[1].split()[0] == "1F1B" and fastest[2].split()[0] == table["1F1B"][3] == "53.46"
    searched = summary["searched (cpsat(B) loop2)"].split(": ")[2].split()
    assert [searched[0], searched[3]] == table["swpipe-searched"][3:5] == ["53.90", "54.80"]
    assert not any("54.717" in line or "54.72" in line for line in printed)  # the search's own figure is not shown


def test_cpsat_makespans_are_labelled_as_its_models(report) -> None:
    printed = format_report(report).splitlines()
    (line,) = [line for line in printed if "OPTIMAL" in line]
    assert line.startswith(PPCpsatRun.MEANS + ": ")  # what the figures are, before them
    assert line[len(PPCpsatRun.MEANS) + 2:].split("; ") == ["loop1 n=4 B: OPTIMAL 50.100 ms", "v2 n=4 IW: UNKNOWN"]


def test_the_searched_line_carries_the_searchs_margin(report) -> None:
    with_margin = {**report, "searched": {**report["searched"], "margin_pct": 5.6}}
    (line,) = [x for x in format_report(with_margin).splitlines() if x.startswith("searched (")]
    label = line.split(": ")[0]  # "searched (ORIGIN; ... 5.6 % ...)": the origin, then the margin
    origin, margin = label[len("searched ("):-1].split("; ")
    assert origin == "cpsat(B) loop2" and "5.6" in margin.split()
    (plain,) = [x for x in format_report(report).splitlines() if x.startswith("searched (")]
    assert plain.split(": ")[0] == "searched (cpsat(B) loop2)"  # a report without one: none said
