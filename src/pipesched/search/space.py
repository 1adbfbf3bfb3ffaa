"""The design space of ``pipesched search``: every way to train a model on a cluster (or on
its first ``gpus`` devices) with a global batch of G sequences.

Axes, each a tuple of the values to try (empty: every value that fits):

- a layout (t, p, d): tensor parallel t, a divisor of the node size (a tensor-parallel group
  stays inside a node); pipeline devices p >= 2 (a schedule needs two); data-parallel
  pipelines d with d x p x t = the devices used and d dividing G. Ranks follow
  ``pipesched.model.pipeline_ranks``: replica r of the pipeline holds ranks r p t onwards.
- the micro-batch size b, dividing G / d: each pipeline runs m = G / (d b) microbatches;
- the schedule family, with v chunks per device for the families that take it;
- the partition of layers into stages, the recompute mode and the ZeRO stage of the optimizer
  state (ZeRO-1 only with d > 1: one pipeline has nothing to shard).

A point is a ``pipesched.experiments.Point`` (built by ``experiments.point.family_point``, as
every command builds its points); ``experiments.point.point_key`` names it in the results store.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from dataclasses import asdict, dataclass

from pipesched.defaults import DEFAULTS
from pipesched.errors import PipeschedError, require
from pipesched.experiments.point import ZERO_STAGES, Point, family_point, zero_applies
from pipesched.experiments.setup import PARTITION_METHODS
from pipesched.generators import FAMILIES, get_family
from pipesched.limits import MAX_SEARCH_POINTS
from pipesched.model import layer_costs, load_cluster, load_model
from pipesched.model.spec import DTYPE_BYTES, RECOMPUTE_MODES, TrainingSettings
from pipesched.model.transformer import routed_expert_params
from pipesched.units import GiB

# the largest global batch a search takes (sequences per iteration)
MAX_GLOBAL_BATCH = 1 << 20
# the most points one search enumerates (each a Point in memory, then a row in the store)


@dataclass(frozen=True)
class Layout:
    """How the devices split: t x p x d of them."""

    tp: int  # tensor-parallel degree
    pp: int  # pipeline devices
    dp: int  # data-parallel pipelines


@dataclass(frozen=True)
class SearchSpace:
    """What to search (see the module docstring). Model and cluster are preset names or
    files, as ``--model`` and ``--cluster`` take them."""

    model: str = DEFAULTS.model
    cluster: str = DEFAULTS.cluster
    global_batch: int = DEFAULTS.global_batch  # G, sequences per iteration
    seq_len: int = DEFAULTS.seq_len  # tokens per sequence
    dtype: str = DEFAULTS.dtype  # training dtype of the analytical costs
    sequence_parallel: bool = DEFAULTS.sequence_parallel  # norms and dropouts split over the tensor-parallel group
    gpus: int | None = None  # devices used, the cluster's first (None: all)
    schedules: tuple[str, ...] = ()  # families (empty: every synchronous one)
    chunks: tuple[int, ...] = (2, 4)  # v for the families that take it
    partitions: tuple[str, ...] = PARTITION_METHODS
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    zero: tuple[int, ...] = ZERO_STAGES
    tensor_parallel: tuple[int, ...] = ()  # t values (empty: every divisor of the node size)
    pipeline: tuple[int, ...] = ()  # p values (empty: all)
    data_parallel: tuple[int, ...] = ()  # d values (empty: all)
    micro_batch_sizes: tuple[int, ...] = ()  # b values (empty: every divisor of G / d)
    # EP values of a mixture-of-experts model (folded over the stage's t x d ranks: those that
    # divide d and the experts are searched)
    expert_parallel: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        require(isinstance(self.global_batch, int) and 1 <= self.global_batch <= MAX_GLOBAL_BATCH,
                "global_batch", self.global_batch, f"must be a whole number of sequences in 1..{MAX_GLOBAL_BATCH}")
        require(isinstance(self.seq_len, int) and self.seq_len >= 1, "seq_len", self.seq_len,
                "must be a whole number of tokens >= 1")
        for name in self.schedules:
            get_family(name)
        # by default the flushed, synchronous families: an asynchronous pipeline trains on stale
        # weights (another optimizer, not only another schedule), so it is searched when named
        synchronous = tuple(name for name in FAMILIES if not get_family(name).asynchronous)
        object.__setattr__(self, "schedules", tuple(self.schedules) or synchronous)
        for name in ("chunks", "tensor_parallel", "pipeline", "data_parallel", "micro_batch_sizes", "expert_parallel"):
            values = tuple(getattr(self, name))
            for value in values:
                require(isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_GLOBAL_BATCH,
                        name, value, "must be whole numbers >= 1")
            object.__setattr__(self, name, tuple(sorted(set(values))))
        require(all(v >= 2 for v in self.chunks), "chunks", min(self.chunks, default=2),
                "chunked families take v >= 2")
        for value in self.partitions:
            require(value in PARTITION_METHODS, "partitions", value, f"choose from {', '.join(PARTITION_METHODS)}")
        for value in self.recompute:
            require(value in RECOMPUTE_MODES, "recompute", value, f"choose from {', '.join(RECOMPUTE_MODES)}")
        for value in self.zero:
            require(value in ZERO_STAGES, "zero", value, "choose from 0, 1")
        require(self.dtype in DTYPE_BYTES, "dtype", self.dtype, f"must be one of {', '.join(DTYPE_BYTES)}")
        require(isinstance(self.sequence_parallel, bool), "sequence_parallel", self.sequence_parallel,
                "must be true or false")
        for name in ("partitions", "recompute", "zero", "expert_parallel"):
            values = tuple(dict.fromkeys(getattr(self, name)))
            require(len(values) >= 1, name, "''", "give at least one value")
            object.__setattr__(self, name, values)

    def spec(self) -> dict:
        """The space as plain data: what a results store keys a search by."""
        return asdict(self)

    def describe(self) -> str:
        """``MODEL on CLUSTER (N devices), global batch G x S tokens``."""
        return (f"{self.model} on {self.cluster} ({self.devices()} devices), global batch {self.global_batch} x "
                f"{self.seq_len} tokens")

    def devices(self) -> int:
        """Devices the search uses."""
        cluster = _cluster(self.cluster)
        if self.gpus is None:
            return cluster.num_devices
        require(isinstance(self.gpus, int) and 2 <= self.gpus <= cluster.num_devices, "gpus", self.gpus,
                f"cluster {cluster.name} has {cluster.num_devices} devices; use 2..{cluster.num_devices}")
        return self.gpus

    def layouts(self) -> list[Layout]:
        """Every (t, p, d) of the space whose d divides the global batch; raises when none
        does, naming the data-parallel sizes it tried."""
        cluster = _cluster(self.cluster)
        devices = self.devices()
        node_size = math.gcd(*Counter(cluster.node_of[:devices]).values())
        tried: list[int] = []
        found = []
        for tp in self.tensor_parallel or _divisors(node_size):
            if devices % tp or node_size % tp:
                continue
            for pp in self.pipeline or _divisors(devices // tp):
                if pp < 2 or (devices // tp) % pp:
                    continue
                dp = devices // (tp * pp)
                if self.data_parallel and dp not in self.data_parallel:
                    continue
                tried.append(dp)
                if self.global_batch % dp == 0:
                    found.append(Layout(tp, pp, dp))
        if not tried:
            raise PipeschedError(
                f"gpus={devices}: no tensor-parallel x pipeline x data-parallel split of {devices} devices in this "
                f"space (t a divisor of the node size {node_size}, p >= 2); widen --tensor-parallel, --pipeline or "
                "--dp, or use more devices")
        if not found:
            sizes = ", ".join(str(d) for d in sorted(set(tried)))
            raise PipeschedError(
                f"global_batch={self.global_batch}: not divisible by any data-parallel size of the space ({sizes}); "
                "give a global batch that one of them divides, or other --dp / --gpus")
        return found

    def points(self) -> list[Point]:
        """Every point of the space, in a fixed order: by pipeline size and microbatch count,
        then layout, micro-batch size, recompute, ZeRO stage, partition, family and chunks.
        Neighbours share their schedule and layer costs, so a worker that gets a run of them
        builds each once.

        >>> space = SearchSpace(model="llama3-8b", cluster="1x8-h100", global_batch=8, schedules=("1f1b",),
        ...                     pipeline=(8,), partitions=("balanced",), recompute=("full",), zero=(0,))
        >>> [(point.family, point.p, point.m, point.micro_batch_size) for point in space.points()]
        [('1f1b', 8, 1, 8), ('1f1b', 8, 2, 4), ('1f1b', 8, 4, 2), ('1f1b', 8, 8, 1)]
        """
        variants = sum(len(self.chunks) if get_family(family).takes_v else 1 for family in self.schedules)
        options = len(self.partitions) * len(self.recompute) * variants
        size = sum(options * sum(1 for zero in self.zero if zero_applies(zero, layout.dp))
                   * len(self._expert_degrees(layout))
                   * sum(1 for b in self.micro_batch_sizes or _divisors(self.global_batch // layout.dp)
                         if (self.global_batch // layout.dp) % b == 0)
                   for layout in self.layouts())
        require(size <= MAX_SEARCH_POINTS, "space", f"{size:,} points",
                f"at most {MAX_SEARCH_POINTS:,} in one search; narrow it with --schedules, --tensor-parallel, --pipeline, "
                "--dp, --micro-batch-sizes, --partitions or --recompute")
        template = self.template()
        points = []
        for layout in self.layouts():
            per_replica = self.global_batch // layout.dp
            for b in self.micro_batch_sizes or _divisors(per_replica):
                if per_replica % b:
                    continue
                for recompute in self.recompute:
                    for zero in self.zero:
                        if not zero_applies(zero, layout.dp):
                            continue
                        for partition, ep in itertools.product(self.partitions, self._expert_degrees(layout)):
                            workload = template.replace(dp=layout.dp, tp=layout.tp, micro_batch_size=b,
                                                        recompute=recompute, partition=partition, zero=zero, ep=ep)
                            for family in self.schedules:
                                chunked = get_family(family).takes_v
                                points.extend(family_point(workload, family, p=layout.pp, m=per_replica // b, v=v)
                                              for v in (self.chunks if chunked else (None,)))
        # runs of one pipeline size and microbatch count: a worker builds each schedule once
        return sorted(points, key=lambda point: (point.p, point.m))

    def _expert_degrees(self, layout: Layout) -> tuple[int, ...]:
        """The space's EP values a layout can fold (each expert keeps the layout's t: EP
        divides d) that divide the model's experts."""
        experts = _experts(self.model)
        return tuple(ep for ep in self.expert_parallel if layout.dp % ep == 0 and experts % ep == 0)

    def template(self) -> Point:
        """What every point of the space shares: the model, the cluster and the training
        settings the space fixes (each point sets the rest)."""
        return Point(model=self.model, cluster=self.cluster, seq_len=self.seq_len, dtype=self.dtype,
                     sequence_parallel=self.sequence_parallel)

    def check_capacity(self) -> None:
        """Refuse a cluster that cannot hold the model's parameters, gradients and optimizer
        state in any layout of the space, even split evenly over all its devices."""
        cluster = _cluster(self.cluster)
        model = load_model(self.model)
        devices = self.devices()
        settings = TrainingSettings(seq_len=min(self.seq_len, 128), tensor_parallel=1)
        params = sum(layer.params for layer in layer_costs(model, cluster.devices[0], settings))
        experts = routed_expert_params(model)  # split further over the EP ranks
        capacity = min(cluster.devices[r].memory_bytes for r in range(devices))
        need = min((params - experts + experts / max(self._expert_degrees(layout), default=1))
                   / (layout.tp * layout.pp) * TrainingSettings(
            optimizer_shards=layout.dp if max(self.zero) else 1).static_bytes_per_param
                   for layout in self.layouts())
        if need > capacity:
            raise PipeschedError(
                f"cluster={cluster.name}: {devices} devices of {capacity / GiB:.0f} GiB cannot hold {model.name}: its "
                f"{params / 1e9:.3g} B parameters with their gradients and optimizer state need at least "
                f"{need / GiB:.0f} GiB per device in every layout of the space; use a bigger cluster (--cluster, "
                "--gpus) or a smaller model")


@functools.lru_cache(maxsize=16)
def _experts(model: str) -> int:
    """Routed experts of ``model`` (1 for a dense one)."""
    return load_model(model).num_experts


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _cluster(name: str):
    return load_cluster(name)
