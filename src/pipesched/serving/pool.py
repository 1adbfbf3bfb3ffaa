"""Several models sharing one pool of devices (AlpaServe, MuxServe): the deployment file and
its record (``PoolSpec``), each model with its traffic and SLOs (``ModelTraffic``).

A deployment file is YAML::

    pool: 1x8-h100                # the devices: a cluster preset, or a cluster file
    scheduler: {name: sarathi, max_batch: 64, chunk: 512}   # every model's (optional)
    kv: {block_size: 16, kv_fraction: 0.9}                  # (optional)
    cpu_overhead: 0.002           # seconds per iteration (optional)
    models:
      - name: chat                # unique in the pool
        model: llama3-8b          # a model preset or file
        traffic: {requests: 200, qps: 4, arrival: "gamma:2", prompt_tokens: "uniform:64-512",
                  output_tokens: "uniform:16-128", seed: 1}   # or {trace: FILE}
        slo: {ttft: 0.5, tpot: 0.05}                          # seconds, both required
        parallel: [1x1, 2x1]      # the TP x PP shapes a replica may take (default 1x1)

Files named in it (a cluster, a model, a trace) are read relative to the file's folder. The
scheduler, KV-cache and overhead settings are ``ServeConfig``'s pieces, one for the pool;
each model keeps its own trace (seconds from the pool's start) and SLOs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pipesched.defaults import DEFAULTS
from pipesched.enums import Preemption, SchedulerName
from pipesched.errors import PipeschedError, require, shorten
from pipesched.io.files import read_text
from pipesched.io.yaml_text import load_yaml
from pipesched.limits import (
    MAX_POOL_MODELS,
    MAX_POOL_SHAPES,
    MAX_SECONDS,
    MAX_STAGES,
    MAX_TENSOR_PARALLEL,
    check_count,
    check_name,
    parse_int,
)
from pipesched.model.clusters import load_cluster
from pipesched.model.hardware import Cluster
from pipesched.model.loading import load_model
from pipesched.model.spec import ModelSpec
from pipesched.serving.config import KVSettings, SchedulerSpec, vocabulary_word
from pipesched.serving.results import check_slo
from pipesched.serving.trace import Trace, TraceSpec, read_trace, synthetic_trace

_TOP_KEYS = ("pool", "scheduler", "kv", "cpu_overhead", "models")
_MODEL_KEYS = ("name", "model", "traffic", "slo", "parallel")
_SCHEDULER_KEYS = ("name", "max_batch", "max_tokens", "chunk", "preemption")
_KV_KEYS = ("block_size", "kv_fraction")
_SLO_KEYS = ("ttft", "tpot")
# a synthetic traffic's keys -> TraceSpec's fields
_TRAFFIC_FIELDS = {"requests": "requests", "qps": "qps", "arrival": "arrival", "prompt_tokens": "prompt",
                   "output_tokens": "output", "seed": "seed"}
_FILE_SUFFIXES = (".yaml", ".yml", ".json", ".csv")


@dataclass(frozen=True, eq=False)
class ModelTraffic:
    """One model of the pool: what it is, the requests it gets and the SLOs they must meet."""

    name: str  # unique in the pool
    model: ModelSpec
    trace: Trace  # its requests, seconds from the pool's start
    slo_ttft_s: float  # seconds to the first token
    slo_tpot_s: float  # seconds per output token after the first
    shapes: tuple[tuple[int, int], ...] = ((1, 1),)  # the (TP, PP) shapes one of its replicas may take


@dataclass(frozen=True, eq=False)
class PoolSpec:
    """A pool of devices and the models it serves, under one scheduler and cache setting."""

    cluster: Cluster
    models: tuple[ModelTraffic, ...]
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    kv: KVSettings = field(default_factory=KVSettings)
    cpu_overhead_s: float = DEFAULTS.cpu_overhead  # per iteration, on the first stage

    def __post_init__(self) -> None:
        check_count("models", len(self.models), MAX_POOL_MODELS, what="models of a pool")
        names = [traffic.name for traffic in self.models]
        twice = sorted({name for name in names if names.count(name) > 1})
        require(not twice, "name", twice[0] if twice else "", "give each model of the pool its own name")
        require(0.0 <= self.cpu_overhead_s <= MAX_SECONDS, "cpu_overhead", self.cpu_overhead_s,
                f"give seconds from 0 to {MAX_SECONDS:g}")


def pool_presets() -> tuple[str, ...]:
    """The built-in deployments (``data/pools/``), by name."""
    return tuple(sorted(entry.name.removesuffix(".yaml") for entry in _preset_dir().iterdir()
                        if entry.name.endswith(".yaml")))


def _preset_dir():
    return resources.files("pipesched") / "data" / "pools"


def load_pool(path: str | os.PathLike[str]) -> PoolSpec:
    """The deployment file at ``path`` (module docstring), or a built-in one by name
    (``pool_presets``: ``example``)."""
    if not os.path.exists(path) and str(path) in pool_presets():
        with resources.as_file(_preset_dir() / f"{path}.yaml") as found:
            return parse_pool(read_text(found, "deployment"), source=str(path), folder=found.parent)
    return parse_pool(read_text(path, "deployment"), source=str(path), folder=Path(path).parent)


def parse_pool(text: str, *, source: str = "deployment", folder: Path = Path(".")) -> PoolSpec:
    """A deployment file's text; the files it names are read from ``folder``."""
    data = _mapping(load_yaml(text, field="deployment", source=source), "deployment", _TOP_KEYS)
    require("pool" in data, "pool", "missing", "name the devices: a cluster preset or file (pool: 1x8-h100)")
    require("models" in data, "models", "missing", "list the models the pool serves (models: - name: ...)")
    models = data["models"]
    require(isinstance(models, list) and len(models) > 0, "models", shorten(models), "give a list of models")
    check_count("models", len(models), MAX_POOL_MODELS, what="models of a pool")
    cluster = load_cluster(_located(_text(data["pool"], "pool"), folder))
    overhead = data.get("cpu_overhead", DEFAULTS.cpu_overhead)
    require(_is_number(overhead), "cpu_overhead", shorten(overhead), "give seconds per iteration")
    return PoolSpec(cluster=cluster, models=tuple(_model(entry, folder) for entry in models),
                    scheduler=_scheduler(data.get("scheduler", {})), kv=_kv(data.get("kv", {})),
                    cpu_overhead_s=float(overhead))


