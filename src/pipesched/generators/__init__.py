"""Schedule families, registered by name. Each module holds one family's pure generator and
its closed-form model, exported as ``FAMILY``."""

from __future__ import annotations

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
    v_half,
    v_min,
    zb_h1,
    zb_h2,
    zb_v,
)
from pipesched.generators.base import Family, FormulaEstimate, SlotCosts
from pipesched.limits import MAX_DEVICES, MAX_STAGES, check_count, check_table_size
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
        raise PipeschedError(f"schedule={shorten(name)!r}: unknown family{suggest(name, FAMILIES)}; "
                             f"known families: {known}") from None


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


def _check_size(p: int, m: int, v: int) -> None:
    """Refuse sizes over the limits before any op is built (the families check the rest)."""
    check_count("p", p, MAX_DEVICES, minimum=None, what="pipeline devices")
    check_count("v", v, MAX_STAGES, minimum=None, what="stages")
    check_table_size(max(p, 1) * max(v, 1), m, label=f"p{p} x m{m} x v{v}")


def formula(name: str, p: int, m: int, *, v: int | None = None, costs: SlotCosts | None = None) -> FormulaEstimate:
    """Level 1: the family's closed-form bubble and peak in-flight activations."""
    family = get_family(name)
    return family.formula(p, m, family.resolve_v(v), costs or SlotCosts())


__all__ = ["FAMILIES", "Family", "FormulaEstimate", "SlotCosts", "formula", "generate", "get_family"]
