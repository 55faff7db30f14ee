"""Every per-shard stage of ``speechdata`` follows the one contract of ``speechdata/accounting/stage.py``.

The stages and the modules of their entry points come from the product registry
(:func:`speechdata.products.shard_stage_modules`: the shared stages and each product line's own), so
a product line added to the registry is checked here with no edit to this file.
"""

import importlib
import inspect

from speechdata.accounting.stage import StageSummary
from speechdata.products import shard_stage_modules


def stage_modules() -> list[str]:
    return sorted(set(shard_stage_modules().values()))


def stage_entry_points(modules: list[str] | None = None) -> dict[str, object]:
    """Every ``run_*`` function defined in the stage modules (not imported into them)."""
    found = {}
    for name in stage_modules() if modules is None else modules:
        module = importlib.import_module(name)
        for attribute, value in vars(module).items():
            if attribute.startswith("run_") and inspect.isfunction(value) and value.__module__ == name:
                found[attribute] = value
    return found


def contract_violations(stages: dict[str, str]) -> list[str]:
    """What breaks the stage contract among ``stages`` (stage -> module), one line each."""
    problems = []
    modules = sorted(set(stages.values()))
    entry_points = stage_entry_points(modules)
    for stage, module in sorted(stages.items()):
        if f"run_{stage}" not in vars(importlib.import_module(module)):
            problems.append(f"{module} has no run_{stage}")
    for name, function in sorted(entry_points.items()):
        # A second way to build the same product says how (run_alignments_from_import).
        if not name.startswith(tuple(f"run_{stage}" for stage in stages)):
            problems.append(f"{function.__module__}.{name} builds no registered stage")
        if list(inspect.signature(function).parameters)[:2] != ["data_root", "shard_id"]:
            problems.append(f"{function.__module__}.{name} does not take (data_root, shard_id, ...)")
        # The return annotation alone: a parameter's may name a model library the module imports only
        # for type checking (the code location imports no model library).
        returned = inspect.signature(function).return_annotation
        if isinstance(returned, str):
            returned = eval(returned, function.__globals__)  # noqa: S307 - the module's own annotation
        if not (inspect.isclass(returned) and issubclass(returned, StageSummary)):
            problems.append(f"{function.__module__}.{name} returns {returned!r}, not a StageSummary")
    return problems


def test_every_registered_stage_has_its_run_function_and_keeps_the_contract():
    assert contract_violations(shard_stage_modules()) == []


def test_the_quality_and_near_duplicate_stages_are_checked():
    found = stage_entry_points()
    for name in ("run_quality_signals", "run_quality_decisions", "run_near_duplicates", "run_streaming_pairs"):
        assert name in found, name


def test_a_stage_that_breaks_the_contract_is_named():
    # speechdata.accounting.stage's own module holds no run_ function: a stage registered there is reported.
    assert contract_violations({"made_up": "speechdata.accounting.stage"}) == [
        "speechdata.accounting.stage has no run_made_up"
    ]
