"""Schedule families, registered by name. Each module holds one family's pure generator and
its closed-form model, exported as ``FAMILY``."""

from __future__ import annotations

import gc
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import replace

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError, shorten, suggest
from pipesched.generators import (
    chimera,
    dualpipe,
    dualpipev,
    gpipe,
    hanayo,
    interleaved,
    looped_bfs,
    one_f_one_b,
    pipedream,
    terapipe,
    v_controllable,
    zb_1p,
    zb_2p,
    zb_h1,
    zb_h2,
    zb_v,
)
from pipesched.generators.base import Family, FormulaEstimate, per_stage_costs
from pipesched.limits import (
    MAX_DEVICES,
    MAX_MICROBATCHES,
    MAX_STAGES,
    check_count,
    check_table_size,
)
from pipesched.schedule import Schedule

# Listing order is the order of `pipesched list` and of comparisons: the synchronous
# families, then the asynchronous ones (PipeDream-Flush, their synchronous baseline, first).
FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        gpipe.FAMILY,
        one_f_one_b.FAMILY,
        interleaved.FAMILY,
        looped_bfs.FAMILY,
        zb_h1.FAMILY,
        zb_h2.FAMILY,
        zb_1p.FAMILY,
        zb_2p.FAMILY,
        zb_v.FAMILY,
        v_controllable.FAMILY_HALF,
        v_controllable.FAMILY_MIN,
        chimera.FAMILY,
        hanayo.FAMILY,
        dualpipe.FAMILY,
        dualpipev.FAMILY,
        terapipe.FAMILY,
        pipedream.FAMILY_FLUSH,
        pipedream.FAMILY,
        pipedream.FAMILY_2BW,
    )
}


def get_family(name: str) -> Family:
    """Look a family up by name; the error lists the known names."""
    try:
        return FAMILIES[name]
    except KeyError:
        known = ", ".join(FAMILIES)
        raise PipeschedError(f"schedule={shorten(name)!r}: unknown family{suggest(name, FAMILIES)}; "
                             f"known families: {known}") from None


def generate(name: str, p: int, m: int, *, v: int | None = None, frozen: Iterable[int] = (),
             **options: object) -> Schedule:
    """Build family ``name``'s schedule for p devices, m microbatches (and v chunks), with
    the stages ``frozen`` frozen (``pipesched.passes.freeze``: the ops they do not run left
    out; see ``frozen_schedule`` for the zero-bubble families).

    >>> generate("1f1b", 4, 8).num_ops
    64
    >>> generate("1f1b", 4, 8, frozen={0, 1}).num_ops
    48
    """
    family = get_family(name)
    chunks = family.resolve_v(v)
    family.check_options(options)
    ops = _check_size(family, p, m, chunks, options)
    key = tuple(sorted(options.items()))
    stages = tuple(sorted({int(stage) for stage in frozen}))
    if ops <= CACHED_OPS and _hashable(key):
        if stages:
            return _frozen_cached(name, p, m, chunks, key, stages)
        return _generate_cached(name, p, m, chunks, key)
    if stages:
        return frozen_schedule(name, _build(name, p, m, chunks, key), stages, dict(key))
    return _build(name, p, m, chunks, key)


def _frozen_cached(name: str, p: int, m: int, v: int, options: tuple[tuple[str, object], ...],
                   frozen: tuple[int, ...]) -> Schedule:
    return _SCHEDULES.get((name, p, m, v, options, frozen),
                          lambda: frozen_schedule(name, _generate_cached(name, p, m, v, options), frozen, dict(options)))


def frozen_schedule(name: str, schedule: Schedule, frozen: Iterable[int], options: dict[str, object]) -> Schedule:
    """Family ``name``'s ``schedule`` with the stages ``frozen`` frozen.

    The family's order with the dropped ops left out (``pipesched.passes.freeze``). A
    family whose heuristic plans with costs (the zero-bubble families) is also planned
    again with the dropped ops at zero cost, so that it fills its bubbles with the W of
    trainable stages only; the shorter of the two slot tables is kept (the plain one on a
    tie).
    """
    from pipesched.passes.freeze import freeze
    from pipesched.slots import slot_table

    family = FAMILIES[name]
    kept = freeze(schedule, frozen)
    if "costs" not in family.options:
        return kept
    given = per_stage_costs(options.get("costs"), schedule.num_stages, name)  # type: ignore[arg-type]
    costs = given.for_roles(kept.roles, kept.rules)  # the dropped ops at zero cost
    chunks = schedule.num_stages // schedule.num_devices
    replanned = freeze(_build(name, schedule.num_devices, schedule.num_microbatches, chunks,
                              tuple(sorted({**options, "costs": costs}.items()))), frozen)
    if slot_table(replanned, costs).makespan < slot_table(kept, costs).makespan:
        return replanned
    return kept


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


