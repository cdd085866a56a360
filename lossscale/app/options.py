"""The command line's options: argument types that check what they read, each run setting as an option
(from its declaration), and the help's layout."""

from __future__ import annotations

import argparse
from dataclasses import Field
from pathlib import Path
from typing import Any

from sim.checks import integer_problem, integer_range

from ..policy.core import parse_value
from ..training.config import settings
from . import IMAGE_FORMATS


class UsageError(Exception):
    """A problem with the command line: reported in one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of argparse's usage block
        raise UsageError(message)


def _value(key: str, text: str, words: bool = False) -> Any:
    """Values of KEY=VALUE: integers (also 2**k), floats, true/false; with ``words``, any other
    text as it is (the recipe checks its own fields)."""
    value = parse_value(text)
    if value is not None:
        return value
    if words:
        return text.strip()
    raise UsageError(f"bad value for {key}: {text!r}; use a number (2**16 is fine) or true/false")


def _pairs(items: list[str], what: str, words: bool = False) -> dict[str, Any]:
    out = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} takes KEY=VALUE, got {item!r}")
        key = key.strip()
        if key in out:
            raise UsageError(f"{what} gives {key} twice ({out[key]!r} and {text.strip()!r}); give it once")
        out[key] = _value(key, text, words)
    return out


def _integer(low: int, high: int | None = None):
    """An argparse type: an integer of at least ``low`` (and at most ``high``)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or integer_problem("", value, low, high):
            raise argparse.ArgumentTypeError(f"must be {integer_range(low, high)}, got {text!r}")
        return value
    parse.__name__ = "integer"
    return parse


def _name_or_path(choices: list[str]):
    """An argparse type: one of ``choices``, or an import path ``package.module:factory``."""
    def parse(text: str) -> str:
        if text in choices or ":" in text:
            return text
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(choices)}, or give "
                                         f"package.module:factory)")
    parse.__name__ = "name"
    return parse


def _axis_pair(text: str) -> tuple[str, str]:
    from .sweep import AXES
    names = [t.strip() for t in text.split(",")]
    if len(names) != 2 or not all(n in AXES for n in names):
        raise argparse.ArgumentTypeError(f"takes two sweep axes as ROW,COL; valid axes: {', '.join(AXES)}")
    return names[0], names[1]


def _option(f: Field) -> str:
    """A setting's command-line option."""
    return f.metadata["option"] or "--" + f.name.replace("_", "-")


def _dest(f: Field) -> str:
    return _option(f)[2:].replace("-", "_")


#: The settings whose declared help speaks of Python values (objects, classes), as the command
#: line takes them: by name, or by import path.
_CLI_HELP = {
    "manager": "the loss-scale manager, by name (lossscale managers lists them with their arguments)",
    "workload": "the model and data: a name, or package.module:factory for a workload of yours "
                "(factory(seed=SEED, **workload_args) returns it)",
}


def _setting(p: argparse.ArgumentParser, f: Field, **override: Any) -> None:
    """A run setting's option, read from its declaration (see ``RunConfig``); ``override``
    replaces what a command needs otherwise (a default, the help)."""
    meta = f.metadata
    kwargs: dict[str, Any] = {"default": f.default, "help": _CLI_HELP.get(f.name, meta["help"])}
    if meta["table"]:
        metavar = "[MANAGER:]KEY=VALUE" if f.name == "manager_args" else "KEY=VALUE"
        kwargs.update(action="append", metavar=metavar, default=[])
    elif meta["many"]:
        kwargs.update(nargs="+", metavar="NAME")
    elif meta["low"] is not None:
        kwargs.update(type=_integer(meta["low"], meta["high"]))
    elif isinstance(f.default, bool):
        kwargs.update(action=argparse.BooleanOptionalAction if f.default else "store_true")
    if meta["choices"] is not None and meta["importable"]:
        kwargs.update(type=_name_or_path(list(meta["choices"]())), metavar="{NAME,MODULE:FACTORY}",
                      help=f"{kwargs['help']}; NAME is one of {', '.join(meta['choices']())}")
    elif meta["choices"] is not None:
        kwargs.update(choices=list(meta["choices"]()))
    p.add_argument(_option(f), **{**kwargs, **override})


def _common(p: argparse.ArgumentParser, several: bool = False) -> None:
    """Every run setting that has an option; with ``several``, ``--manager`` is given once per
    manager to compare."""
    for f in settings():
        if f.metadata["option"] is None:
            continue
        several_managers = dict(action="append", required=True, default=None,
                                help="a manager to compare (give two or more)")
        _setting(p, f, **(several_managers if f.name == "manager" and several else {}))
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (its parent must exist and be writable; default: a new folder under runs/)")
    p.add_argument("--force", action="store_true",
                   help="replace an earlier lossscale output in --out (only the files lossscale wrote there: "
                        "a folder holding anything else is refused)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--format", choices=IMAGE_FORMATS, default="png", help="the plots' image format")
    plain = p.format_help

    def with_workloads() -> str:  # read on --help only: the torch workloads' signatures import torch
        return plain() + "\n" + _workload_listing()
    p.format_help = with_workloads  # type: ignore[method-assign]


def _workload_listing() -> str:
    """Each built-in workload's --workload-arg names and defaults, as the constructors declare them."""
    from ..training.workloads import WORKLOADS, arguments
    lines = ["workloads and their --workload-arg KEY=VALUE arguments (defaults):"]
    for name in WORKLOADS:
        shown = ", ".join(f"{k}={v}" for k, v in arguments(name).items())
        lines.append(f"  {name}: {shown or 'no arguments'}")
    lines.append("  package.module:factory: the factory's own keyword arguments (it is called with seed too)")
    return "\n".join(lines) + "\n"


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, unless the help says it already or there is none
    to say (None, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is None or action.default == []:
            return text
        return super()._get_help_string(action)
