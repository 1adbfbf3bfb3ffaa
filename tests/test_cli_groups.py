"""The commands' option groups: each concept's options declared once (``cli/options.py``,
``cli/groups.py``), spread among every command that takes them, and handed back to the
command as one object; the commands build their points through the library and only print."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from cli_helpers import assert_one_line_error
from pipesched.cli.groups import (
    EngineOptions,
    ModelOptions,
    TrainingOptions,
    VariabilityOptions,
    WorkloadOptions,
)
from pipesched.cli.options import OptionGroup, ScheduleOptions, command
from pipesched.cli.views import ViewPaths

CLI = Path(__file__).resolve().parents[1] / "src" / "pipesched" / "cli"
# the longest a command's function may be, signature and docstring included: it parses and prints
MAX_COMMAND_LINES = 40


@dataclass(frozen=True)
class _Size(OptionGroup):
    count: Annotated[int | None, typer.Option("--count", help="how many")] = None
    unit: Annotated[str, typer.Option("--unit-name", help="what of")] = "slot"


@dataclass(frozen=True)
class _Outer(OptionGroup):
    size: _Size = _Size()
    loud: Annotated[bool, typer.Option("--loud", help="say it loudly")] = False


def _toy_app(seen: list) -> typer.Typer:
    app = typer.Typer(add_completion=False)

    @command
    def toy(*, name: Annotated[str, typer.Argument()], outer: _Outer, last: Annotated[int, typer.Option()] = 1) -> None:
        seen.append((name, outer, last))

    app.command("toy")(toy)
    app.command("other")(lambda: None)  # a group of two commands: "toy" is named on the line
    return app


def test_a_group_spreads_its_options_and_comes_back_whole() -> None:
    seen: list = []
    app = _toy_app(seen)
    result = CliRunner().invoke(app, ["toy", "x", "--count", "3", "--loud", "--last", "2"])
    assert result.exit_code == 0, result.output
    assert seen == [("x", _Outer(size=_Size(count=3, unit="slot"), loud=True), 2)]
    CliRunner().invoke(app, ["toy", "y"])
    assert seen[-1] == ("y", _Outer(), 1)  # every default is the group's own
    shown = CliRunner().invoke(app, ["toy", "--help"]).output
    for flag in ("--count", "--unit-name", "--loud", "--last"):
        assert flag in shown


def test_a_group_names_its_flags_as_typed() -> None:
    assert _Outer(size=_Size(count=2)).given() == {"count": 2, "unit-name": "slot", "loud": False}
    assert set(VariabilityOptions().given()) == {"jitter", "jitter-file", "straggler", "random-straggler",
                                                 "slow-link", "samples", "seed"}


def test_two_options_of_one_name_are_a_programming_error() -> None:
    def twice(*, size: _Size, count: Annotated[int, typer.Option()] = 1) -> None:
        """(never run)"""

    with pytest.raises(TypeError, match="count"):
        command(twice)


def _commands() -> dict:
    from pipesched.cli import app

    group = typer.main.get_group(app)
    return {name: group.get_command(None, name) for name in group.list_commands(None)}


def _flags(command_object) -> set[str]:
    return {flag for param in command_object.params for flag in getattr(param, "opts", ())}


def _group_flags(*groups: type[OptionGroup]) -> set[str]:
    """The flags a group's options are typed with (a switch pair by its first half)."""
    flags: set[str] = set()
    for group in groups:
        for parameter in group.parameters():
            info = parameter.annotation.__metadata__[0]
            named = (info.default,) if isinstance(info.default, str) else ()
            flags |= {declared.split("/")[0] for declared in (*named, *(info.param_decls or ()))}
    return flags


@pytest.mark.parametrize(("names", "groups"), [
    (("simulate", "compare"), (ScheduleOptions, WorkloadOptions, TrainingOptions, EngineOptions,
                               VariabilityOptions, ViewPaths)),
    (("synthesize",), (WorkloadOptions, ViewPaths)),
    (("costs", "partition"), (ModelOptions,)),
    (("show",), (ScheduleOptions, ViewPaths)),
])
def test_each_command_takes_its_groups_whole(names, groups) -> None:
    commands = _commands()
    wanted = _group_flags(*groups)
    assert len(wanted) >= 4
    for name in names:
        assert wanted <= _flags(commands[name]), (name, sorted(wanted - _flags(commands[name])))


