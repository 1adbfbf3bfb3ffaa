"""``serve offline --optimize``: the placement and block shape with the most tokens per second
that fit the device, host memory and disk.

A search over a grid with the exact cost (``pipesched.serving.offload``'s block schedule,
evaluated for many placements at once as arrays), not FlexGen's relaxed linear program: the
schedule's max over streams and the tensor-by-tensor weight placement are what the run
costs, so the search ranks by them. Two passes: every GPU batch size and batch count of
``GPU_BATCHES`` x ``NUM_BATCHES`` with the percentages in steps of ``COARSE_STEP`` (the
activations wholly on the device or in host memory), then around the best few (shape,
placement) pairs the percentages in steps of ``FINE_STEP`` within one coarse step of each. A placement is
kept only when every tier's peak fits its capacity (``peak_bytes``).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from pipesched.errors import PipeschedError
from pipesched.model.hardware import DeviceSpec
from pipesched.model.spec import ModelSpec
from pipesched.serving.offload import (
    OfflineRun,
    OfflineTask,
    OffloadPolicy,
    Placements,
    TierShares,
    block_steps,
    capacities,
    compact_layout,
    offline_run,
    offline_units,
    peak_bytes,
    weight_split,
)
from pipesched.units import GB

GPU_BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # sequences of a GPU batch tried
NUM_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16)  # GPU batches of a block tried
COARSE_STEP, FINE_STEP = 25, 5  # percentage steps of the two passes
REFINED_SHAPES = 4  # (block shape, placement) pairs the second pass refines, the fastest first
REFINED_PER_SHAPE = 2  # placements of one block shape among them at most
SAMPLED_TOKENS = 4  # decode tokens the passes time, each standing for the tokens nearest it


def sampled_tokens(gen_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The tokens the search times (the prefill and ``SAMPLED_TOKENS`` decode tokens spread
    over the rest) and how many tokens each stands for: a step's time is a max of lines in
    the token's context, so the nearest sample's time is close to each token's. The chosen
    policy is run in full.

    >>> [x.tolist() for x in sampled_tokens(32)]
    [[0, 1, 11, 21, 31], [1, 6, 10, 10, 5]]
    """
    decode = np.unique(np.round(np.linspace(1, gen_len - 1, SAMPLED_TOKENS)).astype(np.int64)) if gen_len > 1 else []
    nearest = np.abs(np.arange(1, gen_len)[:, None] - np.asarray(decode)[None, :]).argmin(axis=1) if gen_len > 1 else []
    counts = np.bincount(nearest, minlength=len(decode)) if gen_len > 1 else np.zeros(0, np.int64)
    return np.concatenate([[0], decode]).astype(np.int64), np.concatenate([[1], counts]).astype(np.int64)


@dataclass(frozen=True, eq=False)
class OptimizeResult:
    """The best run found and what the search looked at."""

    run: OfflineRun
    evaluated: int  # placements x shapes whose time was computed
    feasible: int  # of those, the ones that fit every tier


def _triples(step: int, around: tuple[float, float, float] | None = None) -> np.ndarray:
    """Percentages (device, host, disk) on a grid of ``step`` summing to 100 (within one
    coarse step of ``around`` when given), as fractions [N, 3]."""
    values = list(range(0, 101, step))
    # the device-heaviest first: of placements equally fast the search keeps the first
    rows = [(g, c, 100 - g - c) for g, c in itertools.product(reversed(values), reversed(values)) if g + c <= 100]
    if around is not None:
        rows = [r for r in rows if max(abs(a - 100 * b) for a, b in zip(r, around, strict=True)) <= COARSE_STEP]
    return np.array(rows, np.float64) / 100.0


