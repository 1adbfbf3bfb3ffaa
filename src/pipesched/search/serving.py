"""The design space of ``pipesched serve search``: every way to serve a model on a cluster (or
on its first ``gpus`` devices) within latency targets, ranked by capacity per device.

Axes, each a tuple of the values to try (empty: every value that fits):

- a colocated deployment: ``replicas`` copies of a pipeline of ``pp`` stages of ``tp``
  devices, ``replicas x pp x tp`` at most the devices used; tp a divisor of the node size (a
  tensor-parallel group stays inside a node), pp a divisor of the devices left (1 included:
  no pipeline);
- with ``disaggregated``, also every split into prefill and decode instances (DistServe,
  Splitwise), each side a deployment of the same kind, both together within the devices;
- the residency: each stage's share of its layers kept on the GPU (``resident``, the rest
  streamed in from ``resident_from`` every iteration, ``ServeConfig.resident``);
- the scheduler, its sequence cap ``max_batch``, and its token cap: ``chunk`` for
  Sarathi-Serve, ``max_tokens`` for the others.

Each point is a ``pipesched.experiments.serving.ServingPoint`` named in the store by
``serving_key``; its evaluation is ``evaluate_capacity`` (the highest request rate at which
``attainment`` of the requests meet both SLOs, by bisection over rates on the same
requests). The store (``SearchStore`` of this format, one row per point written as it
settles) makes a search that is started again resume: settled points are read back, not
evaluated again. Points are evaluated over any map (the built-in one, ``process_map``,
``ray_pool``), in a fixed order, so the rows are the same with any of them.
"""

from __future__ import annotations

import builtins
import math
import os
import shlex
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

from pipesched.defaults import DEFAULTS
from pipesched.enums import Preemption, Routing, SchedulerName
from pipesched.errors import PipeschedError, require
from pipesched.experiments.grids import Mapper
from pipesched.experiments.serving import (
    CapacityRecord,
    ServingPoint,
    ServingWorkload,
    Targets,
    evaluate_capacity,
    serving_key,
)
from pipesched.limits import (
    MAX_BATCH_REQUESTS,
    MAX_BATCH_TOKENS,
    MAX_CLUSTER_RANKS,
    MAX_SEARCH_POINTS,
    MAX_STAGES,
    MAX_TENSOR_PARALLEL,
    check_count,
    check_name,
)
from pipesched.model import load_cluster
from pipesched.model.inference import check_resident
from pipesched.search.store import EVALUATED, INVALID, OUT_OF_MEMORY, SearchStore, store_schema
from pipesched.search.sweep import Progress
from pipesched.serving.config import (
    Disaggregation,
    Instances,
    KVSettings,
    SchedulerSpec,
    ServeConfig,
    instances_text,
    layout_label,
    stream_source,
    vocabulary_word,
)

Evaluate = Callable[[ServingPoint], CapacityRecord]


