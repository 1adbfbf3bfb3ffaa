"""Every size pipesched reads from input, and the limit it must stay under.

One policy: a count or amount read from a file, a flag or a library call is checked here
before anything is built from it, and the error names the field, the value (shortened) and
the limit. Within these limits any command on an input of under 1 MB stays under 1 GiB of
memory. README.md lists them ("Limits").

>>> check_count("p", 4, MAX_DEVICES, what="pipeline devices")
4
>>> check_count("p", 5000, MAX_DEVICES, what="pipeline devices")
Traceback (most recent call last):
...
pipesched.errors.PipeschedError: p=5000: over the limit of 1,024 pipeline devices; give at most 1,024
"""

from __future__ import annotations

import math

from pipesched.errors import PipeschedError, shorten

# --- input files ----------------------------------------------------------------------------
MAX_INPUT_BYTES = 64 * 2**20  # bytes of one input file (schedule, stage costs, model, cluster)
MAX_NESTING = 32  # depth of nested lists and mappings in a JSON or YAML file
MAX_YAML_NODES = 250_000  # values in a YAML file once its anchors and aliases are expanded
MAX_NUMBER_CHARS = 40  # characters of one number written in input (digits, sign, point, exponent)
MAX_NAME_CHARS = 200  # characters of a name: schedule, model, layer, device, cluster

# --- schedules ------------------------------------------------------------------------------
MAX_DEVICES = 1024  # pipeline devices p (the ranks of one pipeline)
MAX_STAGES = 8192  # stages of one schedule (p x v)
MAX_MICROBATCHES = 16384  # microbatches m of one iteration
MAX_REPLICAS = 8  # placement replicas (2 for Chimera and DualPipe)
# ops of one schedule table, counted as F, I and W for every stage-microbatch (an upper
# bound before the table exists): 1.3 x ZB-V at p=128, m=1024, the size the simulator is
# benchmarked at; drawing a table this large as a PNG, the heaviest command, peaks under
# 1 GiB (benchmarks/results/fuzz_inputs.txt)
MAX_OPS = 2**20
# devices x time steps when a table is laid out one op per step (grid text and PyTorch's
# CSV); a larger layout is written compactly, without the idle steps
MAX_GRID_CELLS = 2**23

# --- models, hardware, training -------------------------------------------------------------
MAX_LAYERS = 4096  # layers of a model (transformer blocks, or measured layers)
MAX_WIDTH = 2**20  # hidden size, MLP hidden size and head size
MAX_VOCAB = 2**24  # vocabulary size and learned positions
MAX_HEADS = 2**16  # attention heads, key/value heads, experts
MAX_CLUSTER_RANKS = 65536  # devices of one cluster
MAX_TENSOR_PARALLEL = 1024  # tensor-parallel degree t
MAX_MICRO_BATCH_SIZE = 4096  # sequences per microbatch b
MAX_SEQ_LEN = 2**21  # tokens per sequence s
MAX_SECONDS = 1e7  # any duration or latency read from input (about four months)
MAX_AMOUNT = 1e21  # any byte count, bandwidth, FLOP count, FLOP/s or parameter count

# --- experiments ----------------------------------------------------------------------------
MAX_SAMPLES = 100_000  # Monte Carlo iterations of one run (--samples)
MAX_SEARCH_POINTS = 500_000  # configurations one design-space search may enumerate
# step ranges of one freeze plan: each distinct frozen set costs a simulation per candidate
# schedule (a plan freezing one more layer per range of an 80-layer model has 81)
MAX_FREEZE_RANGES = 256
MAX_TRAINING_STEPS = 10**12  # the steps a freeze plan's ranges span
# local worker processes of one search (--workers): each holds its own model, schedules and
# stage costs (about 170 MB), so a pool this large already needs a machine of its size
MAX_WORKERS = 256

# --- real runs ------------------------------------------------------------------------------
MAX_REPEATS = 100_000  # measured steps, warm-up steps, timed repeats, samples
MAX_TIMEOUT_S = 7 * 86400.0  # seconds a launch may be given
MAX_THREADS = 1024  # torch threads per rank

# The README's table of limits: (name, value, what it bounds).
LIMITS = (
    ("MAX_INPUT_BYTES", MAX_INPUT_BYTES, "bytes of one input file"),
    ("MAX_NESTING", MAX_NESTING, "nesting depth of JSON and YAML"),
    ("MAX_YAML_NODES", MAX_YAML_NODES, "YAML values after anchors and aliases are expanded"),
    ("MAX_NUMBER_CHARS", MAX_NUMBER_CHARS, "characters of one number"),
    ("MAX_NAME_CHARS", MAX_NAME_CHARS, "characters of a name"),
    ("MAX_DEVICES", MAX_DEVICES, "pipeline devices p"),
    ("MAX_STAGES", MAX_STAGES, "stages of a schedule (p x v)"),
    ("MAX_MICROBATCHES", MAX_MICROBATCHES, "microbatches m"),
    ("MAX_REPLICAS", MAX_REPLICAS, "placement replicas"),
    ("MAX_OPS", MAX_OPS, "ops of one schedule (3 per stage-microbatch counted)"),
    ("MAX_GRID_CELLS", MAX_GRID_CELLS, "devices x steps of a grid or CSV layout (larger: written without idle steps)"),
    ("MAX_LAYERS", MAX_LAYERS, "layers of a model"),
    ("MAX_WIDTH", MAX_WIDTH, "hidden, MLP and head size"),
    ("MAX_VOCAB", MAX_VOCAB, "vocabulary size, learned positions"),
    ("MAX_HEADS", MAX_HEADS, "attention heads, key/value heads, experts"),
    ("MAX_CLUSTER_RANKS", MAX_CLUSTER_RANKS, "devices of a cluster"),
    ("MAX_TENSOR_PARALLEL", MAX_TENSOR_PARALLEL, "tensor-parallel degree"),
    ("MAX_MICRO_BATCH_SIZE", MAX_MICRO_BATCH_SIZE, "sequences per microbatch"),
    ("MAX_SEQ_LEN", MAX_SEQ_LEN, "tokens per sequence"),
    ("MAX_SAMPLES", MAX_SAMPLES, "Monte Carlo samples of one run"),
    ("MAX_SEARCH_POINTS", MAX_SEARCH_POINTS, "configurations of one design-space search"),
    ("MAX_FREEZE_RANGES", MAX_FREEZE_RANGES, "step ranges of one freeze plan"),
    ("MAX_TRAINING_STEPS", MAX_TRAINING_STEPS, "training steps of a freeze plan"),
    ("MAX_WORKERS", MAX_WORKERS, "local worker processes of a search"),
    ("MAX_SECONDS", MAX_SECONDS, "seconds of any duration or latency"),
    ("MAX_AMOUNT", MAX_AMOUNT, "bytes, bytes/s, FLOPs, FLOP/s or parameters"),
    ("MAX_REPEATS", MAX_REPEATS, "steps, warm-up steps, repeats"),
    ("MAX_TIMEOUT_S", MAX_TIMEOUT_S, "seconds of a run's timeout"),
    ("MAX_THREADS", MAX_THREADS, "torch threads per rank"),
)


