"""Variability: duration models (lognormal jitter per op kind and link, measured repeats,
stragglers, slow links) and Monte Carlo over a compiled task graph.

>>> from pipesched.costs import StageCosts
>>> from pipesched.generators import generate
>>> from pipesched.simulate import Network, compile_graph
>>> from pipesched.variability import Variability, monte_carlo
>>> graph = compile_graph(generate("1f1b", 4, 8), StageCosts.uniform(4),
...                       Network.uniform(4, latency=0.0, bandwidth=float("inf")))
>>> result = monte_carlo(graph, Variability(jitter=(("ops", 0.1),), samples=200, seed=1))
>>> result.deterministic, result.time.mean > result.deterministic
(33.0, True)
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from pipesched.variability.measured import MeasuredFactors, load_repeats, parse_repeats, repeats_csv
from pipesched.variability.model import (
    MAX_SAMPLES,
    Variability,
    parse_jitter,
    parse_random_straggler,
    parse_slow_link,
    parse_straggler,
)

# Imported on first use: they pull in numba (the sampler and the simulator).
_LAZY = {
    "Distribution": "pipesched.variability.distribution",
    "Influence": "pipesched.variability.distribution",
    "PairedComparison": "pipesched.variability.distribution",
    "Spread": "pipesched.variability.distribution",
    "monte_carlo": "pipesched.variability.distribution",
    "paired_comparison": "pipesched.variability.distribution",
    "Sampler": "pipesched.variability.sampling",
}

if TYPE_CHECKING:
    from pipesched.variability.distribution import (
        Distribution,
        Influence,
        PairedComparison,
        Spread,
        monte_carlo,
        paired_comparison,
    )
    from pipesched.variability.sampling import Sampler


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pipesched.variability' has no attribute {name!r}")


__all__ = [
    "MAX_SAMPLES",
    "Distribution",
    "Influence",
    "MeasuredFactors",
    "PairedComparison",
    "Sampler",
    "Spread",
    "Variability",
    "load_repeats",
    "monte_carlo",
    "paired_comparison",
    "parse_jitter",
    "parse_random_straggler",
    "parse_repeats",
    "parse_slow_link",
    "parse_straggler",
    "repeats_csv",
]
