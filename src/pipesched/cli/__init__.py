"""The `pipesched` command: a thin layer over the library.

Each submodule registers one group of commands (its ``register(app)``). A submodule is
imported only when one of its commands runs or shows its help, so that `pipesched --help`
and the light commands (`validate`, `list`) start without numpy, numba, matplotlib or
torch. Every user error surfaces as one line on stderr and exit status 2, never a
traceback.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from dataclasses import dataclass
from importlib import import_module

import typer
from typer.core import TyperGroup

from pipesched.errors import PipeschedError, one_line, suggest

HELP = "Layer-wise pipeline-parallel schedules: generate, validate, simulate, compare, measure."


@dataclass(frozen=True)
class CommandEntry:
    module: str  # the pipesched.cli submodule whose register() adds the command
    summary: str  # its line in `pipesched --help`


# Every command, in the order `pipesched --help` lists them.
COMMANDS: dict[str, CommandEntry] = {
    "list": CommandEntry("pipesched.cli.schedules", "List schedule families, models, devices or clusters."),
    "show": CommandEntry("pipesched.cli.schedules", "Generate a schedule; print it or write it as grid, CSV or JSON."),
    "validate": CommandEntry("pipesched.cli.schedules", "Check a schedule file: exit 0 valid, 1 violations, 2 unreadable."),
    "costs": CommandEntry("pipesched.cli.costs", "Per-layer costs of a model on a device."),
    "partition": CommandEntry("pipesched.cli.costs", "Split a model's layers into pipeline stages."),
    "simulate": CommandEntry("pipesched.cli.simulate", "Simulate one iteration with links, contention and memory."),
    "compare": CommandEntry("pipesched.cli.compare", "Schedule families side by side at three levels, ranked."),
    "search": CommandEntry("pipesched.cli.search", "The fastest configuration of a model on a cluster."),
    "synthesize": CommandEntry("pipesched.cli.synthesize", "A solver-made schedule under a memory cap, and its bound."),
    "run": CommandEntry("pipesched.cli.run", "Run a schedule for real with PyTorch and measure every op."),
    "profile": CommandEntry("pipesched.cli.run", "Measure layer or stage op times and the link between ranks."),
    "check": CommandEntry("pipesched.cli.run", "Profile, simulate, run and report the prediction error."),
    "serve": CommandEntry("pipesched.cli.serve", "Serve a model: simulate, capacity, search, run and check."),
}


class _Commands(TyperGroup):
    """The command group, loading each command's module on first use."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: typer.Context, cmd_name: str):
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            self._load(COMMANDS[cmd_name].module)
        return self.commands.get(cmd_name)

    def _load(self, module_name: str) -> None:
        group = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
        import_module(module_name).register(group)
        group.callback()(_no_options)  # a group even when the module has a single command
        for name, command in typer.main.get_group(group).commands.items():
            self.commands.setdefault(name, command)

    def resolve_command(self, ctx: typer.Context, args: list[str]):
        try:
            return super().resolve_command(ctx, args)
        except typer.TyperException as exc:  # "No such command": name the closest one
            if args and args[0] not in COMMANDS and hasattr(exc, "message"):
                exc.message = f"{exc.message.rstrip('.')}{suggest(args[0], COMMANDS)}"
            raise

    def format_commands(self, ctx: typer.Context, formatter) -> None:
        """The command list from COMMANDS, without importing any command module."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, entry.summary) for name, entry in COMMANDS.items()])


def _no_options() -> None:
    """(the callback of a command module's own group; never shown)"""


app = typer.Typer(
    name="pipesched",
    cls=_Commands,
    help=HELP,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def version() -> str:
    """The installed pipesched's version ("unknown" when run from a source tree)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("pipesched")
    except PackageNotFoundError:
        return "unknown"


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    show_version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True),
) -> None:
    """Layer-wise pipeline-parallel schedules: generate, validate, simulate, compare, measure."""
    if show_version:
        typer.echo(f"pipesched {version()}")
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:  # bare `pipesched`: the help, and success
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


# what typer returns when Ctrl-C (KeyboardInterrupt) stops a command; no command returns it
_CTRL_C_EXIT = 130


def fail(message: str) -> None:
    """Print one error line (over-long values shortened) and exit 2."""
    print(f"pipesched: error: {one_line(message)}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    try:
        result = app(args=argv, standalone_mode=False, prog_name="pipesched")
    except PipeschedError as exc:
        fail(str(exc))
    except typer.TyperException as exc:
        # usage errors: unknown option, missing argument, bad value
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        fail(f"{exc.format_message()}{hint}")
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except (typer.Abort, KeyboardInterrupt):
        fail("interrupted")
    if result == _CTRL_C_EXIT:
        fail("interrupted")
    raise SystemExit(result if isinstance(result, int) else 0)


def run() -> None:
    """The `pipesched` process: ``main`` on the command line's arguments, then the process's
    end. Once the exit handlers have run and the output is flushed, the process ends without
    the interpreter's teardown, which frees every module and numba's compiled code object by
    object (a quarter of a second after a simulation) and has nothing left to write. With
    another thread still running, an exit status that is not a number, or output that cannot
    be flushed, it ends the ordinary way."""
    code: object = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    if not isinstance(code, int) or threading.active_count() > 1:
        raise SystemExit(code)
    atexit._run_exitfuncs()  # what the ordinary end runs before its teardown
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe: the ordinary end reports it
        raise SystemExit(code) from None
    os._exit(code)
