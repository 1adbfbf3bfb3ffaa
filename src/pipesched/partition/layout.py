"""Megatron-LM pipeline layout strings (``--pipeline-model-parallel-layout``).

Stages are separated by ``|``, in model order (stage s runs on pipeline rank s mod p, virtual
stage s // p). Letters: ``E`` embedding, ``t`` transformer layer, ``m`` MTP layer, ``L`` loss
(final norm, output layer, loss). ``x*n`` repeats a letter, ``(...)*n`` repeats a group, and
commas are cosmetic. Empty stages are allowed: ``E||t|L``.

    >>> text = "Et*3|(tt|)*29,m|L"
    >>> kinds = "E" + "t" * 61 + "mL"
    >>> partition = parse_layout(text, kinds)
    >>> partition.num_stages, partition.sizes[:3]
    (32, (4, 2, 2))
    >>> format_layout(partition, kinds) == text
    True
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import groupby

from pipesched.errors import PipeschedError, require
from pipesched.limits import MAX_LAYERS, MAX_STAGES, parse_int
from pipesched.partition.core import Partition

LETTERS = ("E", "t", "m", "L")
# the longest expanded layout: every layer's letter and a separator per stage
_MAX_LAYOUT_CHARS = MAX_LAYERS + 2 * MAX_STAGES
_GROUP = re.compile(r"\(([^()]+)\)\*(\d+)")
_REPEAT = re.compile(r"(.)\*(\d+)")


def expand_layout(text: str) -> list[str]:
    """The letters of every stage, with the repetitions unrolled.

    >>> expand_layout("E|(t|)*2,tt|L")
    ['E', 't', 't', 'tt', 'L']
    """
    require(bool(text.strip()), "layout", repr(text), "is empty; give stages separated by |")
    require(len(text) <= _MAX_LAYOUT_CHARS, "layout", text, f"longer than {_MAX_LAYOUT_CHARS:,} characters")
    flat = text.replace(",", "").replace(" ", "")
    flat = _GROUP.sub(lambda match: _repeat(match.group(1), match.group(2), text), flat)
    flat = _REPEAT.sub(lambda match: _repeat(match.group(1), match.group(2), text), flat)
    require(len(flat) <= _MAX_LAYOUT_CHARS, "layout", text,
            f"stands for more than {_MAX_LAYOUT_CHARS:,} layers and separators; the limits are "
            f"{MAX_LAYERS:,} layers and {MAX_STAGES:,} stages")
    stages = flat.split("|")
    for stage in stages:
        for letter in stage:
            if letter not in LETTERS:
                raise PipeschedError(f"layout={text}: unexpected {letter!r}; use E, t, m, L, |, (...)*n, x*n and commas")
    return stages


def _repeat(piece: str, count: str, text: str) -> str:
    """``piece`` written ``count`` times, refused when that is longer than any layout."""
    times = parse_int("layout repeat", count, _MAX_LAYOUT_CHARS, minimum=0)
    require(len(piece) * times <= _MAX_LAYOUT_CHARS, "layout", text,
            f"a repeat stands for more than {_MAX_LAYOUT_CHARS:,} layers and separators; the limits are "
            f"{MAX_LAYERS:,} layers and {MAX_STAGES:,} stages")
    return piece * times


def parse_layout(text: str, kinds: Sequence[str], *, num_stages: int | None = None) -> Partition:
    """The partition a layout string describes; its letters must spell the model's layers.

    ``kinds`` is the layout letter of every model layer in order (``ModelSpec.layer_kinds``).
    With ``num_stages``, the layout must have exactly that many stages.
    """
    stages = expand_layout(text)
    letters = "".join(stages)
    expected = "".join(kinds)
    if letters != expected:
        for letter in LETTERS:
            have, want = letters.count(letter), expected.count(letter)
            if have != want:
                raise PipeschedError(f"layout={text}: has {have} {letter!r} layers, the model has {want}; "
                                     "write one letter per layer")
        position = next(i for i, (a, b) in enumerate(zip(letters, expected, strict=False)) if a != b)
        raise PipeschedError(f"layout={text}: layer {position} is {letters[position]!r} but the model's is "
                             f"{expected[position]!r}; keep the model's layer order")
    if num_stages is not None:
        require(len(stages) == num_stages, "layout", text,
                f"has {len(stages)} stages; the pipeline has {num_stages} (p x v)")
    return Partition.from_sizes([len(stage) for stage in stages])


def _stage_text(letters: str) -> str:
    """Runs of three or more letters become ``x*n``."""
    parts = []
    for letter, run in groupby(letters):
        count = len(list(run))
        parts.append(f"{letter}*{count}" if count >= 3 else letter * count)
    return "".join(parts)


def format_layout(partition: Partition, kinds: Sequence[str]) -> str:
    """The compact layout string of ``partition``; ``parse_layout`` reads it back."""
    require(partition.num_layers == len(kinds), "partition", partition,
            f"covers {partition.num_layers} layers; the model has {len(kinds)}")
    texts = [_stage_text("".join(kinds[i] for i in partition.layers(s))) for s in range(partition.num_stages)]
    groups = [(text, len(list(run))) for text, run in groupby(texts)]
    last_text, last_count = groups[-1]
    if last_count > 1:
        # the final stage stands alone so that no separator trails the string
        groups[-1:] = [(last_text, last_count - 1), (last_text, 1)]
    pieces = []
    for index, (text, count) in enumerate(groups):
        final = index == len(groups) - 1
        if count == 1:
            pieces.append(text if final else f"{text}|")
        else:
            pieces.append(f"({text}|)*{count},")
    return "".join(pieces)
