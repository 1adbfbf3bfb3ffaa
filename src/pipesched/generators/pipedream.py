"""PipeDream's pipelines: asynchronous 1F1B without a flush between iterations, and the
synchronous PipeDream-Flush.

- ``pipedream`` (Narayanan et al., SOSP'19): 1F1B in steady state, iteration after
  iteration, each stage updating its weights after every microbatch's backward. A
  microbatch's forward and backward use the same weights (weight stashing), so a stage keeps
  one weight version per microbatch in flight on it: p - s on stage s.
- ``pipedream-2bw`` (Narayanan et al., ICML'21): the same order, with gradients accumulated
  over the m microbatches of an iteration and one update per iteration; every iteration runs
  on the weights one update behind (W(t+1) = W(t) - lr grad(W(t-1))), so each stage keeps
  two versions (double-buffered weights) and every microbatch's weights are one update old.
- ``pipedream-flush``: 1F1B with a flush at the end of every iteration (synchronous: the
  table is ``1f1b``'s), the baseline both are measured against.

An asynchronous table of k iterations is one continuous 1F1B over k x m microbatches
(``iterations``; microbatch j belongs to iteration j // m): there is no ramp between
iterations. Its params say how weights are updated (``update_every`` microbatches per
update, ``version_delay``, ``versions`` kept per stage, ``iteration_microbatches``), which
the multi-iteration
compile (``pipesched.simulate.iterations``) turns into per-stage weight-version waits and
the memory of the extra versions, and from which ``pipesched.weight_versions`` measures the
staleness: how many updates behind a synchronous run the weights are that each forward uses.

Levels. An asynchronous family has no iteration of its own: every level describes its
steady state, iterations back to back (the closed form: the busiest device's work, no
bubble; the table and the simulation: the steady-state iteration of several iterations run
back to back, the fill ramp paid once).
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators.base import Family, FormulaEstimate, check_sizes
from pipesched.generators.one_f_one_b import one_f_one_b, one_f_one_b_formula
from pipesched.limits import check_iterations
from pipesched.schedule import Execution, Schedule, WeightUpdates


def versions_needed(p: int, update_every: int, delay: int = 0) -> tuple[int, ...]:
    """Weight versions each stage of 1F1B's order keeps: one per update batch with a
    microbatch in flight on it. Stage s holds at most p - s microbatches, which span
    ceil((p - s - 1) / u) + 1 batches of u microbatches at most (a new batch begins while
    the earlier ones are still in flight); with a delay (PipeDream-2BW), the newest weights
    are kept beside those in use, two at least.

    >>> versions_needed(4, 1), versions_needed(4, 8, delay=1)
    ((4, 3, 2, 1), (2, 2, 2, 2))
    """
    return tuple(max(1 + -(-(p - s - 1) // update_every), 1 + delay) for s in range(p))


def _asynchronous(name: str, p: int, m: int, iterations: object, update_every: int, delay: int,
                  versions: object) -> Schedule:
    check_sizes(p, m)
    count = check_iterations(iterations)
    needed = versions_needed(p, update_every, delay)
    if versions is not None:
        if not (isinstance(versions, int) and not isinstance(versions, bool)):
            raise PipeschedError(f"versions={versions!r}: give a whole number of weight versions per stage")
        if versions < max(needed):
            stage = needed.index(max(needed))
            what = "microbatches" if update_every == 1 else "iterations"
            raise PipeschedError(
                f"versions={versions}: {name}'s 1F1B order keeps {what} of {max(needed)} different weight versions "
                f"in flight on stage {stage}; give versions >= {max(needed)}")
    table = one_f_one_b(p, count * m)
    execution = Execution(iterations=count, updates=WeightUpdates(update_every, needed, delay))
    return Schedule(name, table.placement, table.num_microbatches, table.device_ops,
                    params={"p": p, "m": m, "iterations": count}, execution=execution)


def pipedream(p: int, m: int, *, iterations: int = 1, versions: int | None = None) -> Schedule:
    """PipeDream's order for ``iterations`` iterations of m microbatches (one weight update
    per microbatch). Stage s keeps p - s weight versions; ``versions``, when given, is the
    most a stage may keep and must cover that.

    >>> [str(op) for op in pipedream(2, 2, iterations=2).device_ops[0]]
    ['0F0', '0F1', '0B0', '0F2', '0B1', '0F3', '0B2', '0B3']
    """
    return _asynchronous("pipedream", p, m, iterations, 1, 0, versions)


def pipedream_2bw(p: int, m: int, *, iterations: int = 1, versions: int | None = None) -> Schedule:
    """PipeDream-2BW: PipeDream's order with one update per iteration of m microbatches
    (gradient accumulation): two weight versions per stage when m >= p - 1 (more when an
    iteration has fewer microbatches than a stage holds in flight); ``versions`` as for
    ``pipedream``."""
    return _asynchronous("pipedream-2bw", p, m, iterations, m, 1, versions)


def pipedream_flush(p: int, m: int) -> Schedule:
    """PipeDream-Flush: 1F1B, flushed every iteration (synchronous)."""
    table = one_f_one_b(p, m)
    return Schedule("pipedream-flush", table.placement, m, table.device_ops, params=dict(table.params))


def steady_state_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    # iterations back to back with no flush: every device runs 1F1B's steady F, B pairs, the
    # busiest device's work is the iteration; 1F1B's activations
    return FormulaEstimate(
        idle=0.0,
        work=m * (c.f + c.b),
        peak_inflight=min(p, m),
        activation_units=min(p, m),
        exact=True,
        note="steady state of iterations back to back (no flush): the busiest device's work; weights "
             "are stale (see staleness)",
    )


_OPTIONS = ("iterations", "versions")


def table_shape(p: int, m: int, v: int, options: dict[str, object]) -> tuple[int, int]:
    """p stages; one continuous 1F1B over iterations x m microbatches."""
    return p, check_iterations(options.get("iterations", 1)) * m


def _family_without_flush(name: str, summary: str, constraints: str, build) -> Family:
    """A family without a flush: iterations back to back, its closed form the steady state's."""
    return Family(name=name, summary=summary, constraints=constraints, build=build, formula=steady_state_formula,
                  options=_OPTIONS, asynchronous=True, shape=table_shape)


FAMILY = _family_without_flush(
    "pipedream",
    "asynchronous 1F1B, weight stashing: an update per microbatch, p - s versions on stage s",
    "p >= 2, m >= 1; asynchronous (no flush); versions >= p",
    lambda p, m, *, v=None, **options: pipedream(p, m, **options),
)

FAMILY_2BW = _family_without_flush(
    "pipedream-2bw",
    "asynchronous 1F1B, double-buffered weights: an update per iteration, 2 versions",
    "p >= 2, m >= 1; asynchronous (no flush); versions >= 2",
    lambda p, m, *, v=None, **options: pipedream_2bw(p, m, **options),
)

FAMILY_FLUSH = Family(
    name="pipedream-flush",
    summary="PipeDream-Flush: 1F1B flushed every iteration (the synchronous baseline)",
    constraints="p >= 2, m >= 1",
    build=lambda p, m, *, v=None: pipedream_flush(p, m),
    formula=one_f_one_b_formula,
)
