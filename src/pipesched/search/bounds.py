"""A point's exact peak memory and a lower bound on its iteration time, without simulating it.

Every start time of the engine is a max of sums of durations and links only add to them
(``pipesched.simulate.engine``: monotone), so each of these is at most the simulated time:

- the closed form (level 1) with every stage at the cheapest stage's F, I, W and B and free
  links, where the family's closed form is exact at those costs (it then equals the table
  of equal stages, which no dearer stage and no link can beat);
- the busiest device's work: a device runs its ops one at a time, none before microbatch
  0's forwards reached its first stage: the forwards of the stages before it, then the sum
  of its op times;
- the schedule's table with its real op times and free links (the engine's first pass), and
  after the ops that release it, each gradient all-reduce's own duration on the network.

Iterations run back to back (an asynchronous family, or a steady state) get no time bound:
their iteration is measured between iteration ends, which none of the three bounds.
Otherwise the bound is the largest of the three. The peak memory is exact: a device's memory trace
does not depend on the times (``pipesched.simulate.memory.peak_memory``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipesched.costs import TIMES, StageCosts
from pipesched.experiments.evaluation import (
    STEADY_ITERATIONS,
    in_steady_state,
    sim_schedule,
    with_fb_cost,
)
from pipesched.experiments.point import Point
from pipesched.generators import formula
from pipesched.passes.communication import allreduces
from pipesched.simulate import engine
from pipesched.simulate.graph import TaskGraph, collective_seconds, compile_graph, gradient_bytes
from pipesched.simulate.iterations import compile_iterations
from pipesched.simulate.memory import peak_memory
from pipesched.simulate.network import Network


@dataclass(frozen=True)
class Bound:
    """What a point needs before it is simulated."""

    seconds: float  # lower bound on the iteration time
    closed_form_s: float  # the closed form at the cheapest stage's costs (0 when not exact there)
    work_s: float  # the busiest device's work after its first stage's forwards could arrive
    table_s: float  # the table with real op times, free links, then the all-reduces
    peak_memory: tuple[float, ...]  # bytes per device, exact
    capacity: tuple[float, ...] | None  # bytes per device
    # the graph of one iteration with free communication, which the evaluation lowers its
    # network onto (None for iterations back to back)
    graph: TaskGraph | None = field(default=None, compare=False, repr=False)

    @property
    def worst_device(self) -> int:
        """The device that needs the largest share of its memory (else the most memory)."""
        if self.capacity is None:
            return int(np.argmax(self.peak_memory))
        return int(np.argmax(np.asarray(self.peak_memory) / np.asarray(self.capacity)))

    @property
    def fits(self) -> bool:
        return self.capacity is None or all(p <= c for p, c in zip(self.peak_memory, self.capacity, strict=True))


def lower_bound(point: Point) -> Bound:
    """The memory and time bound of ``point`` (raises PipeschedError when it cannot be built
    or costed, as ``evaluate`` would)."""
    setup = point.setup()
    # the schedule and costs the sim level runs (zb-1p and zb-2p plan with the workload's
    # own costs; an asynchronous family's table holds several iterations)
    schedule = sim_schedule(point, setup)
    costs = with_fb_cost(setup.costs_for(schedule), point.fb_cost)
    network = setup.network_for(schedule)
    capacity = network.capacity[: schedule.num_devices] if network.capacity is not None else None
    if in_steady_state(point):
        # iterations back to back (an asynchronous family, or --steady-state): the iteration
        # time is measured between iteration ends, and a device may start the next
        # iteration's ops before the last one ends everywhere, so neither the flushed table,
        # the fill ramp nor one iteration's work bounds it: no time bound (never pruned);
        # the memory is the whole run's, exact as ever

        graph = compile_iterations(schedule, costs, None, iterations=STEADY_ITERATIONS,
                                   steady=point.steady_state).graph
        closed = work = table = 0.0
        kept = None
    else:
        # free communication: the ops and their memory alone (no transfers to lower)
        graph = compile_graph(schedule, costs, None)
        closed = _closed_form(point, costs)
        work = _work(graph, graph.costs)  # the costs the graph runs (half-size microbatches scaled)
        table = _table(graph, network)
        kept = graph
    return Bound(max(closed, work, table), closed, work, table,
                 tuple(float(x) for x in peak_memory(graph)), capacity, kept)


def _closed_form(point: Point, costs: StageCosts) -> float:
    if point.schedule is not None:
        return 0.0
    # one stage of each op's least time (a bound for every stage)
    cheapest = StageCosts.from_times({name: (min(costs.times(name)),) for name in TIMES})
    estimate = formula(point.family, point.p, point.m, v=point.v, costs=cheapest)
    return estimate.makespan if estimate.exact else 0.0


def _work(graph: TaskGraph, costs: StageCosts) -> float:
    ops = graph.ops
    busy = np.bincount(ops.device, weights=graph.op_duration, minlength=graph.num_devices)
    # the forwards of microbatch 0 through the stages before each stage
    before = np.concatenate([[0.0], np.cumsum(costs.forward)[:-1]])
    first = np.full(graph.num_devices, np.inf)
    np.minimum.at(first, ops.device, before[ops.stage])
    first[~np.isfinite(first)] = 0.0
    return float((first + busy).max()) if graph.num_devices else 0.0


def _table(graph: TaskGraph, network: Network) -> float:
    end, count = engine.free_ends(graph.queue_rows, graph.queue_offsets, graph.pred_ptr, graph.pred_op,
                                  graph.op_duration)
    if count < graph.num_ops or not graph.num_ops:
        return 0.0  # a deadlocked table: the simulation says why
    finish = float(end.max())
    reduces = allreduces(graph.schedule, data_parallel=network.reduces_gradients)
    if len(reduces):
        nbytes = np.array([gradient_bytes(graph.costs, int(s)) for s in reduces.stage], np.float64)
        released = np.where(reduces.after >= 0, end[np.maximum(reduces.after, 0)], 0.0).max(axis=1)
        finish = max(finish, float((released + collective_seconds(network, reduces, nbytes)).max()))
    return finish