def _registered_functions() -> dict[str, ast.FunctionDef]:
    """Every function a ``register(app)`` hands to ``app.command(...)``, by name."""
    found: dict[str, ast.FunctionDef] = {}
    trees = {path: ast.parse(path.read_text()) for path in sorted(CLI.glob("*.py"))}
    # a command registered here may be defined in the module it comes from (cli/serve_pool.py)
    defined = {node.name: node for tree in trees.values() for node in tree.body if isinstance(node, ast.FunctionDef)}
    for path, tree in trees.items():
        functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Call)
                    and getattr(node.func.func, "attr", None) == "command" and node.args
                    and isinstance(node.args[0], ast.Name)):
                name = node.args[0].id
                found[f"{path.name}:{name}"] = functions.get(name) or defined[name]
    return found


def test_no_command_function_is_longer_than_it_takes_to_parse_and_print() -> None:
    registered = _registered_functions()
    assert len(registered) >= 12  # every command of `pipesched --help`
    long = {name: node.end_lineno - node.lineno + 1 for name, node in registered.items()
            if node.end_lineno - node.lineno + 1 > MAX_COMMAND_LINES}
    assert not long, long


def test_a_family_point_keeps_v_only_for_the_families_that_take_it() -> None:
    from pipesched.experiments.point import Point, schedule_point
    from pipesched.generators import generate, get_family

    template = Point()
    for family, v in (("interleaved-1f1b", 2), ("1f1b", None)):
        table = generate(family, 4, 8, v=v)
        point = schedule_point(template, table, family=family, options={"activation_limit": 4, "waves": 2}, v=2)
        taken = get_family(family)
        assert (point.family, point.p, point.m) == (family, 4, 8)
        assert point.v == (2 if taken.takes_v else None)
        assert {key for key, _ in point.options} == {"activation_limit", "waves"} & set(taken.options)
        assert point.schedule is None  # the point builds the family's table itself


def test_a_given_table_is_carried_and_its_stage_rows_checked(tmp_path) -> None:
    from pipesched.errors import PipeschedError
    from pipesched.experiments.point import Point, schedule_point
    from pipesched.generators import generate
    from pipesched.io.stage_costs import load_stage_costs

    table = generate("1f1b", 4, 4)
    assert schedule_point(Point(), table).schedule is table
    path = tmp_path / "costs.csv"
    path.write_text("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n"
                    + "".join(f"{s},0.01,0.01,0.01,1e8,1e6\n" for s in range(3)))
    with pytest.raises(PipeschedError, match=r"3 stage rows.*4 stages"):
        schedule_point(Point(stage_costs=load_stage_costs(str(path))), table)


def test_simulate_and_compare_refuse_the_same_options_with_a_freeze_plan(cli, tmp_path) -> None:
    plan = tmp_path / "plan.csv"
    plan.write_text("start,end,frozen_layers\n0,10,0-3\n")
    for argv in (("simulate", "1f1b"), ("compare", "--schedules", "1f1b")):
        for extra, fragment in ((("--jitter", "0.1"), "jitter=0.1"), (("--frozen-layers", "0-1"), "frozen-layers"),
                                (("--svg", str(tmp_path / "x.svg")), "svg=")):
            result = cli(*argv, "-p", "2", "-m", "4", "--freeze-plan", str(plan), *extra)
            assert_one_line_error(result, fragment, "not with --freeze-plan")


def test_synthesize_costs_its_one_stage_per_device_placement(cli, tmp_path) -> None:
    path = tmp_path / "costs.csv"
    path.write_text("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n"
                    + "".join(f"{s},0.01,0.01,0.01,1e8,1e6\n" for s in range(2)))
    result = cli("synthesize", "-p", "2", "-m", "2", "--stage-costs", str(path), "--time-limit", "2", "--json")
    assert result.code == 0, result
    made = json.loads(result.out)
    # every stage runs F, I and W on 2 microbatches on its own device: the busiest device's work bounds it
    assert made["makespan_s"] >= 2 * 3 * 0.01 - 1e-9
