"""The closed vocabularies the library compares, one enum each.

Each is a ``StrEnum``: a member is equal to its value, prints (and reprs) as it and goes
into JSON, CSV and the search store as it, so every output keeps the words it always had;
code compares members, never free strings.

>>> Level.SIM == "sim", f"{Stream.HOST_LINK}", [Role.TRAINS]
(True, 'host link', ['trains'])
"""

from __future__ import annotations

from enum import StrEnum


class Word(StrEnum):
    """A member of a closed vocabulary: its value in every output, its repr included."""

    def __repr__(self) -> str:
        return repr(self.value)


class Role(Word):
    """What a stage does in the backward, from the frozen stages (``rules.stage_roles``)."""

    TRAINS = "trains"  # its weights train: input and weight gradients
    INPUT_GRADIENT = "input gradient"  # frozen, with a training stage before it: input gradient only
    FORWARD_ONLY = "forward only"  # frozen, with every stage before it frozen: no backward


class RunsOn(Word):
    """On which stages an op kind runs (``rules.Rule.runs_on``), by their roles."""

    ALL_STAGES = "all stages"
    BACKWARD_STAGES = "stages with a backward"
    TRAINED_STAGES = "trained stages"


class Stream(Word):
    """The stream of a device an op runs on."""

    COMPUTE = "compute"
    HOST_LINK = "host link"  # offloads and reloads, beside the compute stream


class Level(Word):
    """The three evaluation levels (``experiments.evaluation``)."""

    FORMULA = "formula"  # level 1: the family's closed form, in slots
    TABLE = "table"  # level 2: the slot table, in slots
    SIM = "sim"  # level 3: the communication-aware simulation, in seconds


class TimeUnit(Word):
    """The unit of a timeline's and a result's times."""

    SECONDS = "s"
    SLOT = "slot"  # a slot table's unit time (F = 1, B = 2, ...)


class MemoryUnit(Word):
    """The unit of a memory trace or a result's peak memory."""

    BYTES = "bytes"
    STAGE_MICROBATCHES = "stage-microbatches"  # a slot table's in-flight activations
    ACTIVATION_UNITS = "1F1B-stage activations"  # the same rescaled to a 1F1B stage's
    KV_TOKENS = "KV tokens"  # a serving timeline's KV cache when its bytes per token are unknown


class IterationKind(Word):
    """What one serving iteration batches (``pipesched.serving.timeline``'s op kinds)."""

    PREFILL = "P"  # prefill chunks only
    DECODE = "D"  # decode steps only
    MIXED = "M"  # prefill chunks and decode steps together (Sarathi-Serve's stall-free batches)


class SearchStatus(Word):
    """Where a point of a design-space search stands (``search.store``)."""

    BOUNDED = "bounded"  # its memory and time bound are known; not simulated yet
    EVALUATED = "evaluated"  # simulated
    OUT_OF_MEMORY = "out of memory"  # some device's peak exceeds its memory
    PRUNED = "pruned"  # a simulated point needing no more memory is no slower than its bound
    INVALID = "invalid"  # the point cannot be built or run


class SolverStatus(Word):
    """What the CP-SAT solver answered (``search.cpsat``), and a synthesis result's status."""

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    UNKNOWN = "unknown"  # no answer within the time limit


class SchedulerName(Word):
    """The replica-level batch schedulers (``pipesched.serving.schedulers``)."""

    STATIC = "static"  # a batch runs to its last request's end before the next one forms
    ORCA = "orca"  # iteration-level: whole prefills join between iterations
    VLLM = "vllm"  # continuous batching, waiting prefills first, preemption when the cache is full
    SARATHI = "sarathi"  # chunked prefill, running decodes first: stall-free batching


class Preemption(Word):
    """What happens to a request whose KV cache no longer fits."""

    RECOMPUTE = "recompute"  # drop its cache; its prompt and the tokens made so far are prefilled again
    SWAP = "swap"  # move its cache to host memory over the host link, and back when it resumes


class Routing(Word):
    """How arriving requests are spread over replicas (or decode instances)."""

    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"  # the replica with the fewest requests not yet finished


class Collective(Word):
    """The collective operations a layer or a step runs (``pipesched.model.collectives``)."""

    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"  # expert dispatch and combine, Ulysses context parallelism
    SEND_RECV = "send-recv"  # point to point (a ring attention KV exchange step, a pipeline hand-off)


class Group(Word):
    """The parallel group a collective runs over."""

    TENSOR = "tensor"  # the tensor-parallel ranks of a layer (attention and dense MLP)
    EXPERT = "expert"  # the expert-parallel ranks of a MoE layer (dispatch and combine)
    EXPERT_TENSOR = "expert tensor"  # the tensor-parallel ranks inside one expert (parallel folding)
    CONTEXT = "context"  # the context-parallel ranks (ring attention, all-to-all or all-gather of KV)
    DATA = "data"  # the data-parallel replicas (the gradient all-reduce)


class Tier(Word):
    """Where bytes live: device memory, host memory or disk (offloading, swapping, reload)."""

    DEVICE = "device memory"  # the accelerator's own memory (FlexGen's "GPU")
    HOST = "host memory"  # the host's memory over the host link (FlexGen's "CPU")
    DISK = "disk"  # behind host memory