@dataclass(frozen=True)
class ServingSpace:
    """What to search (see the module docstring): the model and cluster, the axes, and what
    every point shares (cache, routing, overhead, the requests and the targets)."""

    model: str = DEFAULTS.serve_model
    cluster: str = DEFAULTS.serve_cluster
    gpus: int | None = None  # devices used, the cluster's first (None: all)
    tensor_parallel: tuple[int, ...] = ()  # empty: every divisor of the node size
    pipeline: tuple[int, ...] = ()  # empty: every divisor of the devices left
    replicas: tuple[int, ...] = ()  # empty: every count that fits
    disaggregated: bool = False  # also every prefill / decode split
    schedulers: tuple[str, ...] = (SchedulerName.VLLM, SchedulerName.SARATHI)
    max_batch: tuple[int, ...] = (DEFAULTS.max_batch,)
    max_tokens: tuple[int, ...] = (DEFAULTS.max_tokens,)  # static, orca, vllm
    chunks: tuple[int, ...] = (DEFAULTS.chunk,)  # sarathi
    block_size: int = DEFAULTS.block_size
    kv_fraction: float = DEFAULTS.kv_fraction
    preemption: str = DEFAULTS.preemption
    routing: str = DEFAULTS.routing
    cpu_overhead: float = DEFAULTS.cpu_overhead
    workload: ServingWorkload = field(default_factory=ServingWorkload)
    targets: Targets = field(default_factory=Targets)
    latency_model: str | None = None
    resident: tuple[float, ...] = (DEFAULTS.resident,)  # shares of each stage's layers on the GPU to try
    resident_from: str = DEFAULTS.resident_from  # where the rest live: host or disk

    def __post_init__(self) -> None:
        check_name("model", self.model)
        check_name("cluster", self.cluster)
        for name, limit in (("tensor_parallel", MAX_TENSOR_PARALLEL), ("pipeline", MAX_STAGES),
                            ("replicas", MAX_CLUSTER_RANKS),
                            ("max_batch", MAX_BATCH_REQUESTS), ("max_tokens", MAX_BATCH_TOKENS),
                            ("chunks", MAX_BATCH_TOKENS)):
            values = tuple(sorted({check_count(name, value, limit) for value in getattr(self, name)}))
            object.__setattr__(self, name, values)
        names = tuple(dict.fromkeys(vocabulary_word(SchedulerName, "scheduler", name) for name in self.schedulers))
        require(bool(names), "scheduler", "''", f"give at least one of {', '.join(SchedulerName)}")
        object.__setattr__(self, "schedulers", names)
        residencies = (self.resident,) if isinstance(self.resident, int | float) else tuple(self.resident)
        object.__setattr__(self, "resident", tuple(sorted({check_resident(value) for value in residencies})))
        for name in ("max_batch", "max_tokens", "chunks", "resident"):
            require(bool(getattr(self, name)), name, "''", "give at least one value")
        for name, kind in (("workload", ServingWorkload), ("targets", Targets)):
            value = getattr(self, name)
            object.__setattr__(self, name, kind(**value) if isinstance(value, dict) else value)
        vocabulary_word(Preemption, "preemption", self.preemption)
        vocabulary_word(Routing, "routing", self.routing)
        KVSettings(self.block_size, self.kv_fraction)
        stream_source(self.resident_from)

    def spec(self) -> dict:
        """The space as plain data: what the store keys a search by."""
        return asdict(self)

    def devices(self) -> int:
        """Devices the search uses."""
        cluster = load_cluster(self.cluster)
        if self.gpus is None:
            return cluster.num_devices
        return check_count("gpus", self.gpus, cluster.num_devices, what=f"devices of cluster {cluster.name}")

    def deployments(self) -> list[Instances]:
        """Every colocated deployment of the space that fits the devices used."""
        cluster = load_cluster(self.cluster)
        devices = self.devices()
        node_size = math.gcd(*Counter(cluster.node_of[:devices]).values())
        found = [Instances(tp, pp, count)
                 for tp in self.tensor_parallel or _divisors(node_size) if tp <= devices
                 for pp in self.pipeline or _divisors(devices // tp)
                 for count in self.replicas or range(1, devices // (tp * pp) + 1)
                 if tp * pp * count <= devices]
        require(bool(found), "gpus", devices, f"no replicas x pipeline x tensor-parallel deployment of {devices} "
                "devices in this space (tp a divisor of the node size); widen --tensor-parallel, --pipeline or "
                "--replicas, or use more devices")
        return found

    def layouts(self) -> list[Instances | Disaggregation]:
        """The colocated deployments, then (``disaggregated``) every prefill and decode pair
        of them whose devices together fit."""
        colocated = self.deployments()
        devices = self.devices()
        split = [Disaggregation(prefill, decode) for prefill in colocated for decode in colocated
                 if prefill.devices + decode.devices <= devices] if self.disaggregated else []
        require(not self.disaggregated or bool(split), "disaggregated", devices,
                "no prefill and decode pair of the space fits the devices; use more devices or smaller -t / -p")
        return [*colocated, *split]

    def schedulers_of_space(self) -> list[SchedulerSpec]:
        """Every scheduler and caps of the space: Sarathi-Serve with each chunk, the others
        with each token cap, each with each sequence cap."""
        preemption = Preemption(self.preemption)
        return [SchedulerSpec(name, batch, tokens if name != SchedulerName.SARATHI else DEFAULTS.max_tokens,
                              tokens if name == SchedulerName.SARATHI else DEFAULTS.chunk, preemption)
                for name in self.schedulers for batch in self.max_batch
                for tokens in (self.chunks if name == SchedulerName.SARATHI else self.max_tokens)]

    def points(self) -> list[ServingPoint]:
        """Every point of the space, in a fixed order: layout, residency, then scheduler and
        caps."""
        layouts, schedulers = self.layouts(), self.schedulers_of_space()
        size = len(layouts) * len(self.resident) * len(schedulers)
        require(size <= MAX_SEARCH_POINTS, "space", f"{size:,} points",
                f"at most {MAX_SEARCH_POINTS:,} in one search; narrow it with --tensor-parallel, --pipeline, "
                "--replicas, --resident or --scheduler")
        template = ServingPoint(model=self.model, cluster=self.cluster, workload=self.workload, targets=self.targets,
                                latency_model=self.latency_model)
        kv, routing = KVSettings(self.block_size, self.kv_fraction), Routing(self.routing)
        stream_from = stream_source(self.resident_from)
        points = []
        for layout in layouts:
            colocated = layout if isinstance(layout, Instances) else Instances()
            split = layout if isinstance(layout, Disaggregation) else None
            points += [template.replace(config=ServeConfig(colocated, scheduler, kv, routing, self.cpu_overhead,
                                                           split, resident=resident, stream_from=stream_from))
                       for resident in self.resident for scheduler in schedulers]
        return points


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@dataclass(frozen=True)
class ServingRow:
    """One point of a serving search and what became of it: the fields the point varies
    over its space (``serving_row``), the capacity found, why not. Rates in requests per
    second, times in seconds."""

    key: str  # ``serving_key`` of the point
    layout: str  # ``layout_label``: R x (PP x TP), or prefill + decode instances
    replicas: int  # colocated: copies of the model (disaggregated: the decode instances)
    tp: int
    pp: int
    prefill: str  # disaggregated: the prefill instances, TPxPPxN ("" colocated)
    scheduler: str
    max_batch: int
    max_tokens: int
    chunk: int
    resident: float  # share of each stage's layers kept on the GPU
    devices: int
    status: str  # evaluated, out of memory or invalid
    max_qps: float | None = None
    qps_per_gpu: float | None = None
    slo_attainment: float | None = None  # at max_qps
    ttft_p99_s: float | None = None  # at max_qps
    tpot_p99_s: float | None = None  # at max_qps
    probes: int = 0  # simulated runs of its bisection
    reason: str = ""  # out of memory, invalid: why
    run: int = 0  # which start of the search wrote the row

    @property
    def label(self) -> str:
        """The point as a reader names it.

        >>> serving_row(ServingPoint(), CapacityRecord("k", INVALID, 8)).label
        'tp4 pp2 x1 sarathi b256 chunk512'
        """
        caps = f"chunk{self.chunk}" if self.scheduler == SchedulerName.SARATHI else f"tokens{self.max_tokens}"
        residency = "" if self.resident == DEFAULTS.resident else f" resident{self.resident:g}"
        return f"{self.layout}{residency} {self.scheduler} b{self.max_batch} {caps}"


def serving_row(point: ServingPoint, record: CapacityRecord, *, run: int = 0) -> ServingRow:
    """The row of ``point`` once ``record`` settled it."""
    config = point.config
    served = config.instances if config.disaggregate is None else config.disaggregate.decode
    prefill = "" if config.disaggregate is None else instances_text(config.disaggregate.prefill)
    scheduler = config.scheduler
    return ServingRow(serving_key(point), layout_label(config), served.count, served.tp, served.pp, prefill,
                      str(scheduler.name), scheduler.max_batch, scheduler.max_tokens, scheduler.chunk,
                      config.resident, record.devices, str(record.status), record.max_qps, record.qps_per_gpu, record.slo_attainment,
                      record.ttft_p99_s, record.tpot_p99_s, record.probes, record.reason, run)


FORMAT = "pipesched-serve-search"
VERSION = 2  # 2: the residency column
_POINTS_TABLE = """CREATE TABLE points (
    search INTEGER NOT NULL REFERENCES searches(id),
    key TEXT NOT NULL, layout TEXT NOT NULL, replicas INTEGER NOT NULL, tp INTEGER NOT NULL, pp INTEGER NOT NULL,
    prefill TEXT NOT NULL, scheduler TEXT NOT NULL, max_batch INTEGER NOT NULL, max_tokens INTEGER NOT NULL,
    chunk INTEGER NOT NULL, resident REAL NOT NULL, devices INTEGER NOT NULL, status TEXT NOT NULL, max_qps REAL, qps_per_gpu REAL,
    slo_attainment REAL, ttft_p99_s REAL, tpot_p99_s REAL, probes INTEGER NOT NULL, reason TEXT NOT NULL,
    run INTEGER NOT NULL,
    PRIMARY KEY (search, key)
)"""


class ServingStore(SearchStore):
    """The results store of ``serve search``: the search store's file, checks and
    transactions (``search.store``) with a serving search's spaces and rows."""

    FORMAT = FORMAT
    VERSION = VERSION
    SCHEMA = store_schema(FORMAT, VERSION, _POINTS_TABLE)
    ROW = ServingRow
    NEEDED: ClassVar[dict[str, tuple[str, ...]]] = {EVALUATED: ("max_qps", "qps_per_gpu")}

    def check_space(self, space: dict) -> None:
        names = {f.name for f in fields(ServingSpace)}
        if set(space) != names:
            raise PipeschedError(f"space: fields {sorted(set(space) ^ names)} differ")
        ServingSpace(**space)


def ranked(rows: tuple[ServingRow, ...] | list[ServingRow]) -> list[ServingRow]:
    """The evaluated rows, most requests per second per device first (ties: fewer devices,
    then label)."""
    return sorted((r for r in rows if r.status == EVALUATED), key=lambda r: (-r.qps_per_gpu, r.devices, r.label))


@dataclass(frozen=True)
class ServingSearchResult:
    """A finished serving search (or what a store holds of one)."""

    space: dict  # the ServingSpace as plain data
    rows: tuple[ServingRow, ...]  # every point of the space that settled
    seconds: float = 0.0
    db: str = ""
    runs: int = 1
    evaluated_now: int = 0  # points this run evaluated (the others were read back)

    @property
    def ranking(self) -> list[ServingRow]:
        return ranked(self.rows)

    @property
    def best(self) -> ServingRow | None:
        ranking = self.ranking
        return ranking[0] if ranking else None

    def count(self, status: str) -> int:
        return sum(1 for r in self.rows if r.status == status)

    def why(self, status: str) -> tuple[Counter[str], ServingRow | None]:
        """How many rows of ``status`` each field the reason names has, and one row of the most common."""
        kinds: Counter[str] = Counter()
        first: dict[str, ServingRow] = {}
        for row in sorted((r for r in self.rows if r.status == status), key=lambda r: r.label):
            kind = row.reason.split("=", 1)[0] if "=" in row.reason.split(":", 1)[0] else row.scheduler
            kinds[kind] += 1
            first.setdefault(kind, row)
        return kinds, (first[kinds.most_common(1)[0][0]] if kinds else None)

    def to_dict(self, *, top: int | None = None) -> dict:
        """``serve search --json``: ``best``, ``rows`` (the ``top`` first of the ranking;
        None: all), the counts, ``seconds``, ``space`` and ``db``."""
        ranking = self.ranking
        shown = ranking if top is None else ranking[:top]
        return {"best": asdict(self.best) if self.best is not None else None,
                "rows": [asdict(row) for row in shown], "points": len(self.rows),
                "evaluated_points": self.count(EVALUATED), "out_of_memory_points": self.count(OUT_OF_MEMORY),
                "invalid_points": self.count(INVALID), "evaluated_now": self.evaluated_now,
                "seconds": self.seconds, "space": self.space, "db": self.db}


def search_serving(space: ServingSpace, *, db: str | os.PathLike[str],
                   mapper: Mapper | AbstractContextManager[Mapper] = builtins.map, evaluate: Evaluate = evaluate_capacity,
                   progress: Progress | None = None) -> ServingSearchResult:
    """Search ``space`` into the store at ``db`` (module docstring), resuming what it holds
    of the space. The space is enumerated first: a space refused leaves no store. ``mapper``
    as ``search.sweep.search`` takes it; ``evaluate``: one point's capacity (a module-level
    function, so that it travels to workers); ``progress(phase, done, total)`` is called as
    points settle, phase "capacity"."""
    began = time.monotonic()
    points = {serving_key(point): point for point in space.points()}
    pool = mapper if isinstance(mapper, AbstractContextManager) else nullcontext(mapper)
    with pool as mapping, ServingStore.open(db) as store:
        search_id, run, stored = store.begin(space.spec())
        rows = {row.key: row for row in stored if row.key in points}
        pending = [point for key, point in points.items() if key not in rows]
        done = len(rows)
        for row in _settled(pending, mapping, evaluate, run):
            store.write(search_id, [row])  # one transaction per point: a killed search loses none it finished
            rows[row.key] = row
            done += 1
            if progress is not None:
                progress("capacity", done, len(points))
    return ServingSearchResult(space.spec(), tuple(rows[key] for key in points if key in rows),
                               seconds=time.monotonic() - began, db=str(store.path), runs=run,
                               evaluated_now=len(pending))


def _settled(points: list[ServingPoint], mapping: Mapper, evaluate: Evaluate, run: int) -> Iterator[ServingRow]:
    for point, record in zip(points, mapping(evaluate, points), strict=True):
        yield serving_row(point, record, run=run)


def read_serving_rows(path: str | os.PathLike[str]) -> list[ServingSearchResult]:
    """Every serving search stored at ``path`` (which must exist)."""
    with ServingStore.open(path, read_only=True) as store:
        return [ServingSearchResult(space, tuple(store.rows(search)), db=str(store.path))
                for search, space in store.searches()]


def capacity_command_line(space: dict, row: ServingRow) -> str:
    """The ``pipesched serve capacity`` command line of ``row``'s configuration."""
    if row.prefill:
        layout = f"--disaggregate {row.prefill},{row.tp}x{row.pp}x{row.replicas}"
    else:
        layout = f"-t {row.tp} -p {row.pp} --replicas {row.replicas}"
    caps = f"--chunk {row.chunk}" if row.scheduler == SchedulerName.SARATHI else f"--max-tokens {row.max_tokens}"
    workload = ServingWorkload(**space["workload"]) if isinstance(space["workload"], dict) else space["workload"]
    source = (f"--trace {shlex.quote(workload.trace)}" if workload.trace is not None else
              f"--requests {workload.requests} --arrival {workload.arrival} --prompt-tokens {workload.prompt_tokens} "
              f"--output-tokens {workload.output_tokens} --seed {workload.seed}")
    targets = Targets(**space["targets"]) if isinstance(space["targets"], dict) else space["targets"]
    if row.resident != DEFAULTS.resident:
        source += f" --resident {row.resident:g} --resident-from {space['resident_from']}"
    return (f"pipesched serve capacity --model {shlex.quote(space['model'])} --cluster {shlex.quote(space['cluster'])} "
            f"{layout} --scheduler {row.scheduler} --max-batch {row.max_batch} {caps} {source} "
            f"--slo-ttft {targets.slo_ttft:g} --slo-tpot {targets.slo_tpot:g} --attainment {targets.attainment:g}")

