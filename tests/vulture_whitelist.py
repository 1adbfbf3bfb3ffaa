"""What vulture cannot see used (tests/test_architecture.py runs it with this file): names
Python, typer, pytest, dataclasses.asdict or OR-Tools read. Each line names one and why."""

# ruff: noqa: B018
from html.parser import HTMLParser

import pipesched
import pipesched.variability
from pipesched.cli import _Commands, _root
from pipesched.dependencies import RuleArrays
from pipesched.experiments.evaluation import LevelResult
from pipesched.search.bounds import Bound
from test_cli_groups import _Outer

pipesched.__getattr__  # a module's attribute hook: Python calls it for a lazy public name
pipesched.__dir__  # a module's dir() hook
pipesched.variability.__getattr__  # the variability package's lazy names
_Commands.list_commands  # click calls it to list the commands
_Commands.format_commands  # click calls it to write `pipesched --help`
_root  # the typer callback (registered by its decorator): `pipesched --version`
LevelResult.exposed_comm_s  # LevelResult.to_dict writes every field (dataclasses.asdict)
LevelResult.host_peak_memory  # the same
LevelResult.mean_s  # the same
LevelResult.std_s  # the same
LevelResult.p99_s  # the same
Bound.table_s  # one of the three parts the bound is the largest of, beside closed_form_s and work_s
RuleArrays.complete_masks  # the rules as arrays for the solver and list scheduling (the rules' redesign reads them)
RuleArrays.memory_whole  # the same
RuleArrays.memory_input_part  # the same
RuleArrays.memory_kept  # the same
_parameters = object  # CP-SAT's solver parameters, read by OR-Tools:
_parameters.max_time_in_seconds
_parameters.cp_model_probing_level
_parameters.expand_reservoir_constraints
_parameters.num_workers
HTMLParser.handle_starttag  # a test's HTML parser overrides them; HTMLParser calls them
HTMLParser.handle_endtag
HTMLParser.handle_data
_pytest_hooks = object  # pytest reads them by name:
_pytest_hooks.pytest_addoption  # conftest.py's option hook
_pytest_hooks.pytestmark  # a test module's marks
_module = object  # tests/reference: a stand-in package is given its __path__
_module.__path__
_Outer.loud  # typer reads the toy group's option from its declaration
_command = object  # cli/options.command's parsed function
_command.__signature__  # cli/options.command: typer reads the command's spread parameters from it
_command.__annotations__  # cli/options.command: typer reads the spread parameters' option types
