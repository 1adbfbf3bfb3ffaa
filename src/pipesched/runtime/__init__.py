"""Real runs: schedules executed on P local ranks with PyTorch, layers profiled in
isolation, and the simulator checked against measured step times; serving traces run for
real (prefill and decode with a KV cache) and checked against the serving engine.

Importing this package does not import torch; the functions start rank processes that do.

>>> from pipesched.runtime import RunOptions
>>> RunOptions().backend
'gloo'
"""

from __future__ import annotations

from pipesched.runtime.check import CheckReport, CheckRow, check_schedules
from pipesched.runtime.launch import Fault
from pipesched.runtime.profile import (
    LinkProfile,
    ProfileOptions,
    add_op_overhead,
    layer_costs_csv,
    link_yaml,
    profile_layers,
    profile_link,
    profile_overhead,
    profile_stages,
    stage_costs_csv,
)
from pipesched.runtime.runs import RunOptions, RunResult, choose_runtime, run_schedules
from pipesched.runtime.serve_check import ServeCheckReport, serve_check
from pipesched.runtime.serve_run import ServeRunOptions, ServeRunReport, serve_run

__all__ = [
    "CheckReport",
    "CheckRow",
    "Fault",
    "LinkProfile",
    "ProfileOptions",
    "RunOptions",
    "RunResult",
    "ServeCheckReport",
    "ServeRunOptions",
    "ServeRunReport",
    "add_op_overhead",
    "check_schedules",
    "choose_runtime",
    "layer_costs_csv",
    "link_yaml",
    "profile_layers",
    "profile_link",
    "profile_overhead",
    "profile_stages",
    "run_schedules",
    "serve_check",
    "serve_run",
    "stage_costs_csv",
]
