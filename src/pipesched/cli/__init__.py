"""The `pipesched` command: a thin layer over the library.

Each submodule registers one group of commands on ``app``. Every user error surfaces as one
line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from pipesched.errors import PipeschedError, one_line

app = typer.Typer(
    name="pipesched",
    help="Layer-wise pipeline-parallel schedules: generate, validate, simulate, compare, measure.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    """Layer-wise pipeline-parallel schedules: generate, validate, simulate, compare, measure."""


def _register_commands() -> None:
    from pipesched.cli import compare, costs, run, schedules, simulate

    for module in (schedules, costs, simulate, compare, run):
        module.register(app)


# what typer returns when Ctrl-C (KeyboardInterrupt) stops a command; no command returns it
_CTRL_C_EXIT = 130


def fail(message: str) -> None:
    """Print one error line (over-long values shortened) and exit 2."""
    print(f"pipesched: error: {one_line(message)}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    _register_commands()
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
