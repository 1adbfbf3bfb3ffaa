"""Duration vectors of a compiled task graph under a duration model, drawn in batches of
samples with numpy and combined in one compiled pass (no Python loop over ops or samples).

Common random numbers. Every random number comes from a stream named by what it varies,
not by its position in one graph, so two schedules of the same p and m drawn with the same
seed see the same randomness where they share an op or a link:

    op of kind K, chunk c, on device d, microbatch mb    stream (seed, 1, K, c)[sample, d, mb]
    message of kind A/G sent by device d for mb, from    stream (seed, 2, A/G, c)[sample, d, mb]
        the sender's chunk c
    all-reduce of stage s                                stream (seed, 3)[sample, s]
    device d a random straggler                          stream (seed, 4)[sample, d]

(the chunk c of an op is the rank of its stage among the stages its device holds: 1F1B's
only stage and interleaved 1F1B's first chunk share c = 0; K is the kind's letters as one
number, ``ord`` of a one-letter kind). A fused entry (``(0F1;1B0)OVERLAP_F_B``) is one op
of its fused kind, drawn at its first part's microbatch; its other parts take no time.
Iterations back to back (a steady state, an asynchronous family's table): iteration 0 draws
from the streams above, iteration i > 0 from the same keys with i appended, each at the
microbatch's number within its iteration; a random straggler is drawn per iteration. A
stream is numpy's SFC64 generator seeded by that key through a SeedSequence. Each stream
is drawn in sample order, so the values do not depend on how the samples are cut into
batches. A standard normal z becomes a lognormal factor ``exp(sigma z - sigma^2 / 2)``
(mean 1), or for a measured kind the factor at quantile Phi(z) of the stage's sorted
measured factors. Normals are drawn in single precision (a relative error of 1e-7 in a
factor) and the exponentials run as vector loops (``fastmath={"afn"}``): the same seed
gives the same samples on one machine; another CPU may differ in the last bit of a factor.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from pipesched.simulate.graph import TaskGraph
from pipesched.simulate.iterations import Iterations
from pipesched.timeline import ALLREDUCE
from pipesched.variability.model import Variability

# stream domains (see the module docstring)
OPS, MESSAGES, ALLREDUCES, STRAGGLERS = 1, 2, 3, 4


def _stream(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, *key])))


def _kind_code(letter: str) -> int:
    """An op kind's letters as one number (``ord`` of a one-letter kind)."""
    return int.from_bytes(letter.encode(), "big")


def _in_iteration(iteration: int) -> tuple[int, ...]:
    """The key suffix of an iteration's streams: none for the first."""
    return (iteration,) if iteration else ()


