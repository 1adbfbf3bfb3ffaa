"""Level 3: communication-aware simulation of a schedule.

``graph.compile_graph`` turns a Schedule, StageCosts and a Network into an immutable task
graph of arrays, once; ``run.run`` runs it (compute queues, send/receive channels, shared
NICs, memory over time) with its own durations or new ones, and ``run.run_batch`` runs a
batch of duration vectors in one compiled loop; ``simulate`` is compile then run.
``policy.run_policy`` runs work a policy picks at run time (continuous batching).
"""

from __future__ import annotations

from pipesched.simulate.critical import CriticalPath, critical_path
from pipesched.simulate.graph import TaskGraph, compile_graph
from pipesched.simulate.network import Network
from pipesched.simulate.policy import (
    Job,
    Launch,
    PolicyRun,
    PolicyState,
    batching,
    first_come_first_served,
    run_policy,
)
from pipesched.simulate.run import BatchResult, run, run_batch
from pipesched.simulate.simulator import simulate

__all__ = ["BatchResult", "CriticalPath", "Job", "Launch", "Network", "PolicyRun", "PolicyState", "TaskGraph",
           "batching", "compile_graph", "critical_path", "first_come_first_served", "run", "run_batch",
           "run_policy", "simulate"]