def check_count(field: str, value: object, limit: int, *, minimum: int | None = 1, what: str = "") -> int:
    """``value`` if it is a whole number in ``minimum..limit``; else a PipeschedError naming
    the field, the value (shortened) and the bound it broke. ``minimum=None`` checks only
    the limit (the caller words the lower bound)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PipeschedError(f"{field}={shorten(value)}: must be a whole number")
    if minimum is not None and value < minimum:
        raise PipeschedError(f"{field}={shorten(value)}: must be at least {minimum}")
    if value > limit:
        label = f" {what}" if what else ""
        raise PipeschedError(f"{field}={shorten(value)}: over the limit of {limit:,}{label}; give at most {limit:,}")
    return value


def check_amount(field: str, value: object, *, limit: float = MAX_AMOUNT, minimum: float = 0.0,
                 above_minimum: bool = False, unit: str = "") -> float:
    """``value`` as a float if it is a finite number in ``[minimum, limit]`` (``(minimum,
    limit]`` with ``above_minimum``); else a PipeschedError naming field, value and bound."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PipeschedError(f"{field}={shorten(value)}: must be a number{f' of {unit}' if unit else ''}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        number = math.inf
    if not math.isfinite(number):
        raise PipeschedError(f"{field}={shorten(value)}: must be a finite number{f' of {unit}' if unit else ''}")
    low = number <= minimum if above_minimum else number < minimum
    if low:
        bound = f"> {minimum:g}" if above_minimum else f">= {minimum:g}"
        raise PipeschedError(f"{field}={shorten(value)}: must be {bound}{f' {unit}' if unit else ''}")
    if number > limit:
        raise PipeschedError(f"{field}={shorten(value)}: over the limit of {limit:g}{f' {unit}' if unit else ''}")
    return number


def check_number_text(field: str, text: str) -> str:
    """``text`` stripped, if it is short enough to be a number pipesched reads."""
    stripped = text.strip()
    if len(stripped) > MAX_NUMBER_CHARS:
        raise PipeschedError(f"{field}={shorten(stripped)}: a number of {len(stripped):,} characters; "
                             f"numbers have at most {MAX_NUMBER_CHARS}")
    return stripped


def parse_int(field: str, text: str, limit: int, *, minimum: int = 0, what: str = "") -> int:
    """Read a whole number from ``text`` and check it like ``check_count``.

    >>> parse_int("stages", " 12 ", MAX_STAGES)
    12
    """
    stripped = check_number_text(field, text)
    try:
        value = int(stripped)
    except ValueError:
        raise PipeschedError(f"{field}={shorten(stripped)!r}: not a whole number") from None
    return check_count(field, value, limit, minimum=minimum, what=what)


def parse_float(field: str, text: str) -> float:
    """A number written in ``text`` (not yet range-checked; ``check_amount`` does that)."""
    stripped = check_number_text(field, text)
    try:
        return float(stripped)
    except ValueError:
        raise PipeschedError(f"{field}={shorten(stripped)!r}: not a number") from None


def check_name(field: str, value: object) -> str:
    """A name: a non-empty string of at most MAX_NAME_CHARS characters."""
    if not isinstance(value, str) or not value.strip():
        raise PipeschedError(f"{field}={shorten(value)}: must be a non-empty text name")
    if len(value) > MAX_NAME_CHARS:
        raise PipeschedError(f"{field}={shorten(value)}: a name of {len(value):,} characters; "
                             f"names have at most {MAX_NAME_CHARS}")
    return value


def check_table_size(stages: int, microbatches: int, *, label: str | None = None) -> None:
    """Refuse a schedule table too large to build: stages and microbatches within their
    limits, and at most MAX_OPS ops (F, I and W counted for every stage-microbatch).
    ``label`` words the size in the error (default ``S stages x m M``)."""
    check_count("stages", stages, MAX_STAGES, minimum=None, what="stages")
    check_count("m", microbatches, MAX_MICROBATCHES, minimum=None, what="microbatches")
    ops = 3 * max(stages, 1) * max(microbatches, 1)  # upper bound: F, I, W per stage-microbatch
    if ops > MAX_OPS:
        size = label or f"{stages} stages x m{microbatches}"
        raise PipeschedError(f"size={size}: about {ops:,} ops, over the limit of {MAX_OPS:,} ops; lower p, m or v")
