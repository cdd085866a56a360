"""The run setting is declared once (``RunConfig``): simulate's signature, the command-line
options, the sweep axes and the summary's arguments all follow its fields; the trajectory's
schema follows ``Row``."""

from __future__ import annotations

import inspect
from dataclasses import fields

import pytest

from lossscale import RunConfig, simulate
from lossscale.app.cli import build_parser
from lossscale.app.sweep import AXES
from lossscale.training.config import check_arguments, recorded, settings
from lossscale.training.records import COLUMNS, SCHEMA, Row, Summary


def test_simulate_takes_the_settings_in_their_order_with_their_defaults() -> None:
    params = inspect.signature(simulate).parameters
    assert [(p.name, p.default) for p in params.values()] == [(f.name, f.default) for f in settings()]
    assert list(params)[:4] == ["workload", "profile", "overflow_mode", "manager"]
    assert all(f.metadata["help"] for f in settings())


def test_a_config_or_keywords_give_the_same_run() -> None:
    config = RunConfig(workload="trace", steps=5, seed=3)
    by_config, by_keywords = simulate(config, record_events=False), simulate("trace", steps=5, seed=3,
                                                                              record_events=False)
    assert str(by_config.records) == str(by_keywords.records)  # NaN cells: compare as text
    assert by_config.summary["arguments"] == by_keywords.summary["arguments"]
    with pytest.raises(TypeError):
        simulate(colour="red")
    with pytest.raises(ValueError, match="steps must be an integer from 1 to 10,000,000, got 0"):
        RunConfig(steps=0)


def test_every_option_axis_and_summary_argument_comes_from_the_config() -> None:
    subs = next(a for a in build_parser()._actions if a.dest == "command").choices
    for command in ("run", "compare"):
        options = {o for a in subs[command]._actions for o in a.option_strings}
        for f in settings():
            if f.metadata["option"] is not None:
                assert (f.metadata["option"] or "--" + f.name.replace("_", "-")) in options, f.name
    assert AXES == tuple(f.name for f in recorded())
    run = simulate("trace", steps=2, record_events=False)
    assert tuple(run.summary["arguments"]) == AXES
    assert list(run.summary) == [f.name for f in fields(Summary)]


def test_checks_come_from_the_declared_bounds_and_choices() -> None:
    assert check_arguments({"steps": 0, "manager_defaults": "x", "fp8_args": 3}) == [
        "steps must be an integer from 1 to 10,000,000, got 0",
        "fp8_args must be a table of arguments, got 3",
        "unknown manager_defaults 'x'; valid: demo, framework",
        "fp8_args go with an fp8 recipe (fp8= one of delayed, current, mx, mxfp8, block, nvfp4)"]
    assert check_arguments({"workload": "trace", "steps": 3}) == []


def test_the_schema_is_the_row_type() -> None:
    assert COLUMNS == tuple(f.name for f in fields(Row)) and SCHEMA["step"] is int and SCHEMA["applied"] is bool
    assert all(f.metadata["help"] for f in fields(Row))