class Sampler:
    """Op and transfer durations of ``graph`` under ``variability``, batch after batch.
    ``iterations``: when ``graph`` holds several iterations back to back, which iteration
    each task belongs to (see the module docstring)."""

    def __init__(self, graph: TaskGraph, variability: Variability, *, iterations: Iterations | None = None) -> None:
        variability.check_for(graph.num_devices, graph.schedule.rules.letters)
        self.graph, self.variability = graph, variability
        self.rounds, microbatches, op_iteration, tr_iteration = _iteration_columns(graph, iterations)
        self.shape = (graph.num_devices, microbatches)
        chunk_of = _chunks(graph.schedule)
        self._init_ops(chunk_of, op_iteration)
        self._init_transfers(chunk_of, tr_iteration)
        self.stragglers = ([_stream(variability.seed, STRAGGLERS, *_in_iteration(i)) for i in range(self.rounds)]
                           if variability.random_straggler is not None else None)
        self.drawn = 0

    def _init_ops(self, chunk_of: np.ndarray, op_iteration: np.ndarray) -> None:
        """Ops: base durations with the fixed stragglers, then each kind's random part, one
        stream per (kind, chunk, iteration)."""
        graph, variability = self.graph, self.variability
        ops, (devices, microbatches) = graph.ops, self.shape
        device_factor = np.ones(devices)
        for device, factor in variability.stragglers:
            device_factor[device] *= factor
        self.op_base = graph.op_duration * device_factor[ops.device]
        # the column of the random-straggler draws each op reads: its iteration's, its device's
        self.op_slot = op_iteration * devices + ops.device
        # each op's stream index: its device and its microbatch within its iteration
        self.op_index = ops.device.astype(np.int64) * microbatches + (ops.microbatch - op_iteration * microbatches)
        self.op_sigma = np.zeros(graph.num_ops)
        self.op_offset = np.zeros(graph.num_ops, np.int64)
        self.op_length = np.zeros(graph.num_ops, np.int64)
        self.op_groups: list[tuple[np.ndarray, np.random.Generator]] = []
        tables = [np.zeros(0)]
        kinds = _entry_kinds(ops)
        chunk = chunk_of[ops.device, ops.stage]
        for k in np.unique(kinds[kinds >= 0]).tolist():
            letter = graph.schedule.rules.letters[k]
            rows = np.flatnonzero(kinds == k)
            if not self._op_spread(letter, rows, tables):
                continue
            for c, i in _distinct(chunk[rows], op_iteration[rows]):
                group = rows[(chunk[rows] == c) & (op_iteration[rows] == i)]
                self.op_groups.append((group, _stream(variability.seed, OPS, _kind_code(letter), c, *_in_iteration(i))))
        self.op_table = np.concatenate(tables)
        self.op_fixed = _undrawn(graph.num_ops, self.op_groups)

    def _op_spread(self, letter: str, rows: np.ndarray, tables: list[np.ndarray]) -> bool:
        """How the ops ``rows`` of kind ``letter`` vary: their stage's measured factors
        (appended to ``tables``, the ops pointing into them) or a lognormal's sigma.
        Returns whether they vary at all."""
        measured, stage = self.variability.measured, self.graph.ops.stage[rows]
        if measured is not None and letter in measured.kinds:
            per_stage = measured.for_stages(letter, self.graph.schedule.num_stages)
            sizes = [a.size for a in per_stage]
            self.op_offset[rows] = (np.cumsum([0, *sizes])[:-1] + sum(a.size for a in tables))[stage]
            self.op_length[rows] = np.array(sizes)[stage]
            tables += per_stage
            return True
        cv = self.variability.op_cv(letter)
        if cv == 0:
            return False
        self.op_sigma[rows] = math.sqrt(math.log1p(cv * cv))
        return True

    def _init_transfers(self, chunk_of: np.ndarray, tr_iteration: np.ndarray) -> None:
        """Transfers: base durations with the slow links, then the links' jitter: a stream
        per (kind, sender's chunk, iteration) for messages, per iteration for all-reduces."""
        graph, variability, seed = self.graph, self.variability, self.variability.seed
        devices, microbatches = self.shape
        src, dst = graph.tr_src.astype(np.int64), graph.tr_dst.astype(np.int64)
        link_factor = np.ones((devices, devices))
        for a, b, factor in variability.slow_links:
            link_factor[a, b] *= factor
            link_factor[b, a] *= factor
        self.tr_base = graph.tr_duration * link_factor[src, dst]
        self.tr_sigma = np.sqrt(np.log1p(variability.link_cv(devices)[src, dst] ** 2))
        self.tr_groups: list[tuple[np.ndarray, np.ndarray, np.random.Generator, tuple[int, ...]]] = []
        jittered = self.tr_sigma > 0
        reduces = graph.tr_kind == ALLREDUCE
        sender_chunk = chunk_of[src, graph.tr_stage] if graph.num_transfers else np.zeros(0, np.int64)
        sent = jittered & ~reduces
        for kind, c, i in _distinct(graph.tr_kind[sent], sender_chunk[sent], tr_iteration[sent]):
            group = np.flatnonzero(sent & (graph.tr_kind == kind) & (sender_chunk == c) & (tr_iteration == i))
            index = src[group] * microbatches + (graph.tr_microbatch[group] - i * microbatches)
            self.tr_groups.append((group, index, _stream(seed, MESSAGES, kind, c, *_in_iteration(i)), self.shape))
        for i in np.unique(tr_iteration[jittered & reduces]).tolist():
            group = np.flatnonzero(jittered & reduces & (tr_iteration == i))
            self.tr_groups.append((group, graph.tr_stage[group].astype(np.int64),
                                   _stream(seed, ALLREDUCES, *_in_iteration(i)), (graph.schedule.num_stages,)))
        self.tr_fixed = _undrawn(graph.num_transfers, self.tr_groups)

    @property
    def transfers_vary(self) -> bool:
        return bool(self.tr_groups) or bool(self.variability.slow_links)

    def draw(self, count: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The next ``count`` samples: op durations (count x ops) and transfer durations
        (count x transfers; None when they are the compiled ones)."""
        graph = self.graph
        devices, microbatches = self.shape
        # slow[i, iteration x devices + d]: device d's slowdown in that iteration of sample i
        slow = np.ones((count, self.rounds * devices))
        if self.stragglers is not None:
            probability, slowdown = self.variability.random_straggler
            chance = np.hstack([stream.random((count, devices)) for stream in self.stragglers])
            slow[chance < probability] = slowdown
        ops = np.empty((count, graph.num_ops))
        _fixed(ops, self.op_fixed, self.op_base, self.op_slot, slow)
        for rows, stream in self.op_groups:
            normal = stream.standard_normal((count, devices * microbatches), dtype=np.float32)
            index = self.op_index[rows]
            if self.op_length[rows[0]] > 0:
                _measured(ops, normal, rows, index, self.op_base, self.op_offset, self.op_length, self.op_table,
                          self.op_slot, slow)
            else:
                _lognormal(ops, normal, rows, index, self.op_base, self.op_sigma, self.op_slot, slow)
        self.drawn += count
        if not self.transfers_vary:
            return ops, None
        transfers = np.empty((count, graph.num_transfers))
        none = np.zeros(graph.num_transfers, np.int64)
        unslowed = np.ones((count, 1))
        _fixed(transfers, self.tr_fixed, self.tr_base, none, unslowed)
        for rows, index, stream, shape in self.tr_groups:
            normal = stream.standard_normal((count, int(np.prod(shape))), dtype=np.float32)
            _lognormal(transfers, normal, rows, index, self.tr_base, self.tr_sigma, none, unslowed)
        return ops, transfers


def _iteration_columns(graph: TaskGraph, iterations: Iterations | None) -> tuple[int, int, np.ndarray, np.ndarray]:
    """Iterations back to back in ``graph``, microbatches per iteration, and the iteration
    of each op and of each transfer (all 0 for one iteration)."""
    if iterations is None:
        return (1, graph.schedule.num_microbatches, np.zeros(graph.num_ops, np.int64),
                np.zeros(graph.num_transfers, np.int64))
    return (iterations.iterations, iterations.microbatches, iterations.op_iteration.astype(np.int64),
            iterations.transfer_iteration.astype(np.int64))


def _undrawn(count: int, groups: list[tuple]) -> np.ndarray:
    """The rows of ``count`` that no group (its rows first) draws: they keep their base."""
    drawn = np.zeros(count, np.bool_)
    for rows, *_ in groups:
        drawn[rows] = True
    return np.flatnonzero(~drawn)


def _distinct(*columns: np.ndarray) -> list[tuple[int, ...]]:
    """The distinct rows of equally long integer columns, sorted."""
    if not columns[0].size:
        return []
    rows = np.unique(np.stack([np.asarray(c, np.int64) for c in columns], axis=1), axis=0)
    return [tuple(int(x) for x in row) for row in rows]


def _entry_kinds(ops) -> np.ndarray:
    """The kind each op row is drawn as (rules index): its own, its fused entry's for the
    first part of a fused entry, -1 for the other parts (they take no time)."""
    return np.where(ops.tails(), -1, ops.entry_kinds().astype(np.int64))


def _chunks(schedule) -> np.ndarray:
    """chunk[d, s]: the rank of stage s among the stages device d holds (0 elsewhere)."""
    held: list[set[int]] = [set() for _ in range(schedule.num_devices)]
    for replica in schedule.placement.replicas:
        for stage, device in enumerate(replica):
            held[device].add(stage)
    chunk = np.zeros((schedule.num_devices, schedule.num_stages), np.int64)
    for device, stages in enumerate(held):
        for rank, stage in enumerate(sorted(stages)):
            chunk[device, stage] = rank
    return chunk


@njit(cache=True, fastmath={"afn"})
def _lognormal(out, normal, columns, index, base, sigma, slot, slow):
    """out[i, c] for each column c = columns[j]: base[c] x exp(sigma z - sigma^2 / 2) x
    slow[i, slot[c]], z = normal[i, index[j]] (a lognormal factor with mean 1). The
    exponentials run as one vector loop per sample."""
    width = columns.shape[0]
    work = np.empty(width)
    scale = np.empty(width)
    shift = np.empty(width)
    for j in range(width):
        scale[j] = sigma[columns[j]]
        shift[j] = -0.5 * scale[j] * scale[j]
    for i in range(out.shape[0]):
        row = normal[i]
        for j in range(width):
            work[j] = scale[j] * row[index[j]] + shift[j]
        for j in range(width):
            work[j] = math.exp(work[j])
        for j in range(width):
            c = columns[j]
            out[i, c] = base[c] * work[j] * slow[i, slot[c]]


@njit(cache=True)
def _measured(out, normal, columns, index, base, offset, length, table, slot, slow):
    """out[i, c] for each column c = columns[j]: base[c] x the measured factor at quantile
    Phi(z) of its sorted table x slow[i, slot[c]], z = normal[i, index[j]]."""
    root2 = math.sqrt(2.0)
    for i in range(out.shape[0]):
        for j in range(columns.shape[0]):
            c = columns[j]
            k = int(0.5 * (1.0 + math.erf(normal[i, index[j]] / root2)) * length[c])
            out[i, c] = base[c] * table[offset[c] + min(k, length[c] - 1)] * slow[i, slot[c]]


@njit(cache=True)
def _fixed(out, columns, base, slot, slow):
    """out[i, c] = base[c] x slow[i, slot[c]] for the columns without a random factor."""
    for i in range(out.shape[0]):
        for c in columns:
            out[i, c] = base[c] * slow[i, slot[c]]
