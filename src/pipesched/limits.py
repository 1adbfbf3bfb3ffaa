"""Every size pipesched reads from input, and the limit it must stay under.

One policy: a count or amount read from a file, a flag or a library call is checked here
before anything is built from it, and the error names the field, the value (shortened) and
the limit. Within these limits any command that plans or evaluates schedules, on an input
of under 1 MB, stays under 1 GiB of memory; synthesis and real runs need what their solver
and model need (README.md, "Limits", lists the limits and says what those need).

>>> check_count("p", 4, MAX_DEVICES, what="pipeline devices")
4
>>> check_count("p", 5000, MAX_DEVICES, what="pipeline devices")
Traceback (most recent call last):
...
pipesched.errors.PipeschedError: p=5000: over the limit of 1,024 pipeline devices; give at most 1,024
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
# ops and transfers of the timelines one Perfetto trace (--perfetto) draws: each is about three
# trace events (its slice, a flow arrow's two ends) while the trace is built; twice this
# many (1F1B, p=4, m=16384) peaked at 0.42 GiB and took 27 s on a busy 2-core machine
MAX_TRACE_TASKS = 2**16
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
MAX_CONTEXT_PARALLEL = 1024  # context-parallel degree cp (ranks that split one sequence)
MAX_SECONDS = 1e7  # any duration or latency read from input (about four months)
MAX_AMOUNT = 1e21  # any byte count, bandwidth, FLOP count, FLOP/s or parameter count
# the slowest bandwidth (bytes/s) or FLOP/s read from input: MAX_AMOUNT bytes or FLOPs at
# this rate take 1e27 s, so every time derived from a size and a rate, and every sum of
# such times over a table, stays finite (toy problems in small units stay above it)
MIN_RATE = 1e-6
MIN_EFFICIENCY = 1e-3  # the least share of its peak rate a device reaches (matmul, memory bandwidth)
MAX_EXPERT_PARALLEL = 4096  # expert-parallel degree (ranks the routed experts are split over)
MAX_CAPACITY_FACTOR = 1024.0  # an expert's capacity factor and the hottest expert's load over the mean

# --- family options (--set KEY=VALUE) -------------------------------------------------------
MAX_WAVES = MAX_STAGES // 2  # Hanayo's waves (2 chunks each; its 2 x waves x p stages are bounded too)
MAX_ITERATIONS = 64  # iterations one table or graph strings together (asynchronous tables, steady states)
# devices the zero-bubble V heuristic plans (zb-v with costs or an activation limit): its
# warm-up sweeps are quadratic in p (about 2 s at 256 devices, 30 s at 1,024)
MAX_V_HEURISTIC_DEVICES = 256
# token units TeraPipe's dynamic program cuts a sequence along: it keeps candidates x slices x
# units sums (about 2,080 x 64 x 65 at this size, 70 MB, a second or two)
MAX_TERAPIPE_UNITS = 64

# --- experiments ----------------------------------------------------------------------------
MAX_SAMPLES = 100_000  # Monte Carlo iterations of one run (--samples)
# samples x tasks (ops and transfers) one Monte Carlo run simulates: at the benchmarked
# 55 ns a task (benchmarks/results/bench_variability.txt) about 7 s; 100,000 samples of a
# table of up to 1,342 tasks, fewer of a larger one
MAX_SAMPLED_TASKS = 2**27
MAX_SEARCH_POINTS = 500_000  # configurations one design-space search may enumerate
# step ranges of one freeze plan: each distinct frozen set costs a simulation per candidate
# schedule (a plan freezing one more layer per range of an 80-layer model has 81)
MAX_FREEZE_RANGES = 256
MAX_TRAINING_STEPS = 10**12  # the steps a freeze plan's ranges span
# local worker processes of one search (--workers): each holds its own model, schedules and
# stage costs (about 170 MB), so a pool this large already needs a machine of its size
MAX_WORKERS = 256

# ops of one synthesis problem (p x m x 3 with a split backward, x 2 with B): the solver's
# model peaks under 1 GiB at this size (0.83 GiB at p=50, m=66 with a split backward, 1.5 GiB at
# p=100, m=66)
MAX_SYNTHESIS_OPS = 12_288

# --- serving ---------------------------------------------------------------------------------
# requests of one trace (file or synthetic): a run keeps about 10 numbers per request plus
# one time per output token (MAX_SERVED_TOKENS bounds those)
MAX_REQUESTS = 2**20
MAX_SERVED_TOKENS = 2**28  # output tokens of one trace, all requests together (2 GiB of token times)
MAX_BATCH_TOKENS = 2**20  # tokens one serving iteration may batch (--max-tokens, --chunk)
MAX_BATCH_REQUESTS = 2**16  # requests one serving iteration may batch (--max-batch)
MAX_KV_BLOCK = 4096  # tokens of one paged KV-cache block
MAX_QPS = 1e6  # requests per second of a synthetic trace or a capacity search
MAX_RESIDENCIES = 64  # residencies one serve residency curve simulates (--fractions)
MAX_CURVE_MODELS = 16  # models one serve residency draws a curve each for (--models)
MAX_CLUSTER_EVENTS = 1024  # device losses and additions of one events file (--events)
# iterations one serving timeline draws (a window of the run: its stages x this many ops)
MAX_VIEW_ITERATIONS = 20_000
MAX_POOL_MODELS = 256  # models of one pool's deployment file
MAX_POOL_SHAPES = 64  # TP x PP shapes one model of a pool may take
# offline inference (serve offline): sequences of one block (gpu_batch x num_batches) and
# GPU batches of one block; a block's KV cache and hidden states are sized from these
MAX_OFFLINE_SEQUENCES = 2**16
MAX_OFFLINE_BATCHES = 4096

# --- real runs ------------------------------------------------------------------------------
MAX_REPEATS = 100_000  # measured steps, warm-up steps, timed repeats, samples
MAX_TIMEOUT_S = 7 * 86400.0  # seconds a launch, or a solver (synthesize --time-limit), may be given
MAX_THREADS = 1024  # torch threads per rank
MAX_PROFILE_SIZES = 64  # message sizes one collective profile sweeps (--sizes)
MAX_PROFILE_BYTES = 2**32  # bytes per rank of one profiled collective message

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
    ("MAX_TRACE_TASKS", MAX_TRACE_TASKS, "ops and transfers one Perfetto trace (--perfetto) draws"),
    ("MAX_GRID_CELLS", MAX_GRID_CELLS, "devices x steps of a grid or CSV layout (larger: written without idle steps)"),
    ("MAX_LAYERS", MAX_LAYERS, "layers of a model"),
    ("MAX_WIDTH", MAX_WIDTH, "hidden, MLP and head size"),
    ("MAX_VOCAB", MAX_VOCAB, "vocabulary size, learned positions"),
    ("MAX_HEADS", MAX_HEADS, "attention heads, key/value heads, experts"),
    ("MAX_CLUSTER_RANKS", MAX_CLUSTER_RANKS, "devices of a cluster"),
    ("MAX_TENSOR_PARALLEL", MAX_TENSOR_PARALLEL, "tensor-parallel degree"),
    ("MAX_MICRO_BATCH_SIZE", MAX_MICRO_BATCH_SIZE, "sequences per microbatch"),
    ("MAX_SEQ_LEN", MAX_SEQ_LEN, "tokens per sequence"),
    ("MAX_CONTEXT_PARALLEL", MAX_CONTEXT_PARALLEL, "context-parallel degree"),
    ("MAX_SAMPLES", MAX_SAMPLES, "Monte Carlo samples of one run"),
    ("MAX_SAMPLED_TASKS", MAX_SAMPLED_TASKS, "samples x (ops + transfers) of one Monte Carlo run"),
    ("MAX_SEARCH_POINTS", MAX_SEARCH_POINTS, "configurations of one design-space search"),
    ("MAX_FREEZE_RANGES", MAX_FREEZE_RANGES, "step ranges of one freeze plan"),
    ("MAX_TRAINING_STEPS", MAX_TRAINING_STEPS, "training steps of a freeze plan"),
    ("MAX_WORKERS", MAX_WORKERS, "local worker processes of a search"),
    ("MAX_SYNTHESIS_OPS", MAX_SYNTHESIS_OPS, "ops of one synthesis problem (p x m x 3, or x 2 with B)"),
    ("MAX_SECONDS", MAX_SECONDS, "seconds of any duration or latency"),
    ("MAX_AMOUNT", MAX_AMOUNT, "bytes, bytes/s, FLOPs, FLOP/s or parameters"),
    ("MIN_RATE", MIN_RATE, "the least bytes/s or FLOP/s of a link or device"),
    ("MIN_EFFICIENCY", MIN_EFFICIENCY, "the least matmul or bandwidth efficiency of a device"),
    ("MAX_WAVES", MAX_WAVES, "Hanayo waves (--set waves)"),
    ("MAX_ITERATIONS", MAX_ITERATIONS, "iterations strung together (--set iterations, steady state)"),
    ("MAX_V_HEURISTIC_DEVICES", MAX_V_HEURISTIC_DEVICES, "devices the zb-v heuristic plans (with costs or activation_limit)"),
    ("MAX_TERAPIPE_UNITS", MAX_TERAPIPE_UNITS, "token units of a TeraPipe slicing (--set units, slices)"),
    ("MAX_REQUESTS", MAX_REQUESTS, "requests of one serving trace"),
    ("MAX_SERVED_TOKENS", MAX_SERVED_TOKENS, "output tokens of one serving trace"),
    ("MAX_BATCH_TOKENS", MAX_BATCH_TOKENS, "tokens of one serving iteration"),
    ("MAX_BATCH_REQUESTS", MAX_BATCH_REQUESTS, "requests of one serving iteration"),
    ("MAX_KV_BLOCK", MAX_KV_BLOCK, "tokens of one KV-cache block"),
    ("MAX_QPS", MAX_QPS, "requests per second"),
    ("MAX_VIEW_ITERATIONS", MAX_VIEW_ITERATIONS, "iterations one serving timeline draws"),
    ("MAX_POOL_MODELS", MAX_POOL_MODELS, "models of one pool (serve pool)"),
    ("MAX_POOL_SHAPES", MAX_POOL_SHAPES, "TP x PP shapes of one model of a pool"),
    ("MAX_OFFLINE_SEQUENCES", MAX_OFFLINE_SEQUENCES, "sequences of one offline block (gpu batch x batches)"),
    ("MAX_OFFLINE_BATCHES", MAX_OFFLINE_BATCHES, "GPU batches of one offline block"),
    ("MAX_REPEATS", MAX_REPEATS, "steps, warm-up steps, repeats"),
    ("MAX_TIMEOUT_S", MAX_TIMEOUT_S, "seconds of a run's timeout or a solver's time limit"),
    ("MAX_THREADS", MAX_THREADS, "torch threads per rank"),
    ("MAX_EXPERT_PARALLEL", MAX_EXPERT_PARALLEL, "expert-parallel degree"),
    ("MAX_CAPACITY_FACTOR", MAX_CAPACITY_FACTOR, "expert capacity factor, expert skew"),
    ("MAX_PROFILE_SIZES", MAX_PROFILE_SIZES, "message sizes of a collective profile"),
    ("MAX_PROFILE_BYTES", MAX_PROFILE_BYTES, "bytes per rank of a profiled collective"),
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


def check_rate(field: str, value: object, *, unit: str = "bytes/s", infinite: bool = False,
               zero: bool = False) -> float:
    """``value`` as a float if it is a rate (bandwidth, FLOP/s) in ``[MIN_RATE, MAX_AMOUNT]``,
    so that any amount over it takes a finite time; ``infinite`` also takes inf (a free
    link), ``zero`` also takes 0 (no such link)."""
    if infinite and isinstance(value, int | float) and not isinstance(value, bool) and value == math.inf:
        return math.inf
    if zero and isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0.0
    number = check_amount(field, value, unit=unit)
    if number < MIN_RATE:
        free = "; write inf for a free link" if infinite else ""
        raise PipeschedError(f"{field}={shorten(value)}: under the least rate of {MIN_RATE:g} {unit}{free}")
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


@dataclass(frozen=True)
class OptionBound:
    """What one family option (``--set KEY=VALUE``) may be: a whole number (``count``) or a
    finite real number (``amount``) in ``low..high``, a ``switch`` (1 on, 0 off), or
    ``costs`` (a StageCosts, bounded by the reader it comes from). ``fix`` says what to give."""

    kind: str
    low: float = 0.0
    high: float = 0.0
    fix: str = ""

    def holds(self, value: object) -> bool:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if self.kind == "count":
            return isinstance(value, int) and number and self.low <= value <= self.high
        if self.kind == "amount":
            return number and math.isfinite(value) and self.low <= value <= self.high  # type: ignore[arg-type]
        if self.kind == "switch":
            return not isinstance(value, str) and value in (0, 1)
        return True


# the longest message a heuristic may plan with as its link latency: read, or derived from
# the workload (latency + bytes / bandwidth, within the limits above)
_LONGEST_MESSAGE_S = MAX_SECONDS + MAX_AMOUNT / MIN_RATE

# Every family option, with its bounds: one name means one thing in every family that takes
# it. The options that size the table (waves: stages; iterations and backward halving:
# microbatches) are bounded again through the table they ask for (``check_table_size``).
FAMILY_OPTIONS: dict[str, OptionBound] = {
    "waves": OptionBound("count", 1, MAX_WAVES, f"give a whole number of Hanayo waves in 1..{MAX_WAVES:,}"),
    "iterations": OptionBound("count", 1, MAX_ITERATIONS,
                              f"give a whole number of iterations in 1..{MAX_ITERATIONS}"),
    # stage s of p keeps at most p - s weight versions
    "versions": OptionBound("count", 1, MAX_DEVICES,
                            f"give a whole number of weight versions per stage in 1..{MAX_DEVICES:,}"),
    # no table holds more stage-microbatches than it has ops; the least that works depends on
    # the family, which checks it
    "activation_limit": OptionBound("amount", 0, MAX_OPS, "give the activation memory per device in units of M_B "
                                    f"(one microbatch's F), at most {MAX_OPS:,}"),
    "latency": OptionBound("amount", 0, _LONGEST_MESSAGE_S,
                           f"give the link latency in seconds (or slots), in [0, {_LONGEST_MESSAGE_S:g}]"),
    "m_w": OptionBound("amount", 0, 1, "give M_W / M_B, the share of a microbatch's activations W still needs, "
                                       "in [0, 1]"),
    "forward_doubling": OptionBound("switch", fix="give 1 (on) or 0 (off)"),
    "backward_halving": OptionBound("switch", fix="give 1 (on) or 0 (off)"),
    "fused": OptionBound("switch", fix="give 1 (on) or 0 (off)"),
    "costs": OptionBound("costs"),
    "slices": OptionBound("count", 0, MAX_TERAPIPE_UNITS,
                          f"give a whole number of slices per sequence in 0..{MAX_TERAPIPE_UNITS} (0: TeraPipe's "
                          "dynamic program chooses), at most units"),
    "units": OptionBound("count", 1, MAX_TERAPIPE_UNITS,
                         f"give a whole number of token units per sequence in 1..{MAX_TERAPIPE_UNITS}"),
    "attention_share": OptionBound("amount", 0, 1, "give the share of a stage's time in causal attention, in [0, 1]"),
    "slice_overhead": OptionBound("amount", 0, 1, "give what each slice costs beyond its tokens, as a share of a "
                                                  "whole sequence's stage time, in [0, 1]"),
}


def check_family_option(name: str, value: object) -> object:
    """``value`` if it is within family option ``name``'s bounds (``FAMILY_OPTIONS``); else
    a PipeschedError naming the option, the value and what to give.

    >>> check_family_option("waves", 2)
    2
    >>> check_family_option("waves", 0)
    Traceback (most recent call last):
    ...
    pipesched.errors.PipeschedError: waves=0: give a whole number of Hanayo waves in 1..4,096
    """
    bound = FAMILY_OPTIONS[name]
    if not bound.holds(value):
        raise PipeschedError(f"{name}={shorten(value)}: {bound.fix}")
    return value


def check_iterations(value: object) -> int:
    """A count of iterations run back to back: a whole number in 1..MAX_ITERATIONS."""
    return check_family_option("iterations", value)  # type: ignore[return-value]


def check_sampled_work(samples: int, tasks: int) -> None:
    """Refuse a Monte Carlo run of ``samples`` samples of a graph of ``tasks`` ops and
    transfers that would simulate more than MAX_SAMPLED_TASKS tasks in all."""
    if samples * max(tasks, 1) > MAX_SAMPLED_TASKS:
        most = max(MAX_SAMPLED_TASKS // max(tasks, 1), 1)
        raise PipeschedError(f"samples={samples:,}: {samples:,} samples of {tasks:,} ops and transfers are "
                             f"{samples * tasks:,} simulated tasks, over the limit of {MAX_SAMPLED_TASKS:,}; "
                             f"give at most {most:,} samples of this table")


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
