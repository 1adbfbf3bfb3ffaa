"""Schedule families, registered by name. Each module holds one family's pure generator and
its closed-form model, exported as ``FAMILY``."""

from __future__ import annotations

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
    v_half,
    v_min,
    zb_1p,
    zb_2p,
    zb_h1,
    zb_h2,
    zb_v,
)
from pipesched.generators.base import Family, FormulaEstimate, SlotCosts
from pipesched.schedule import Schedule

# Listing order is the order of `pipesched list` and of comparisons.
FAMILIES: dict[str, Family] = {
    module.FAMILY.name: module.FAMILY
    for module in (
        gpipe,
        one_f_one_b,
        interleaved,
        looped_bfs,
        zb_h1,
        zb_h2,
        zb_1p,
        zb_2p,
        zb_v,
        v_half,
        v_min,
        chimera,
        hanayo,
        dualpipe,
        dualpipev,
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
    _check_size(p, m, family.resolve_v(v))
    unknown = sorted(set(options) - set(family.options))
    if unknown:
        raise PipeschedError(
            f"option={unknown[0]}: {name} does not take it; it takes {', '.join(family.options) or 'no options'}"
        )
    chunks = family.resolve_v(v)
    if family.chunks is None:
        return family.build(p, m, v=chunks, **options)
    return family.build(p, m, **options)


# Largest table generate() builds: 2^23 ops, ten times ZB-V at p=128, m=1024 (786k ops),
# about 1 GiB of op tuples; larger sizes are almost surely a typo.
MAX_OPS = 2**23


def _check_size(p: int, m: int, v: int) -> None:
    ops = 3 * max(p, 1) * max(v, 1) * max(m, 1)  # upper bound: F, I, W per stage-microbatch
    if ops > MAX_OPS:
        raise PipeschedError(
            f"size=p{p} x m{m} x v{v}: about {ops:,} ops, over the {MAX_OPS:,} this tool builds; "
            "lower p, m or v"
        )


def formula(name: str, p: int, m: int, *, v: int | None = None, costs: SlotCosts | None = None) -> FormulaEstimate:
    """Level 1: the family's closed-form bubble and peak in-flight activations."""
    family = get_family(name)
    return family.formula(p, m, family.resolve_v(v), costs or SlotCosts())


__all__ = ["FAMILIES", "Family", "FormulaEstimate", "SlotCosts", "formula", "generate", "get_family"]
