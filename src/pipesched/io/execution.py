"""A schedule file's execution: the ``execution`` object (JSON) or ``# execution:`` line
(grid text) that ``Execution.to_dict`` writes, or, in files written before it existed, the
same meaning spread over ``params``.

Such older files kept in ``params`` the keys ``microbatch_fraction``, ``iterations``,
``iteration_microbatches``, ``recompute_stages``, ``offload``, ``asynchronous``,
``update_every``, ``versions`` and ``version_delay``; ``read_execution`` lifts them into
the typed ``Execution`` and leaves the rest of ``params`` for display.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pipesched.errors import require
from pipesched.schedule import Execution

# params keys of older files, and the execution key each one became
_RENAMED = {"microbatch_fraction": "microbatch_fraction", "iterations": "iterations",
            "recompute_stages": "recompute_stages", "offload": "offload_stages"}
# params keys of older files' asynchronous weight updates, and their WeightUpdates names
_UPDATES = {"update_every": "update_every", "versions": "versions", "version_delay": "delay"}
# the ones left for display: ``iterations`` is also the family option the user gave
_LEGACY = tuple(key for key in (*_RENAMED, *_UPDATES, "asynchronous", "iteration_microbatches")
                if key != "iterations")


def read_execution(execution: object, params: Mapping[str, object], *, num_stages: int,
                   num_microbatches: int, where: str) -> tuple[dict[str, object], Execution]:
    """(display params, execution) of a file: ``execution`` is its execution object (None
    when the file has none, as in files written before it: then ``params`` says it).
    ``where`` prefixes the field names of errors (``FILE: field``)."""
    if execution is not None:
        require(isinstance(execution, dict), f"{where}execution", str(execution), "must be a JSON object")
        found = Execution.from_dict(execution, num_stages=num_stages,  # type: ignore[arg-type]
                                    num_microbatches=num_microbatches, field_name=f"{where}execution")
        return dict(params), found
    display = {key: value for key, value in params.items() if key not in _LEGACY}
    data: dict[str, object] = {new: params[old] for old, new in _RENAMED.items() if old in params}
    if params.get("asynchronous"):
        data["updates"] = {new: params[old] for old, new in _UPDATES.items() if old in params}
    field_name = f"{where}params"
    if "iteration_microbatches" in params and "iterations" not in params:
        data["iterations"] = _iterations(params, num_microbatches, field_name)
    found = Execution.from_dict(data, num_stages=num_stages, num_microbatches=num_microbatches,
                                field_name=field_name)
    if "iteration_microbatches" in params:
        stated = params["iteration_microbatches"]
        require(stated == found.iteration_microbatches(num_microbatches),
                f"{field_name}.iteration_microbatches", str(stated),
                "must be the table's microbatches times their fraction over its iterations; remove it")
    return display, found


def _iterations(params: Mapping[str, object], num_microbatches: int, field_name: str) -> int:
    """The iterations an older file's ``iteration_microbatches`` implies: the table's
    microbatches times their fraction over those of one iteration, a whole number."""
    stated = params["iteration_microbatches"]
    fraction = params.get("microbatch_fraction", 1.0)
    ok = isinstance(stated, int) and not isinstance(stated, bool) and stated >= 1
    count = num_microbatches * fraction / stated if ok and isinstance(fraction, int | float) else 0.0
    whole = math.isfinite(count) and count >= 1 and count == int(count)
    require(whole, f"{field_name}.iteration_microbatches", str(stated),
            f"give the microbatches of one iteration, a divisor of the table's {num_microbatches} (times their "
            "fraction), or remove it")
    return int(count)
