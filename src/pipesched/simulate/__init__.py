"""Level 3: communication-aware simulation of a schedule.

``lowering`` turns a Schedule, StageCosts and a Network into a task graph of arrays;
``engine`` runs it (compute streams, send/receive channels, shared NICs); ``memory`` follows
memory over time; ``simulate`` ties them into a Timeline.
"""

from __future__ import annotations

from pipesched.simulate.critical import CriticalPath, critical_path
from pipesched.simulate.network import Network
from pipesched.simulate.simulator import simulate

__all__ = ["CriticalPath", "Network", "critical_path", "simulate"]
