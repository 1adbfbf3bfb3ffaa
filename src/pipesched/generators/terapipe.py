"""TeraPipe: token-level pipelining of each sequence (Li et al., 2021).

Each of the m sequences (microbatches of the costs) is cut along its tokens into k slices
that flow through the pipeline one after the other, GPipe-style: device d runs the forwards
of every slice in token order, then the backwards, each sequence's slices in reverse (a
slice's keys and values get gradients from the later slices that attended to them). A
slice's attention needs the keys and values of the earlier slices of its sequence on its
stage, so the forward of slice i on a stage follows that of slice i - 1 there (the device's
order), and a slice's work grows with its position.

Costs, as shares of a whole sequence's stage time: a slice of tokens [i, j) of a sequence of
n units costs

    t(i, j) = overhead + (1 - a) (j - i) / n + a (j^2 - i^2) / n^2

where a is the share of the stage's time in causal attention (quadratic in the prefix a
token attends to; ``attention_share``) and the rest grows with the slice's tokens; the
shares of a slicing sum to 1 plus k x ``slice_overhead`` (what each slice costs beyond its
tokens: kernel launches, smaller matmuls). The identical stages make the pipeline a
proportionate flow shop: one iteration takes

    (m sum_i t_i + (p - 1) max_i t_i) x (F + B)

(F, B of a whole sequence), the closed form of level 1 and TeraPipe's objective, which its
dynamic program minimises over slicings of the sequence into ``units`` equal token units
(``terapipe_slicing``; ``slices`` = 0 lets it choose their count too). The table records each
slice's share (``Execution.microbatch_scales``: F and B at t_i, messages and weight
gradients at the slice's tokens) over microbatches of 1 / k of a sequence
(``microbatch_fraction``), so levels 2 and 3 run the slices at their own lengths.

With equal slice costs (a = 0, no overhead) the slices are equal and the table is GPipe's
over m k microbatches of 1 / k of a sequence.
"""

from __future__ import annotations

import functools

import numpy as np

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.generators.base import Family, FormulaEstimate, check_sizes
from pipesched.limits import MAX_TERAPIPE_UNITS
from pipesched.ops import B, F, Op
from pipesched.schedule import Execution, Placement, Schedule

DEFAULT_SLICES = 4  # slices per sequence (0: the dynamic program chooses)
DEFAULT_UNITS = 32  # equal token units a sequence is cut along


def slice_times(lengths: tuple[int, ...], *, attention_share: float, slice_overhead: float = 0.0) -> np.ndarray:
    """The share of a whole sequence's stage time of each slice of ``lengths`` token units
    (see the module docstring).

    >>> slice_times((1, 1), attention_share=1.0).tolist()
    [0.25, 0.75]
    """
    units = sum(lengths)
    ends = np.cumsum(np.asarray(lengths, np.float64))
    starts = ends - np.asarray(lengths, np.float64)
    return (slice_overhead + (1.0 - attention_share) * (ends - starts) / units
            + attention_share * (ends**2 - starts**2) / units**2)


@functools.lru_cache(maxsize=256)
def terapipe_slicing(p: int, *, units: int = DEFAULT_UNITS, attention_share: float = 0.0,
                     slice_overhead: float = 0.0, slices: int = DEFAULT_SLICES, sequences: int = 1) -> tuple[int, ...]:
    """The slicing of a sequence of ``units`` token units that minimises TeraPipe's
    objective on p stages, ``sequences`` x the sum of the slice times + (p - 1) x the longest
    (the proportionate flow shop's span): exactly ``slices`` slices, or any number with
    ``slices`` = 0. TeraPipe's dynamic program: for every candidate longest slice time T
    (each possible slice's time is one), the least total time of the slicings of each prefix
    whose slices all take at most T; the best T adds (p - 1) T. A slicing's times sum to
    1 + k x ``slice_overhead`` (the token and attention terms telescope), so the least total
    is the fewest slices, and a fixed count only asks for the least T that many can meet.

    >>> terapipe_slicing(4, units=8, attention_share=0.0, slices=4)
    (2, 2, 2, 2)
    >>> terapipe_slicing(4, units=8, attention_share=1.0, slices=2)  # 36/64 and 28/64 of the attention
    (6, 2)
    """
    check_sizes(p, 1, min_p=1)
    require(isinstance(units, int) and 1 <= units <= MAX_TERAPIPE_UNITS, "units", units,
            f"give a whole number of token units in 1..{MAX_TERAPIPE_UNITS}")
    require(isinstance(slices, int) and 0 <= slices <= units, "slices", slices,
            f"give a whole number of slices in 0..units={units} (0: the dynamic program chooses)")
    edge = np.arange(units + 1, dtype=np.float64)
    start, end = edge[:, None], edge[None, :]
    times = np.where(start < end, slice_overhead + (1.0 - attention_share) * (end - start) / units
                     + attention_share * (end**2 - start**2) / units**2, np.inf)  # [i, j]: units i..j-1
    candidates = np.unique(times[np.isfinite(times)])  # ascending
    # fewest[c, j]: fewest slices of units 0..j-1 each taking at most candidates[c]
    fewest = np.full((len(candidates), units + 1), np.inf)
    fewest[:, 0] = 0.0
    choice = np.zeros(fewest.shape, np.int64)  # where the last of those slices starts
    for j in range(1, units + 1):
        column = times[:j, j]  # the slices ending at unit j, by start
        counts = np.where(column[None, :] <= candidates[:, None], fewest[:, :j] + 1.0, np.inf)
        choice[:, j] = np.argmin(counts, axis=1)
        fewest[:, j] = np.take_along_axis(counts, choice[:, j][:, None], axis=1)[:, 0]
    if slices == 0:
        totals = sequences * (1.0 + slice_overhead * fewest[:, units]) + (p - 1) * candidates
    else:
        totals = np.where(fewest[:, units] <= slices, (p - 1) * candidates, np.inf)
    pick = int(np.argmin(totals))
    lengths, cut = [], units
    while cut > 0:
        first = int(choice[pick, cut])
        lengths.append(cut - first)
        cut = first
    return _split_to(tuple(reversed(lengths)), slices)


