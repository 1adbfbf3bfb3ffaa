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

# Every public name is imported on first use, so that `import pipesched` (and the command
# line's start) costs next to nothing; numpy, numba and the model package load when a
# name that needs them is first touched. No submodule shares a name with a public name (a
# submodule, once imported, is bound over the package attribute of its name): the validator
# is ``pipesched.validation``, the slot table ``pipesched.slots``. The simulator and the
# comparison live in the subpackages of the same name: ``from pipesched.simulate import
# simulate, Network``; ``from pipesched.compare import compare``.
_LAZY = {
    "StageCosts": "pipesched.costs",
    "PipeschedError": "pipesched.errors",
    "FAMILIES": "pipesched.generators",
    "formula": "pipesched.generators",
    "generate": "pipesched.generators",
    "FormulaEstimate": "pipesched.generators.base",
    "load_schedule": "pipesched.io",
    "save_schedule": "pipesched.io",
    "Op": "pipesched.ops",
    "OpKind": "pipesched.ops",
    "Placement": "pipesched.schedule",
    "Schedule": "pipesched.schedule",
    "slot_table": "pipesched.slots",
    "table_metrics": "pipesched.slots",
    "MemoryTrace": "pipesched.timeline",
    "Timeline": "pipesched.timeline",
    "TransferTable": "pipesched.timeline",
    "Violation": "pipesched.validation",
    "validate": "pipesched.validation",
    "summarize": "pipesched.metrics",
    "Cluster": "pipesched.model.hardware",
    "DeviceSpec": "pipesched.model.hardware",
    "LinkSpec": "pipesched.model.hardware",
    "load_model": "pipesched.model",
    "load_cluster": "pipesched.model",
    "build_stage_costs": "pipesched.model",
    "TrainingSettings": "pipesched.model",
    "RULES": "pipesched.rules",
    "Point": "pipesched.experiments",
    "evaluate": "pipesched.experiments",
    "compile_graph": "pipesched.simulate",
}

if TYPE_CHECKING:
    from pipesched.costs import StageCosts
    from pipesched.errors import PipeschedError
    from pipesched.experiments import Point, evaluate
    from pipesched.generators import FAMILIES, formula, generate
    from pipesched.generators.base import FormulaEstimate
    from pipesched.io import load_schedule, save_schedule
    from pipesched.metrics import summarize
    from pipesched.model import TrainingSettings, build_stage_costs, load_cluster, load_model
    from pipesched.model.hardware import Cluster, DeviceSpec, LinkSpec
    from pipesched.ops import Op, OpKind
    from pipesched.rules import RULES
    from pipesched.schedule import Placement, Schedule
    from pipesched.simulate import compile_graph
    from pipesched.slots import slot_table, table_metrics
    from pipesched.timeline import MemoryTrace, Timeline, TransferTable
    from pipesched.validation import Violation, validate


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pipesched' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "FAMILIES",
    "RULES",
    "Cluster",
    "DeviceSpec",
    "FormulaEstimate",
    "LinkSpec",
    "MemoryTrace",
    "Op",
    "OpKind",
    "PipeschedError",
    "Placement",
    "Point",
    "Schedule",
    "StageCosts",
    "Timeline",
    "TrainingSettings",
    "TransferTable",
    "Violation",
    "build_stage_costs",
    "compile_graph",
    "evaluate",
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
