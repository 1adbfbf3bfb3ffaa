"""Level 3: communication-aware simulation of a schedule.

``graph.compile_graph`` turns a Schedule, StageCosts and a Network into an immutable task
graph of arrays, once; ``run.run`` runs it (compute queues, send/receive channels, shared
NICs, memory over time) with its own durations or new ones, and ``run.run_batch`` runs a
batch of duration vectors in one compiled loop; ``simulate`` is compile then run.
"""

from __future__ import annotations

from pipesched.simulate.critical import CriticalPath, critical_path
from pipesched.simulate.graph import TaskGraph, compile_graph
from pipesched.simulate.network import Network
from pipesched.simulate.run import BatchResult, run, run_batch
from pipesched.simulate.simulator import simulate

__all__ = ["BatchResult", "CriticalPath", "Network", "TaskGraph", "compile_graph", "critical_path", "run",
           "run_batch", "simulate"]
