"""An offline run's block schedule as a ``Timeline``: the training views (HTML report,
Perfetto trace, Gantt chart, terminal) draw it as they draw a schedule.

Rows. One timeline device, the accelerator: one op per step (token, unit, GPU batch) in
schedule order, its microbatch the step's number, its kind P at the prefill and D at a
decode step (``SERVING_RULES``); it lasts the step's compute, the host's attention over its
share of the cache included.

Transfers. Every move of a step on every link it crosses (``pipesched.model.tiers.route``),
on one channel per link (``host -> device``, ``device -> host``, ``disk -> host``, ``host ->
disk``): loads (weights, cache, hidden state) as ``SWAP_IN``, stores as ``SWAP_OUT``, one
after another on their link from the step's start, each ``bytes / bandwidth`` long.

Memory. Device memory and host memory over the steps: each tier's peak less the part of its
cache share not yet filled (the cache grows by one token per sequence a step).

Window. A run of 32 tokens over 194 units and 8 batches is 50,000 steps; a view holds the
first tokens whose steps fit ``limits.MAX_VIEW_ITERATIONS`` (the prefill at least).
"""

from __future__ import annotations

import numpy as np

from pipesched.enums import Tier
from pipesched.errors import require
from pipesched.limits import MAX_VIEW_ITERATIONS
from pipesched.model.hardware import DeviceSpec
from pipesched.model.spec import ModelSpec
from pipesched.model.tiers import LINKS, link_bandwidth, route
from pipesched.ops import Op
from pipesched.schedule import Placement, Schedule
from pipesched.serving.offload import (
    CACHE_STORE,
    DEVICE,
    HIDDEN_STORE,
    HOST,
    OfflineRun,
    OfflineTask,
    Placements,
    block_steps,
    delegates,
    full_layout,
    link_name,
    offline_units,
    peak_bytes,
)
from pipesched.serving.timeline import SERVING_RULES
from pipesched.timeline import SWAP_IN, SWAP_OUT, MemoryTrace, Source, Timeline, TransferTable


def view_tokens(run: OfflineRun, units: int) -> int:
    """Tokens a view of ``run`` draws: the first ones whose steps fit ``MAX_VIEW_ITERATIONS``."""
    per_token = units * run.policy.num_batches
    require(per_token <= MAX_VIEW_ITERATIONS, "num_batches", run.policy.num_batches,
            f"one token is {per_token:,} steps (units x batches); a view draws at most {MAX_VIEW_ITERATIONS:,}, "
            "give fewer GPU batches to draw it")
    return max(1, min(run.task.gen_len, MAX_VIEW_ITERATIONS // per_token))


def offline_timeline(model: ModelSpec, device: DeviceSpec, run: OfflineRun, *, dtype: str = "fp16") -> Timeline:
    """The timeline of ``run``'s first tokens (module docstring)."""
    task, policy = run.task, run.policy
    units = offline_units(model, device, task, policy.gpu_batch, dtype=dtype)
    placed = Placements.of(units, [policy])
    delegate = delegates(device, policy)
    tokens = np.arange(view_tokens(run, len(units)))
    steps = block_steps(units, full_layout(len(units), policy.num_batches), task, device, placed, policy.gpu_batch,
                        delegate=delegate, overlap=policy.overlap, tokens=tokens)
    step_s = steps.step_s[0].reshape(-1)
    start = float(steps.prologue_s[0]) + np.concatenate([[0.0], np.cumsum(step_s)[:-1]])
    compute = (steps.compute_s[0] + steps.host_s[0]).reshape(-1)
    # every step's token: P at the prefill, D after
    token = np.repeat(tokens, len(units) * policy.num_batches)
    kind = np.where(token == 0, SERVING_RULES.index("P"), SERVING_RULES.index("D")).astype(np.int8)
    letters = [rule.kind for rule in SERVING_RULES.kinds]
    ops = tuple(Op(0, letters[k], mb) for mb, k in enumerate(kind.tolist()))
    schedule = Schedule(f"offline · {model.name} · {policy.gpu_batch} x {policy.num_batches}",
                        Placement.one_per_device(1), len(ops), (ops,), rules=SERVING_RULES)
    rows = np.arange(len(ops), dtype=np.int32)
    end = start + (compute if policy.overlap else step_s)
    return Timeline(schedule=schedule, source=Source.SIMULATED, unit="s", op_device=np.zeros(len(ops), np.int32),
                    op_stage=np.zeros(len(ops), np.int32), op_kind=kind, op_microbatch=rows, op_start=start,
                    op_end=end, transfers=_transfers(device, steps, start, compute, policy.overlap),
                    memory=_memory(units, task, placed, policy, delegate, token, start, end, DEVICE, run),
                    host_memory=_memory(units, task, placed, policy, delegate, token, start, end, HOST, run))


def _transfers(device: DeviceSpec, steps, start: np.ndarray, compute: np.ndarray, overlap: bool) -> TransferTable:
    """Each move of each step on each link it crosses, one after another per link from the
    step's start; without overlap every move after the compute and after each other."""
    if overlap:
        offset = {link: np.zeros_like(start) for link in LINKS}
    else:
        shared = compute.copy()  # one queue for every link, after the compute
        offset = dict.fromkeys(LINKS, shared)
    parts = []
    for name, nbytes, src, dst in steps.moves:
        moved = np.asarray(nbytes[0]).reshape(-1)
        rows = np.flatnonzero(moved > 0)
        if rows.size == 0:
            continue
        for link in route(src, dst):
            seconds = moved[rows] / link_bandwidth(device, *link)
            begin = start[rows] + offset[link][rows]
            offset[link][rows] += seconds
            store = name in (CACHE_STORE, HIDDEN_STORE)
            parts.append((np.full(rows.size, SWAP_OUT if store else SWAP_IN), rows, moved[rows], begin,
                          begin + seconds, np.full(rows.size, LINKS.index(link))))
    if not parts:
        return TransferTable.empty()
    kind, mb, nbytes, begin, finish, channel = (np.concatenate(c) for c in zip(*parts, strict=True))
    zeros = np.zeros(kind.size, np.int32)
    return TransferTable(zeros, zeros, kind.astype(np.int8), zeros, mb.astype(np.int32), nbytes.astype(np.float64),
                         begin, finish, channel.astype(np.int32), tuple(link_name(link) for link in LINKS))


def _memory(units, task: OfflineTask, placed: Placements, policy, delegate: bool, token: np.ndarray,
            start: np.ndarray, end: np.ndarray, column: int, run: OfflineRun) -> MemoryTrace:
    """One tier's bytes at each step: its peak less the cache share not yet filled."""
    peak = peak_bytes(units, task, placed, policy.gpu_batch, policy.num_batches, delegate=delegate)[0, column]
    length = task.prompt_len + task.gen_len
    kv_block = float(units.kv_bytes.sum()) * policy.sequences * length
    filled = np.minimum(task.prompt_len + token + 1, length) / length
    values = peak - placed.cache[0, column] * kv_block * (1.0 - filled)
    tier = (Tier.DEVICE, Tier.HOST)[column]
    capacity = run.capacity_bytes[(Tier.DEVICE, Tier.HOST).index(tier)]
    return MemoryTrace((np.concatenate([start, end[-1:]]),), (np.concatenate([values, values[-1:]]),), (0.0,),
                       (capacity,))
