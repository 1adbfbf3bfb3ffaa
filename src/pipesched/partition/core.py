"""Partition: contiguous runs of layers, one run per pipeline stage; and the uniform split."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from pipesched.errors import PipeschedError, require

# Layout letters of the layers that stay with the first and last stage in a uniform split.
_LEADING = "E"
_TRAILING = "L"


@dataclass(frozen=True)
class Partition:
    """Stage ``s`` holds layers ``bounds[s]`` to ``bounds[s + 1] - 1`` (model order).

    A stage may be empty (Megatron layouts allow it); the partitioners never make one.

    >>> Partition.from_sizes([2, 3]).bounds
    (0, 2, 5)
    >>> str(Partition((0, 2, 5)))
    '2|3'
    """

    bounds: tuple[int, ...]

    def __post_init__(self) -> None:
        bounds = tuple(int(b) for b in self.bounds)
        object.__setattr__(self, "bounds", bounds)
        require(len(bounds) >= 2, "partition", bounds, "needs at least one stage (two bounds)")
        require(bounds[0] == 0, "partition", bounds, "must start at layer 0")
        for a, b in pairwise(bounds):
            require(a <= b, "partition", bounds, "bounds must not decrease")

    @classmethod
    def from_sizes(cls, sizes: Sequence[int]) -> Partition:
        """From the number of layers of each stage."""
        bounds = [0]
        for size in sizes:
            require(size >= 0, "stage size", size, "must be >= 0")
            bounds.append(bounds[-1] + size)
        return cls(tuple(bounds))

    @property
    def num_stages(self) -> int:
        return len(self.bounds) - 1

    @property
    def num_layers(self) -> int:
        return self.bounds[-1]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in pairwise(self.bounds))

    def layers(self, stage: int) -> range:
        """Indices of the layers of ``stage``."""
        return range(self.bounds[stage], self.bounds[stage + 1])

    def __str__(self) -> str:
        return "|".join(str(size) for size in self.sizes)


def check_fits(num_layers: int, num_stages: int) -> None:
    """Every stage needs at least one layer."""
    require(num_stages >= 1, "stages", num_stages, "must be at least 1")
    if num_layers < num_stages:
        raise PipeschedError(f"stages={num_stages}: the model has only {num_layers} layers (embedding and head "
                             "included); use at most that many stages (p x v)")


def uniform(kinds: Sequence[str], num_stages: int) -> Partition:
    """Equal numbers of transformer layers per stage; the embedding (E) stays on the first
    stage and the loss layer (L) on the last. When the blocks do not divide evenly, the
    middle stages take one more block each first (the end stages already carry E and L).

    >>> str(uniform("E" + "t" * 30 + "L", 4))
    '8|8|8|8'
    >>> str(uniform("E" + "t" * 8 + "L", 3))
    '4|3|3'
    """
    num_layers = len(kinds)
    check_fits(num_layers, num_stages)
    lead = 0
    while lead < num_layers and kinds[lead] == _LEADING:
        lead += 1
    trail = 0
    while trail < num_layers - lead and kinds[num_layers - 1 - trail] == _TRAILING:
        trail += 1
    blocks = num_layers - lead - trail
    if blocks < num_stages:
        # too few blocks to give every stage one: spread all layers evenly instead
        lead = trail = 0
        blocks = num_layers
    base, extra = divmod(blocks, num_stages)
    order = list(range(1, num_stages - 1)) + [0, num_stages - 1][: min(num_stages, 2)]
    sizes = [base] * num_stages
    for stage in order[:extra]:
        sizes[stage] += 1
    sizes[0] += lead
    sizes[-1] += trail
    return Partition.from_sizes(sizes)
