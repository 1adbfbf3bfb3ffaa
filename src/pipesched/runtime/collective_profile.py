"""Collectives measured with torch.distributed (gloo on CPUs, NCCL on GPUs): every kind
over a sweep of message sizes on N local ranks, fitted (``pipesched.model.collectives.
fit_collectives``) and written as the calibration of a cluster file's link, which the
cluster loader reads back (``intra_node:`` of ``pipesched.model.clusters``).

A rank times each collective ``repeats`` times after ``warmup`` untimed ones, every one
started together (a barrier before it); a sample is the slowest rank's time, and each size
keeps its fastest sample, as the link profile does (``pipesched.runtime.profile``). Kinds the
backend lacks (gloo has no reduce-scatter) are left out and named.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import yaml

from pipesched.enums import Collective
from pipesched.errors import PipeschedError
from pipesched.limits import MAX_PROFILE_BYTES, MAX_PROFILE_SIZES, check_count
from pipesched.model.collectives import NVLINK_H100, CollectiveFit, fit_collectives
from pipesched.model.hardware import PROTOCOLS
from pipesched.runtime.launch import LaunchSpec, RankContext, StatusCallback, launch
from pipesched.runtime.runs import capacity_problem
from pipesched.runtime.torch_import import require_torch

# message sizes a profile sweeps unless told, bytes per rank
DEFAULT_SIZES = (4096, 65536, 1048576, 4194304)


@dataclass(frozen=True)
class CollectiveProfile:
    """What the ranks measured and the constants fitted to it."""

    backend: str
    ranks: int
    samples: tuple[tuple[Collective, int, float], ...]  # (kind, bytes per rank, seconds)
    missing: tuple[Collective, ...]  # kinds the backend does not run
    fit: CollectiveFit


def check_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    """The sizes, each a whole number of bytes in [4, MAX_PROFILE_BYTES], at most
    MAX_PROFILE_SIZES of them."""
    check_count("sizes", len(sizes), MAX_PROFILE_SIZES, what="message sizes")
    return tuple(check_count("sizes", size, MAX_PROFILE_BYTES, minimum=4, what="bytes per rank") for size in sizes)


def profile_collectives(*, ranks: int, sizes: Sequence[int] = DEFAULT_SIZES, backend: str = "gloo",
                        repeats: int = 10, warmup: int = 2, timeout_s: float = 300.0,
                        on_status: StatusCallback | None = None) -> CollectiveProfile:
    """Launch ``ranks`` local ranks, time every kind at every size, fit the constants."""
    check_count("ranks", ranks, 1024, minimum=2, what="ranks of a collective profile")
    sizes = check_sizes(sizes)
    problem = capacity_problem(ranks, backend)
    if problem is not None:
        raise PipeschedError(f"ranks={ranks}: {problem}; give fewer --ranks")
    spec = LaunchSpec(handler="collectives", task={"sizes": sizes, "repeats": repeats, "warmup": warmup},
                      world_size=ranks, backend=backend, timeout_s=timeout_s, pin_cpus=backend == "gloo")
    measured = launch(spec, describe=[f"{kind.value} sweep" for kind in Collective], on_status=on_status)[0]
    samples = tuple((Collective(kind), int(size), float(seconds)) for kind, size, seconds in measured["samples"])
    missing = tuple(Collective(kind) for kind in measured["missing"])
    return CollectiveProfile(backend, ranks, samples, missing, fit_collectives(ranks, samples))


def calibration_yaml(profile: CollectiveProfile, *, link_bandwidth: float | None = None) -> str:
    """The fit as the link of a cluster file: paste it into one (or load it under
    ``intra_node:``). ``link_bandwidth``: the link's line rate the efficiency is a share of;
    None: the measured bus bandwidth itself (efficiency 1)."""
    fit = profile.fit
    bandwidth = fit.bus_bandwidth if link_bandwidth is None else link_bandwidth
    calibration = fit.calibration(bandwidth, like=NVLINK_H100 if profile.backend == "nccl" else None)
    link = {"bandwidth": float(bandwidth), "latency": 0.0, "collectives": {
        "fabric": calibration.fabric, "base_latency": [float(x) for x in calibration.base_latency],
        "step_latency": [float(x) for x in calibration.step_latency], "efficiency": float(calibration.efficiency),
        "protocol_bandwidth": [float(x) for x in calibration.protocol_bandwidth],
        "ramp": float(calibration.ramp_bytes), "switch_bandwidth": float(calibration.switch_bandwidth),
        "p2p_efficiency": float(calibration.p2p_efficiency), "peer_latency": float(calibration.peer_latency)}}
    lines = [f"# pipesched profile --collectives: {profile.ranks} {profile.backend} ranks; seconds = launch + steps x "
             f"step + share x bytes / {fit.bus_bandwidth:.6g} B/s (median error {fit.median_error:.1%})",
             f"# per-protocol lists: {', '.join(PROTOCOLS)}; measured (kind, bytes per rank, seconds):"]
    lines += [f"#   {kind.value} {size} {seconds:.6g}" for kind, size, seconds in profile.samples]
    if profile.missing:
        lines.append(f"# not run by {profile.backend}: {', '.join(kind.value for kind in profile.missing)}")
    return "\n".join(lines) + "\n" + yaml.safe_dump({"intra_node": link}, sort_keys=False)


# --- in each rank ---------------------------------------------------------------------------
def run_collectives(spec: LaunchSpec, context: RankContext) -> dict:
    """Time every collective kind at every size on this rank; the slowest rank's time of
    each repeat, the fastest repeat of each size. Returns {"samples", "missing"} on rank 0."""
    torch = require_torch()
    dist = torch.distributed
    device = torch.device("cuda", context.rank) if spec.backend == "nccl" else torch.device("cpu")
    if spec.backend == "nccl":
        torch.cuda.set_device(device)
    samples, missing = [], []
    for index, kind in enumerate(Collective):
        context.progress.update(0, index, 0)
        try:
            timed = [(kind.value, size, _fastest(torch, _collective(torch, kind, size, spec.world_size,
                                                                     context.rank, device), spec))
                     for size in spec.task["sizes"]]
            samples += timed
        except (RuntimeError, NotImplementedError, ValueError):
            dist.barrier()
            missing.append(kind.value)
    return {"samples": samples, "missing": missing} if context.rank == 0 else {}


def _fastest(torch, run, spec: LaunchSpec) -> float:
    dist = torch.distributed
    best = float("inf")
    for repeat in range(spec.task["warmup"] + spec.task["repeats"]):
        dist.barrier()
        begun = time.perf_counter_ns()
        run()
        if spec.backend == "nccl":
            torch.cuda.synchronize()
        elapsed = torch.tensor([(time.perf_counter_ns() - begun) * 1e-9], dtype=torch.float64)
        dist.all_reduce(elapsed.to(_device_of(torch, spec)), op=dist.ReduceOp.MAX)
        if repeat >= spec.task["warmup"]:
            best = min(best, float(elapsed))
    return best


def _device_of(torch, spec: LaunchSpec):
    return torch.device("cuda", torch.cuda.current_device()) if spec.backend == "nccl" else torch.device("cpu")


def _collective(torch, kind: Collective, nbytes: int, n: int, rank: int, device):
    """A closure running one ``kind`` of ``nbytes`` per rank (as ``collective_seconds``
    counts bytes: the all-gather's result, the reduce-scatter's input)."""
    dist = torch.distributed
    elements = max(n, nbytes // 4 // n * n)  # float32, a multiple of n
    buffer = torch.ones(elements, dtype=torch.float32, device=device)
    if kind is Collective.ALL_REDUCE:
        return lambda: dist.all_reduce(buffer)
    if kind is Collective.ALL_GATHER:
        parts = list(torch.empty(elements, dtype=torch.float32, device=device).chunk(n))
        return lambda: dist.all_gather(parts, parts[rank].clone())
    if kind is Collective.REDUCE_SCATTER:
        result = torch.empty(elements // n, dtype=torch.float32, device=device)
        return lambda: dist.reduce_scatter_tensor(result, buffer)
    if kind is Collective.ALL_TO_ALL:
        received = torch.empty_like(buffer)
        return lambda: dist.all_to_all_single(received, buffer)
    received = torch.empty_like(buffer)
    peer = 1 - rank if rank < 2 else rank

    def exchange() -> None:  # ranks 0 and 1 trade buffers, both directions at once
        if rank < 2:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, buffer, peer),
                                                dist.P2POp(dist.irecv, received, peer)]):
                work.wait()

    return exchange