def placement_grid(weights: np.ndarray, cache: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every combination of the weight and cache triples with the activations on the device
    or in host memory: three arrays [P, 3].

    >>> w, c, a = placement_grid(np.eye(3)[:2], np.eye(3))
    >>> len(w), {tuple(row) for row in np.hstack([w, c, a]).tolist()} == {
    ...     (*x, *y, *z) for x in np.eye(3)[:2].tolist() for y in np.eye(3).tolist() for z in ([1, 0, 0], [0, 1, 0])}
    (12, True)
    """
    activations = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    w, c, a = (x.reshape(-1) for x in np.meshgrid(np.arange(len(weights)), np.arange(len(cache)), np.arange(2),
                                                   indexing="ij"))
    return weights[w], cache[c], activations[a]


def _evaluate(model: ModelSpec, device: DeviceSpec, task: OfflineTask, gpu_batch: int, num_batches: int,
              grid: tuple[np.ndarray, np.ndarray, np.ndarray], *, host_attention: bool, overlap: bool,
              dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Tokens per second of each placement of ``grid`` at this block shape (0 where it does
    not fit), and the fitting mask."""
    weights, cache, activations = grid
    units = offline_units(model, device, task, gpu_batch, dtype=dtype)
    placed = Placements(weight_split(units, weights), cache, activations)
    delegate = host_attention and device.host_attention_flops > 0
    # delegation only changes where the host's share of the cache is attended: with the cache
    # all on the device the two agree, as ``delegates`` says
    peak = peak_bytes(units, task, placed, gpu_batch, num_batches, delegate=delegate)
    fits = (peak <= capacities(device)[None, :]).all(axis=1)
    speed = np.zeros(len(placed))
    if fits.any():
        kept = Placements(placed.weights[fits], cache[fits], activations[fits])
        tokens, stands_for = sampled_tokens(task.gen_len)
        steps = block_steps(units, compact_layout(units, num_batches), task, device, kept, gpu_batch,
                            delegate=delegate, overlap=overlap, tokens=tokens)
        per_token = (steps.step_s * steps.weight).sum(axis=(2, 3))
        total = per_token @ stands_for + steps.prologue_s
        speed[fits] = gpu_batch * num_batches * task.gen_len / total
    return speed, fits


def _policy(grid, index: int, gpu_batch: int, num_batches: int, host_attention: bool, overlap: bool) -> OffloadPolicy:
    weights, cache, activations = (TierShares(*(100.0 * x[index])) for x in grid)
    return OffloadPolicy(weights, cache, activations, gpu_batch=gpu_batch, num_batches=num_batches,
                         host_attention=host_attention, overlap=overlap)


def optimize_policy(model: ModelSpec, device: DeviceSpec, task: OfflineTask, *, host_attention: bool = True,
                    overlap: bool = True, dtype: str = "fp16") -> OptimizeResult:
    """The policy of the most tokens per second that fits (module docstring), run; a model
    that fits in no placement is refused."""
    coarse = placement_grid(_triples(COARSE_STEP), _triples(COARSE_STEP))
    shapes = []  # (speed, gpu_batch, num_batches, index)
    evaluated = feasible = 0
    for gpu_batch in GPU_BATCHES:
        fitted_any = False
        for num_batches in NUM_BATCHES:
            speed, fits = _evaluate(model, device, task, gpu_batch, num_batches, coarse, host_attention=host_attention,
                                    overlap=overlap, dtype=dtype)
            evaluated, feasible = evaluated + len(speed), feasible + int(fits.sum())
            if fits.any():
                fitted_any = True
                # the best few placements of the shape (stable: the device-heaviest of a tie first)
                for index in np.argsort(-speed, kind="stable")[:REFINED_PER_SHAPE]:
                    if fits[index]:
                        shapes.append((float(speed[index]), gpu_batch, num_batches, int(index)))
        if not fitted_any:
            break  # a larger batch needs more of every tier
    if not shapes:
        everything = capacities(device).sum()
        raise PipeschedError(f"model={model.name}: no placement of one {task.prompt_len}+{task.gen_len}-token "
                             f"sequence fits {device.name} (device, host memory and disk: {everything / GB:,.1f} GB); "
                             "give shorter sequences or a device with more memory or disk")
    best = (0.0, None)
    for _, gpu_batch, num_batches, index in sorted(shapes, key=lambda shape: -shape[0])[:REFINED_SHAPES]:
        around_w, around_c = coarse[0][index], coarse[1][index]
        fine = placement_grid(_triples(FINE_STEP, tuple(around_w)), _triples(FINE_STEP, tuple(around_c)))
        speed, fits = _evaluate(model, device, task, gpu_batch, num_batches, fine, host_attention=host_attention,
                                overlap=overlap, dtype=dtype)
        evaluated, feasible = evaluated + len(speed), feasible + int(fits.sum())
        if fits.any() and speed.max() > best[0]:
            best = (float(speed.max()), _policy(fine, int(speed.argmax()), gpu_batch, num_batches, host_attention,
                                                overlap))
    policy = best[1]
    assert policy is not None  # the coarse best lies in its own fine grid
    run = offline_run(model, device, task, policy, dtype=dtype)
    # say the weights' percentages as placed (whole tensors) when asking for them places the same
    placed = dataclasses.replace(policy, weights=run.weights_placed)
    units = offline_units(model, device, task, policy.gpu_batch, dtype=dtype)
    if np.array_equal(weight_split(units, np.array([placed.weights.fractions])),
                      weight_split(units, np.array([policy.weights.fractions]))):
        run = offline_run(model, device, task, placed, dtype=dtype)
    return OptimizeResult(run, evaluated, feasible)

