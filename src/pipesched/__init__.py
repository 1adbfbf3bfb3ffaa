"""pipesched: layer-wise pipeline-parallel schedules as data.

>>> import pipesched
>>> schedule = pipesched.generate("1f1b", 4, 8)
>>> pipesched.validate(schedule)
[]
>>> pipesched.slot_table(schedule).makespan
33.0
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import FAMILIES, formula, generate
from pipesched.generators.base import FormulaEstimate
from pipesched.io import load_schedule, save_schedule
from pipesched.ops import Op, OpKind
from pipesched.schedule import Placement, Schedule
from pipesched.slot_table import slot_table, table_metrics
from pipesched.timeline import MemoryTrace, Timeline, TransferTable
from pipesched.validate import Violation, validate

# Imported on first use: they pull in numba (the simulator) or the model package. The
# simulator and the comparison live in the subpackages of the same name:
# ``from pipesched.simulate import simulate, Network``; ``from pipesched.compare import compare``.
_LAZY = {
    "summarize": "pipesched.metrics",
    "Cluster": "pipesched.model.hardware",
    "DeviceSpec": "pipesched.model.hardware",
    "LinkSpec": "pipesched.model.hardware",
    "load_model": "pipesched.model",
    "load_cluster": "pipesched.model",
    "build_stage_costs": "pipesched.model",
    "TrainingSettings": "pipesched.model",
}

if TYPE_CHECKING:
    from pipesched.metrics import summarize
    from pipesched.model import TrainingSettings, build_stage_costs, load_cluster, load_model
    from pipesched.model.hardware import Cluster, DeviceSpec, LinkSpec


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pipesched' has no attribute {name!r}")


__all__ = [
    "FAMILIES",
    "Cluster",
    "DeviceSpec",
    "FormulaEstimate",
    "LinkSpec",
    "MemoryTrace",
    "Op",
    "OpKind",
    "PipeschedError",
    "Placement",
    "Schedule",
    "StageCosts",
    "Timeline",
    "TrainingSettings",
    "TransferTable",
    "Violation",
    "build_stage_costs",
    "formula",
    "generate",
    "load_cluster",
    "load_model",
    "load_schedule",
    "save_schedule",
    "slot_table",
    "summarize",
    "table_metrics",
    "validate",
]
