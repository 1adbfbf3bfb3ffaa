"""How op and transfer durations vary from one iteration to the next: the duration model, as
data, and its parsing from the command line.

Parts (each optional; they multiply):

- jitter: every op of a kind, and every transfer, takes its duration times an independent
  lognormal factor with mean 1 and the given coefficient of variation (CV = std / mean):
  ``exp(sigma z - sigma^2 / 2)``, z standard normal, ``sigma^2 = ln(1 + CV^2)``. Per op kind
  (``F=0.05``), for every op kind not named (``ops=0.1``), for every link (``link=0.3``) or
  one link between pipeline devices a and b, both directions (``link:a-b=0.5``). A bare
  ``0.1`` is ``ops=0.1,link=0.1``.
- measured: the relative factors of every repeat ``pipesched profile`` timed (a repeat over
  the median of its kind and stage: ``pipesched.variability.measured``); they replace the
  lognormal for the kinds they hold.
- stragglers: device d's ops take FACTOR times as long in every iteration (``d:FACTOR``).
- a random straggler: in each iteration, each device independently is slow with
  probability P, its ops then taking SLOWDOWN times as long (``P:SLOWDOWN``).
- slow links: every transfer between devices a and b takes FACTOR times as long
  (``a-b:FACTOR``).

``samples`` iterations are drawn from ``seed``; the same seed gives the same samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipesched.defaults import DEFAULTS
from pipesched.errors import require
from pipesched.limits import MAX_CLUSTER_RANKS, MAX_SAMPLES, parse_float, parse_int
from pipesched.variability.measured import MeasuredFactors

# the most Monte Carlo samples one command draws is ``limits.MAX_SAMPLES``: 100,000
# iterations of a ZB-V table of p=8, m=32 take about 15 s on one core, and their
# makespans, bubbles and critical-path counts stay a few MiB (samples are drawn and run in
# batches of ``BATCH_SAMPLES``)
# the largest coefficient of variation taken (a lognormal with CV 100 already puts half
# its samples below 1% of the mean)
MAX_CV = 100.0
# the largest slowdown or speed-up factor of a straggler or a link
MAX_FACTOR = 1e6
LINK = "link"
OPS = "ops"


@dataclass(frozen=True)
class Variability:
    """A duration model (see the module docstring); hashable, so it can travel in an
    experiment point."""

    jitter: tuple[tuple[str, float], ...] = ()  # (op kind letter | "ops" | "link" | "link:a-b", CV)
    measured: MeasuredFactors | None = None  # per kind and stage: relative factors of measured repeats
    stragglers: tuple[tuple[int, float], ...] = ()  # (device, factor) every iteration
    random_straggler: tuple[float, float] | None = None  # (probability per device and iteration, slowdown)
    slow_links: tuple[tuple[int, int, float], ...] = ()  # (device a, device b, factor), both directions
    samples: int = DEFAULTS.samples  # Monte Carlo iterations
    seed: int = DEFAULTS.seed

    def __post_init__(self) -> None:
        require(isinstance(self.samples, int) and 1 <= self.samples <= MAX_SAMPLES, "samples", self.samples,
                f"give 1 to {MAX_SAMPLES:,} samples (the cap of one run)")
        require(isinstance(self.seed, int) and 0 <= self.seed < 2**63, "seed", self.seed, "give a whole number >= 0")
        for key, cv in self.jitter:
            check_cv(key, cv)
        for device, factor in self.stragglers:
            check_factor(f"straggler {device}", factor)
        for a, b, factor in self.slow_links:
            check_factor(f"slow link {a}-{b}", factor)
        if self.random_straggler is not None:
            probability, slowdown = self.random_straggler
            require(0.0 <= probability <= 1.0, "random straggler probability", probability,
                    "give a probability from 0 to 1")
            check_factor("random straggler slowdown", slowdown)

    def op_cv(self, letter: str) -> float:
        """CV of the lognormal jitter of ops of kind ``letter``."""
        table = dict(self.jitter)
        return table.get(letter, table.get(OPS, 0.0))

    def link_cv(self, num_devices: int) -> np.ndarray:
        """CV of the lognormal jitter of transfers between each pair of devices (a matrix)."""
        table = dict(self.jitter)
        cv = np.full((num_devices, num_devices), table.get(LINK, 0.0))
        for key, value in self.jitter:
            if key.startswith(f"{LINK}:"):
                a, b = (int(x) for x in key[len(LINK) + 1:].split("-"))
                cv[a, b] = cv[b, a] = value
        return cv

    def check_for(self, num_devices: int, kinds: tuple[str, ...]) -> None:
        """Refuse a device or op kind that a schedule of ``num_devices`` devices with op
        kinds ``kinds`` does not have."""
        known = f"devices 0..{num_devices - 1}"
        for device, _ in self.stragglers:
            require(0 <= device < num_devices, "straggler", device, f"no such device; the schedule has {known}")
        for a, b, _ in self.slow_links:
            for device in (a, b):
                require(0 <= device < num_devices, "slow link", f"{a}-{b}", f"no such device; the schedule has {known}")
        for key, _ in self.jitter:
            if key.startswith(f"{LINK}:"):
                a, b = (int(x) for x in key[len(LINK) + 1:].split("-"))
                require(max(a, b) < num_devices, "jitter", key, f"no such device; the schedule has {known}")
            elif key not in (OPS, LINK):
                require(key in kinds, "jitter", key, f"unknown op kind; the schedule's kinds are {', '.join(kinds)} "
                                                     f"(or ops, link, link:A-B)")

    def describe(self) -> str:
        """One line: what varies."""
        parts = []
        if self.jitter:
            parts.append("lognormal jitter " + ", ".join(f"{key}={cv:g}" for key, cv in self.jitter))
        if self.measured is not None:
            parts.append(f"measured repeats ({self.measured.source})")
        parts += [f"device {d} x{f:g}" for d, f in self.stragglers]
        if self.random_straggler is not None:
            parts.append(f"each device slow x{self.random_straggler[1]:g} with probability {self.random_straggler[0]:g}")
        parts += [f"link {a}-{b} x{f:g}" for a, b, f in self.slow_links]
        return "; ".join(parts) or "no variability"


def check_cv(key: str, cv: float) -> None:
    require(isinstance(cv, int | float) and math.isfinite(cv) and 0 <= cv <= MAX_CV, f"jitter {key}", cv,
            f"give a coefficient of variation from 0 to {MAX_CV:g}")


def check_factor(field: str, factor: float) -> None:
    require(isinstance(factor, int | float) and math.isfinite(factor) and 0 < factor <= MAX_FACTOR, field, factor,
            f"give a factor > 0 and at most {MAX_FACTOR:g} (1 = unchanged)")


# --- the command line ------------------------------------------------------------------------
def _device(text: str, field: str) -> int:
    """A device number (from 0) read from ``text``; whether the cluster has it is checked later."""
    return parse_int(field, text, MAX_CLUSTER_RANKS - 1, what="devices of a cluster")


def _halves(text: str, field: str, form: str) -> tuple[str, str]:
    """``text`` cut at its first colon, the two sides of an option's ``X:Y``; ``form``: how to write it."""
    first, sep, second = text.partition(":")
    require(bool(sep), field, text[:40], form)
    return first, second