def _model(entry: object, folder: Path) -> ModelTraffic:
    entry = _mapping(entry, "models", _MODEL_KEYS)
    for key in ("name", "model", "traffic", "slo"):
        require(key in entry, key, "missing", f"give every model its {key} ({', '.join(_MODEL_KEYS[:4])})")
    name = check_name("name", entry["name"])
    slo = _mapping(entry["slo"], "slo", _SLO_KEYS)
    for key in _SLO_KEYS:
        require(key in slo, f"slo.{key}", "missing", f"give model {name}'s {key.upper()} SLO in seconds")
    shapes = entry.get("parallel", [DEFAULTS.pool_parallel])
    require(isinstance(shapes, list) and len(shapes) > 0, "parallel", shorten(shapes),
            "give a list of TPxPP shapes, e.g. [1x1, 2x1]")
    check_count("parallel", len(shapes), MAX_POOL_SHAPES, what="shapes of a model")
    return ModelTraffic(name=name, model=load_model(_located(_text(entry["model"], "model"), folder)),
                        trace=_traffic(entry["traffic"], folder), slo_ttft_s=check_slo("slo.ttft", slo["ttft"]),
                        slo_tpot_s=check_slo("slo.tpot", slo["tpot"]),
                        shapes=tuple(dict.fromkeys(parse_shape(shape) for shape in shapes)))


def parse_shape(text: object) -> tuple[int, int]:
    """``TPxPP`` (``2x1``: two tensor-parallel ranks, one stage) as ``(tp, pp)``.

    >>> parse_shape("4x2")
    (4, 2)
    """
    tp, found, pp = str(text).strip().lower().partition("x")
    require(bool(found and tp and pp), "parallel", shorten(text), "give TPxPP, e.g. 2x1 or 4x2")
    return (parse_int("parallel", tp, MAX_TENSOR_PARALLEL), parse_int("parallel", pp, MAX_STAGES))


def _traffic(value: object, folder: Path) -> Trace:
    """A trace file, or a synthetic trace from a rate, an arrival process and lengths."""
    traffic = _mapping(value, "traffic", ("trace", *_TRAFFIC_FIELDS))
    if "trace" in traffic:
        require(len(traffic) == 1, "traffic", ", ".join(traffic), "give a trace file or the synthetic keys, not both")
        return read_trace(_located(_text(traffic["trace"], "trace"), folder))
    for key in ("requests", "seed"):
        if key in traffic:
            require(isinstance(traffic[key], int) and not isinstance(traffic[key], bool), key,
                    shorten(traffic[key]), "give a whole number")
    require(_is_number(traffic.get("qps", DEFAULTS.qps)), "qps", shorten(traffic.get("qps")),
            "give requests per second")
    spec = {_TRAFFIC_FIELDS[key]: item if key in ("requests", "seed") else
            float(item) if key == "qps" else _text(item, key) for key, item in traffic.items()}
    return synthetic_trace(TraceSpec(**spec))


def _scheduler(value: object) -> SchedulerSpec:
    spec = _mapping(value, "scheduler", _SCHEDULER_KEYS)
    for key in ("max_batch", "max_tokens", "chunk"):
        if key in spec:
            require(isinstance(spec[key], int) and not isinstance(spec[key], bool), key, shorten(spec[key]),
                    "give a whole number")
    return SchedulerSpec(
        name=vocabulary_word(SchedulerName, "scheduler", spec.get("name", DEFAULTS.scheduler)),
        max_batch=spec.get("max_batch", DEFAULTS.max_batch), max_tokens=spec.get("max_tokens", DEFAULTS.max_tokens),
        chunk=spec.get("chunk", DEFAULTS.chunk),
        preemption=vocabulary_word(Preemption, "preemption", spec.get("preemption", DEFAULTS.preemption)))


def _kv(value: object) -> KVSettings:
    kv = _mapping(value, "kv", _KV_KEYS)
    block = kv.get("block_size", DEFAULTS.block_size)
    fraction = kv.get("kv_fraction", DEFAULTS.kv_fraction)
    require(isinstance(block, int) and not isinstance(block, bool), "block_size", shorten(block), "give tokens")
    require(_is_number(fraction), "kv_fraction", shorten(fraction), "give a share in (0, 1]")
    return KVSettings(block_size=block, kv_fraction=float(fraction))


def _mapping(value: object, field: str, keys: tuple[str, ...]) -> Mapping:
    require(isinstance(value, dict), field, shorten(value), f"give a mapping of {', '.join(keys)}")
    unknown = [key for key in value if key not in keys]
    if unknown:
        raise PipeschedError(f"{field}={shorten(unknown[0])}: unknown key; give {', '.join(keys)}")
    return value


def _text(value: object, field: str) -> str:
    require(isinstance(value, str) and bool(value.strip()), field, shorten(value), "give a name or a file")
    return value.strip()


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _located(name: str, folder: Path) -> str:
    """A file named in the deployment file, from its folder; a preset name as it is."""
    if name.endswith(_FILE_SUFFIXES) and not Path(name).is_absolute():
        return str(folder / name)
    return name
