"""``simulate``: level 3, a schedule run with real op times and communication costs: compile
the task graph once (``graph.compile_graph``), run it (``run.run``)."""

from __future__ import annotations

from collections.abc import Sequence

from pipesched.costs import StageCosts
from pipesched.schedule import Schedule
from pipesched.simulate.graph import compile_graph
from pipesched.simulate.network import Network
from pipesched.simulate.run import run
from pipesched.timeline import Timeline


def simulate(
    schedule: Schedule,
    costs: StageCosts,
    network: Network,
    *,
    contention: bool = True,
    overlap: bool = True,
    memory_capacity: Sequence[float] | None = None,
) -> Timeline:
    """Simulate one training iteration of ``schedule``.

    costs: per-stage op times (seconds) and sizes (bytes), one entry per schedule stage.
    network: links between the devices; pipeline device d is network device d.
    contention: transfers sharing a channel (a device's send or receive side, a shared NIC)
        queue one behind the other; False lets every transfer run at full speed at once.
    overlap: devices compute while they communicate; False models a blocking runtime: a
        device sends and receives in batches between its steps of compute and waits each
        batch out (``pipesched.simulate.blocking``; raises PipeschedError, naming what each
        device waits for, on a table such a runtime cannot run).
    memory_capacity: device memory in bytes for the out-of-memory flags (default: the
        network's device capacities, when known).

    Returns a Timeline (source "simulated", unit "s") with op rows in table order, every
    transfer, the memory trace, and in ``simulation``: the critical path, the
    optimizer-step time of each device and the settings used.

    >>> from pipesched.generators import generate
    >>> timeline = simulate(generate("1f1b", 4, 8), StageCosts.uniform(4),
    ...                     Network.uniform(4, latency=0.0, bandwidth=float("inf")))
    >>> timeline.makespan  # (m + p - 1) x (F + B) with F = 1, B = 2
    33.0
    """
    graph = compile_graph(schedule, costs, network, contention=contention, overlap=overlap)
    return run(graph, memory_capacity=memory_capacity)