def _split_to(lengths: tuple[int, ...], slices: int) -> tuple[int, ...]:
    """``lengths`` with its longest slices halved until there are ``slices`` of them (a part
    of a slice never takes longer than the slice); as it is for ``slices`` = 0."""
    parts = list(lengths)
    while 0 < len(parts) < slices:
        longest = max(range(len(parts)), key=lambda index: parts[index])
        length = parts[longest]
        parts[longest:longest + 1] = [length - length // 2, length // 2]
    return tuple(parts)


def _slicing(p: int, m: int, options: dict[str, object]) -> tuple[int, ...]:
    return terapipe_slicing(p, units=int(options.get("units", DEFAULT_UNITS)),  # type: ignore[call-overload]
                            attention_share=float(options.get("attention_share", 0.0)),  # type: ignore[arg-type]
                            slice_overhead=float(options.get("slice_overhead", 0.0)),  # type: ignore[arg-type]
                            slices=int(options.get("slices", DEFAULT_SLICES)), sequences=m)  # type: ignore[call-overload]


def terapipe(p: int, m: int, **options: object) -> Schedule:
    """m sequences of k token slices each: device d runs every slice's forward in token order,
    then their backwards, each sequence's slices last first.

    >>> [str(op) for op in terapipe(2, 1, slices=2, units=4).device_ops[1]]
    ['1F0', '1F1', '1B1', '1B0']
    """
    check_sizes(p, m)
    lengths = _slicing(p, m, options)
    k = len(lengths)
    times = slice_times(lengths, attention_share=float(options.get("attention_share", 0.0)),  # type: ignore[arg-type]
                        slice_overhead=float(options.get("slice_overhead", 0.0)))  # type: ignore[arg-type]
    tokens = np.asarray(lengths, np.float64) / sum(lengths)
    # per table microbatch (sequence-major): its time and its tokens over the mean slice's
    scales = tuple((float(k * times[i]), float(k * tokens[i])) for _ in range(m) for i in range(k))
    forwards = tuple(q * k + i for q in range(m) for i in range(k))
    backwards = tuple(q * k + i for q in range(m) for i in reversed(range(k)))
    device_ops = tuple(tuple(Op(d, F, mb) for mb in forwards) + tuple(Op(d, B, mb) for mb in backwards)
                       for d in range(p))
    return Schedule("terapipe", Placement.one_per_device(p), m * k, device_ops,
                    params={"p": p, "m": m, "slices": list(lengths)},
                    execution=Execution(microbatch_fraction=1.0 / k, microbatch_scales=scales))


def terapipe_formula(p: int, m: int, v: int, c: StageCosts, **options: object) -> FormulaEstimate:
    """The proportionate flow shop of the module docstring: every device works m sum_i t_i
    (F + B) and idles (p - 1) max_i t_i (F + B); all m k slices' activations held (each a
    1 / k of a sequence's on average)."""
    lengths = _slicing(p, m, options)
    times = slice_times(lengths, attention_share=float(options.get("attention_share", 0.0)),  # type: ignore[arg-type]
                        slice_overhead=float(options.get("slice_overhead", 0.0)))  # type: ignore[arg-type]
    k = len(lengths)
    return FormulaEstimate(idle=(p - 1) * float(times.max()) * (c.f + c.b), work=m * float(times.sum()) * (c.f + c.b),
                           peak_inflight=m * k, activation_units=m, exact=True,
                           note=f"slices of {'/'.join(str(x) for x in lengths)} token units")


def table_shape(p: int, m: int, v: int, options: dict[str, object]) -> tuple[int, int]:
    """p stages and m k microbatches (k slices per sequence)."""
    return p, m * len(_slicing(p, m, options))


FAMILY = Family(
    name="terapipe",
    summary="token-level pipelining: each sequence cut into slices by TeraPipe's dynamic program, GPipe-style",
    constraints="p >= 2, m >= 1; slices=K (0: chosen), units=N, attention_share=A, slice_overhead=O",
    build=lambda p, m, *, v=None, **options: terapipe(p, m, **options),
    formula=terapipe_formula,
    options=("slices", "units", "attention_share", "slice_overhead"),
    formula_options=("slices", "units", "attention_share", "slice_overhead"),
    shape=table_shape,
)
