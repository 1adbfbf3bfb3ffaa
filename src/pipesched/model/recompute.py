"""Activation recompute per stage: none, selective or full on each stage of a pipeline.

A recomputed stage keeps fewer activations from its forward and redoes part of the forward
inside its backward (``pipesched.model.transformer``: selective redoes the attention core,
full the whole layer from its kept input). Stages may choose differently: the first stages
of a 1F1B pipeline hold the most microbatches and gain most from recompute.

``--recompute`` text, one of:

- ``MODE``: every stage (``none``, ``selective`` or ``full``);
- ``MODE,MODE,...``: one mode per stage, in stage order;
- ``MODE:STAGES`` items (``full:0-3``, ``full:0-1,selective:2-5``), with one bare ``MODE``
  item for the stages not named (default ``none``).

>>> recompute_modes("full:0-1,selective", 4)
('full', 'full', 'selective', 'selective')
>>> recompute_modes("none,full", 2), recompute_modes("full", 3)
(('none', 'full'), ('full', 'full', 'full'))
"""

from __future__ import annotations

from pipesched.errors import PipeschedError
from pipesched.indices import parse_indices
from pipesched.model.spec import RECOMPUTE_MODES


def _items(text: str) -> list[str]:
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if not items:
        raise PipeschedError(f"recompute={str(text)[:40]!r}: choose one of {', '.join(RECOMPUTE_MODES)}, "
                             "or per stage like full,none,none,selective or full:0-3")
    return items


def _mode(item: str) -> str:
    if item not in RECOMPUTE_MODES:
        raise PipeschedError(f"recompute={item[:40]!r}: choose one of {', '.join(RECOMPUTE_MODES)} (per stage: "
                             "full,none,none,selective, or MODE:STAGES items like full:0-3)")
    return item


def check_recompute(text: str) -> None:
    """Raise PipeschedError naming the bad part unless ``text`` is recompute text (stage
    numbers are checked once the stage count is known: ``recompute_modes``)."""
    items = _items(text)
    bare = [item for item in items if ":" not in item]
    for item in items:
        _mode(item.partition(":")[0].strip())
    if len(bare) < len(items) and len(bare) > 1:
        raise PipeschedError(f"recompute={text[:60]!r}: give one bare MODE for the stages not named, not {len(bare)}")


def uniform_mode(text: str) -> str | None:
    """The mode when ``text`` names one mode for every stage, else None."""
    check_recompute(text)
    items = _items(text)
    modes = {item.partition(":")[0].strip() for item in items}
    if len(items) == 1 and ":" not in items[0]:
        return items[0]
    if all(":" not in item for item in items) and len(modes) == 1:
        return modes.pop()
    return None


def recompute_modes(text: str, num_stages: int) -> tuple[str, ...]:
    """The mode of each of ``num_stages`` stages (see the module docstring)."""
    check_recompute(text)
    items = _items(text)
    if all(":" not in item for item in items):
        if len(items) == 1:
            return (items[0],) * num_stages
        if len(items) != num_stages:
            raise PipeschedError(f"recompute={text[:60]!r}: {len(items)} modes for {num_stages} stages; give one "
                                 "per stage, or MODE:STAGES items like full:0-3")
        return tuple(items)
    rest = next((item for item in items if ":" not in item), "none")
    modes = [rest] * num_stages
    named: set[int] = set()
    for item in items:
        if ":" not in item:
            continue
        mode, _, stages = (part.strip() for part in item.partition(":"))
        chosen = parse_indices(stages, field="recompute", count=num_stages, what="stages")
        twice = named.intersection(chosen)
        if twice:
            raise PipeschedError(f"recompute={item}: stage {min(twice)} is named twice; give each stage one mode")
        named.update(chosen)
        for stage in chosen:
            modes[stage] = mode
    return tuple(modes)