def _factor(field: str, text: str) -> float:
    """A slowdown factor read from ``text`` (see ``check_factor``)."""
    value = parse_float(field, text)
    check_factor(field, value)
    return value


def _link(text: str, field: str, form: str, device_field: str) -> tuple[int, int]:
    """A link ``A-B`` between two different devices, as (lower, higher); ``form``: how to
    write it, ``device_field``: what a bad device number is called."""
    ends = text.split("-")
    require(len(ends) == 2, field, text[:40], form)
    a, b = (_device(x, device_field) for x in ends)
    require(a != b, field, text, "a link joins two different devices")
    return min(a, b), max(a, b)


def parse_jitter(text: str) -> tuple[tuple[str, float], ...]:
    """``--jitter`` text: ``0.1`` or ``F=0.05,I=0.1,W=0.2,link=0.3`` (see the module docstring).

    >>> parse_jitter("0.1")
    (('ops', 0.1), ('link', 0.1))
    >>> parse_jitter("F=0.05, link:0-1=0.5")
    (('F', 0.05), ('link:0-1', 0.5))
    """
    text = text.strip()
    require(bool(text), "jitter", "''", "give a CV like 0.1 or per kind like F=0.05,I=0.1,W=0.2,link=0.3")
    if "=" not in text:
        cv = parse_float("jitter", text)
        check_cv(OPS, cv)
        return ((OPS, cv), (LINK, cv))
    pairs: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = (x.strip() for x in part.partition("="))
        require(bool(sep and key), "jitter", part.strip()[:40], "write KIND=CV, e.g. F=0.05 or link=0.3")
        if key.startswith(f"{LINK}:"):
            a, b = _link(key[len(LINK) + 1:], "jitter", "name a link by its two devices, e.g. link:0-1=0.5",
                         "jitter link")
            key = f"{LINK}:{a}-{b}"
        cv = parse_float(f"jitter {key}", value)
        check_cv(key, cv)
        require(key not in pairs, "jitter", key, "given twice; give each kind once")
        pairs[key] = cv
    return tuple(pairs.items())


def parse_straggler(text: str) -> tuple[int, float]:
    """``--straggler DEVICE:FACTOR``.

    >>> parse_straggler("3:1.5")
    (3, 1.5)
    """
    device, factor = _halves(text, "straggler", "write DEVICE:FACTOR, e.g. 3:1.5")
    value = _factor("straggler factor", factor)
    return _device(device, "straggler"), value


def parse_random_straggler(text: str) -> tuple[float, float]:
    """``--random-straggler PROBABILITY:SLOWDOWN``.

    >>> parse_random_straggler("0.05:2")
    (0.05, 2.0)
    """
    probability, slowdown = _halves(text, "random straggler", "write PROBABILITY:SLOWDOWN, e.g. 0.05:2")
    chance = parse_float("random straggler probability", probability)
    require(0.0 <= chance <= 1.0, "random straggler probability", chance, "give a probability from 0 to 1")
    value = _factor("random straggler slowdown", slowdown)
    return chance, value


def parse_slow_link(text: str) -> tuple[int, int, float]:
    """``--slow-link A-B:FACTOR``.

    >>> parse_slow_link("3-4:2")
    (3, 4, 2.0)
    """
    link, factor = _halves(text, "slow link", "write A-B:FACTOR, e.g. 3-4:2")
    a, b = _link(link, "slow link", "write A-B:FACTOR, e.g. 3-4:2", "slow link")
    return a, b, _factor("slow link factor", factor)
