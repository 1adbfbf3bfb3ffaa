"""Schedule families, registered by name. Each module holds one family's pure generator and
its closed-form model, exported as ``FAMILY``."""

from __future__ import annotations

import functools
import gc
from dataclasses import replace

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
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
    v_half,
    v_min,
    zb_1p,
    zb_2p,
    zb_h1,
    zb_h2,
    zb_v,
)
from pipesched.generators.base import Family, FormulaEstimate
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
        v_half.FAMILY,
        v_min.FAMILY,
        chimera.FAMILY,
        hanayo.FAMILY,
        dualpipe.FAMILY,
        dualpipev.FAMILY,
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
        raise PipeschedError(f"schedule={name!r}: unknown family; known families: {known}") from None


def generate(name: str, p: int, m: int, *, v: int | None = None, **options: object) -> Schedule:
    """Build family ``name``'s schedule for p devices, m microbatches (and v chunks).

    >>> generate("1f1b", 4, 8).num_ops
    64
    """
    family = get_family(name)
    chunks = family.resolve_v(v)
    ops = _check_size(p, m, chunks)
    family.check_options(options)
    key = tuple(sorted(options.items()))
    if ops <= CACHED_OPS and _hashable(key):
        return _generate_cached(name, p, m, chunks, key)
    return _build(name, p, m, chunks, key)


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


# Generated schedules are pure functions of their arguments and immutable: a grid of
# experiments reuses them. Tables up to this many ops are kept (about 10 MB each at most).
CACHED_OPS = 100_000
# Above this many ops the garbage collector pauses while the table is built: a table is
# millions of small tuples that all survive, which the collector would scan again and again.
QUIET_GC_OPS = 50_000


@functools.lru_cache(maxsize=256)
def _generate_cached(name: str, p: int, m: int, v: int, options: tuple[tuple[str, object], ...]) -> Schedule:
    return _build(name, p, m, v, options)


def _build(name: str, p: int, m: int, v: int, options: tuple[tuple[str, object], ...]) -> Schedule:
    family = FAMILIES[name]
    pause = 3 * p * v * m > QUIET_GC_OPS and gc.isenabled()
    if pause:
        gc.disable()
    try:
        if family.chunks is None:
            return family.build(p, m, v=v, **dict(options))
        return family.build(p, m, **dict(options))
    finally:
        if pause:
            gc.enable()


# Largest table generate() builds: 2^23 ops, ten times ZB-V at p=128, m=1024 (786k ops),
# about 1 GiB of op tuples; larger sizes are almost surely a typo.
MAX_OPS = 2**23


def _check_size(p: int, m: int, v: int) -> int:
    """The most ops the table can have (F, I, W per stage-microbatch), within MAX_OPS."""
    ops = 3 * max(p, 1) * max(v, 1) * max(m, 1)
    if ops > MAX_OPS:
        raise PipeschedError(
            f"size=p{p} x m{m} x v{v}: about {ops:,} ops, over the {MAX_OPS:,} this tool builds; "
            "lower p, m or v"
        )
    return ops


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
    taken = {key: value for key, value in options.items() if key in family.formula_options}
    estimate = family.formula(p, m, chunks, costs, **taken)
    if estimate.exact and not costs.is_uniform:
        estimate = replace(estimate, exact=False, note="the stages' costs differ; the closed form takes the slowest stage's")
    return estimate


__all__ = ["FAMILIES", "Family", "FormulaEstimate", "formula", "generate", "get_family"]
