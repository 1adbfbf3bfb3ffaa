"""Experiments are data: a frozen ``Point``, ``evaluate(point, levels) -> Record``, and grids
of points evaluated over any map (a list comprehension, a process pool, Ray). ``compare``
and ``search`` are grids over this layer; the CLI only parses options into points and
prints records."""

from __future__ import annotations

import sys
from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING

from pipesched.defaults import DEFAULTS, Defaults

# Every other public name is imported on first use, so that the serving experiments
# (``experiments.serving``) load without the training ones (the generators, the simulator,
# the variability models). Two submodules share a name with the function they hold
# (``evaluate``, ``grid``): when one is imported, the package keeps the function under
# that name, not the submodule (``_Package``).
_LAZY = {
    "LEVELS": "evaluate", "LevelResult": "evaluate", "Record": "evaluate", "evaluate": "evaluate",
    "evaluate_all": "grid", "grid": "grid", "process_map": "grid", "rank": "grid",
    "Point": "point", "SimulationSetup": "setup",
}

if TYPE_CHECKING:
    from pipesched.experiments.evaluate import LEVELS, LevelResult, Record, evaluate
    from pipesched.experiments.grid import evaluate_all, grid, process_map, rank
    from pipesched.experiments.point import Point
    from pipesched.experiments.setup import SimulationSetup


class _Package(ModuleType):
    """``pipesched.experiments``, its names loaded from their modules when first read."""

    def __getattr__(self, name: str) -> object:
        if name in _LAZY:
            value = getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
            super().__setattr__(name, value)
            return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, ModuleType) and _LAZY.get(name) == name:  # the submodule of a function's name
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = ["DEFAULTS", "LEVELS", "Defaults", "LevelResult", "Point", "Record", "SimulationSetup", "evaluate",
           "evaluate_all", "grid", "process_map", "rank"]
