"""Experiments are data: a frozen ``Point``, ``evaluate(point, levels) -> Record``, and grids
of points evaluated over any map (a list comprehension, a process pool, Ray). ``compare``
and ``search`` are grids over this layer; the CLI only parses options into points and
prints records."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from pipesched.defaults import DEFAULTS, Defaults

# Every other public name is imported on first use (PEP 562), so that the serving
# experiments (``experiments.serving``) load without the training ones (the generators, the
# simulator, the variability models).
_LAZY = {
    "LEVELS": "evaluation", "LevelResult": "evaluation", "Record": "evaluation", "evaluate": "evaluation",
    "evaluate_all": "grids", "grid": "grids", "process_map": "grids", "rank": "grids",
    "Point": "point", "SimulationSetup": "setup",
}

if TYPE_CHECKING:
    from pipesched.experiments.evaluation import LEVELS, LevelResult, Record, evaluate
    from pipesched.experiments.grids import evaluate_all, grid, process_map, rank
    from pipesched.experiments.point import Point
    from pipesched.experiments.setup import SimulationSetup


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEFAULTS", "LEVELS", "Defaults", "LevelResult", "Point", "Record", "SimulationSetup", "evaluate",
           "evaluate_all", "grid", "process_map", "rank"]