# Generated schedules are pure functions of their arguments and immutable: a grid of
# experiments reuses them, and a command asks for its table twice (to read the schedule,
# then to simulate it). Tables up to half the budget are kept (about 100 MB), the most
# recently used first, up to CACHE_BUDGET_OPS ops in all (about 200 MB): a grid of a few
# hundred schedule points, each under several workloads, stays cached whole.
CACHE_BUDGET_OPS = 2_000_000
CACHED_OPS = CACHE_BUDGET_OPS // 2
# Above this many ops the garbage collector pauses while the table is built: a table is
# millions of small tuples that all survive, which the collector would scan again and again.
QUIET_GC_OPS = 50_000


class _OpsBudgetCache:
    """Least-recently-used schedules, bounded by their ops in all (not by their count: a
    grid holds many small tables and few large ones)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held: OrderedDict[tuple, Schedule] = OrderedDict()
        self.ops = 0

    def get(self, key: tuple, build) -> Schedule:
        found = self.held.get(key)
        if found is not None:
            self.held.move_to_end(key)
            return found
        schedule = build()
        self.held[key] = schedule
        self.ops += schedule.num_ops
        while self.ops > self.budget and len(self.held) > 1:
            _, dropped = self.held.popitem(last=False)
            self.ops -= dropped.num_ops
        return schedule


_SCHEDULES = _OpsBudgetCache(CACHE_BUDGET_OPS)


def _generate_cached(name: str, p: int, m: int, v: int, options: tuple[tuple[str, object], ...]) -> Schedule:
    return _SCHEDULES.get((name, p, m, v, options), lambda: _build(name, p, m, v, options))



def _build(name: str, p: int, m: int, v: int, options: tuple[tuple[str, object], ...]) -> Schedule:
    family = FAMILIES[name]
    pause = 3 * p * v * m > QUIET_GC_OPS and gc.isenabled()
    if pause:
        gc.disable()
    try:
        if family.takes_v:
            return family.build(p, m, v=v, **dict(options))
        return family.build(p, m, **dict(options))
    finally:
        if pause:
            gc.enable()


def _check_size(family: Family, p: int, m: int, v: int, options: dict[str, object], *, ops: bool = True) -> int:
    """Refuse sizes over the limits before any op is built (the families check the rest):
    p, v and the table the options ask for (``Family.shape``: its stages and microbatches,
    and with ``ops`` its ops); the most ops the table can have (F, I, W per stage-microbatch)."""
    check_count("p", p, MAX_DEVICES, minimum=None, what="pipeline devices")
    check_count("v", v, MAX_STAGES, minimum=None, what="stages")
    plain = (max(p, 1) * max(v, 1), max(m, 1))
    stages, microbatches = family.shape(max(p, 1), max(m, 1), max(v, 1), options)
    if (stages, microbatches) != plain:
        _check_shaped(stages, microbatches, p, m, options)
    if ops:
        check_table_size(stages, microbatches, label=f"p{p} x m{m} x v{v}" if (stages, microbatches) == plain
                         else f"{stages} stages x m{microbatches} (p{p}, m{m}, {_worded(options)})")
    else:
        check_count("stages", stages, MAX_STAGES, minimum=None, what="stages")
        check_count("m", microbatches, MAX_MICROBATCHES, minimum=None, what="microbatches")
    return 3 * stages * microbatches


def _check_shaped(stages: int, microbatches: int, p: int, m: int, options: dict[str, object]) -> None:
    """The error for a table whose options (waves, iterations, halving) take it over the
    stage or microbatch limit: it names those options, which the table's sizes come from."""
    for count, limit, what in ((stages, MAX_STAGES, "stages"), (microbatches, MAX_MICROBATCHES, "microbatches")):
        if count > limit:
            raise PipeschedError(f"{_worded(options) or f'p={p}'}: with p={p}, m={m} the table has {count:,} {what}, "
                                 f"over the limit of {limit:,} {what}; lower {'p' if what == 'stages' else 'm'} or the option")


def _worded(options: dict[str, object]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(options.items()) if key != "costs")


def formula(name: str, p: int, m: int, *, v: int | None = None, costs: StageCosts | None = None,
            **options: object) -> FormulaEstimate:
    """Level 1: the family's closed-form bubble and peak in-flight activations, with the F, I
    and W of one stage of ``costs`` (default F = I = W = 1 slot) and the family's options
    (those that change its table: ``forward_doubling``, ``waves``, ``fused``, ...; the others,
    such as the heuristics' ``costs``, leave the closed form as it is). Costs that differ
    between stages make the estimate approximate: the closed forms assume equal stages and
    take the slowest stage's.

    >>> formula("chimera", 4, 16).idle, formula("chimera", 4, 16, forward_doubling=0).idle
    (3.0, 10.0)
    """
    family = get_family(name)
    family.check_options(options)
    costs = costs if costs is not None else StageCosts.slots()
    chunks = family.resolve_v(v)
    _check_size(family, p, m, chunks, options, ops=False)  # the table it describes: stages, microbatches
    taken = {key: value for key, value in options.items() if key in family.formula_options}
    estimate = family.formula(p, m, chunks, costs, **taken)
    if estimate.exact and not costs.is_uniform:
        estimate = replace(estimate, exact=False, note="the stages' costs differ; the closed form takes the slowest stage's")
    return estimate


__all__ = ["FAMILIES", "Family", "FormulaEstimate", "formula", "generate", "get_family"]
