"""Experiments are data: a frozen ``Point``, ``evaluate(point, levels) -> Record``, and grids
of points evaluated over any map (a list comprehension, a process pool, Ray). ``compare``
and ``search`` are grids over this layer; the CLI only parses options into points and
prints records."""

from __future__ import annotations

from pipesched.defaults import DEFAULTS, Defaults
from pipesched.experiments.evaluate import LEVELS, LevelResult, Record, evaluate
from pipesched.experiments.grid import evaluate_all, grid, process_map, rank
from pipesched.experiments.point import Point
from pipesched.experiments.setup import SimulationSetup

__all__ = ["DEFAULTS", "LEVELS", "Defaults", "LevelResult", "Point", "Record", "SimulationSetup", "evaluate",
           "evaluate_all", "grid", "process_map", "rank"]
