"""The curated public API stays honest: every exported name exists, is documented, and the
package imports without the heavy optional dependencies."""

from __future__ import annotations

import doctest
import subprocess
import sys

import pipesched


def test_every_exported_name_resolves_and_is_documented() -> None:
    for name in pipesched.__all__:
        value = getattr(pipesched, name)
        if callable(value):
            assert value.__doc__, f"pipesched.{name} has no docstring"


def test_all_is_unique() -> None:
    # ruff's RUF022 keeps it sorted (constants, classes, functions)
    assert len(set(pipesched.__all__)) == len(pipesched.__all__)


def test_unknown_attribute_raises() -> None:
    try:
        pipesched.not_a_thing  # noqa: B018
    except AttributeError as exc:
        assert "not_a_thing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_importing_does_not_load_heavy_dependencies() -> None:
    code = ("import sys, pipesched, pipesched.cli; "
            "print(','.join(m for m in ('torch', 'ortools', 'playwright', 'matplotlib', 'numba') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_package_docstring_example_runs() -> None:
    failures, tried = doctest.testmod(pipesched, verbose=False)
    assert tried >= 3 and failures == 0
