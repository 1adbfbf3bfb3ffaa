"""An n-way collective inside a compiled graph: an all-to-all among a group of devices (an
expert-parallel layer's dispatch or combine), as transfers that share links.

Member i of the group sends ``nbytes[i][j]`` bytes to member j once its op row
``senders[i]`` has ended; member j's op row ``receivers[j]`` waits for every part sent to
it. Each pair is one transfer (kind ``timeline.ALL_TO_ALL``) lasting ``latency[a, b] +
bytes / bandwidth[a, b]`` and holding the links a point-to-point message between the same
devices holds (the sender's send channel, the receiver's receive channel, the nodes' NICs
when they are shared and the nodes differ: ``graph.link_resources``), so the parts of an
all-to-all queue behind the pipeline's messages on the same links, and these behind them,
in the engine's one service order. A member sends nothing to itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from pipesched.errors import PipeschedError, require
from pipesched.simulate.graph import TaskGraph, link_resources
from pipesched.timeline import ALL_TO_ALL


def with_all_to_all(graph: TaskGraph, senders: Sequence[int], receivers: Sequence[int],
                    nbytes: Sequence[Sequence[float]]) -> TaskGraph:
    """``graph`` with an all-to-all among the devices of op rows ``senders`` (see the module
    docstring); ``receivers[j]`` is an op row on the device of ``senders[j]``.

    Raises PipeschedError for a graph without a network or with a blocking runtime, rows
    out of range, a member's rows on two devices, or sizes that are not group x group
    finite numbers >= 0."""
    network = graph.network
    require(network is not None, "network", "none", "an all-to-all needs links: compile the graph with a network")
    require(graph.overlap, "overlap", "off", "an all-to-all with a blocking runtime is not modelled")
    size = np.asarray(nbytes, np.float64)
    count = len(senders)
    require(count >= 2 and len(receivers) == count, "group", count,
            "give two or more members, one sender and one receiver row each")
    require(size.shape == (count, count) and bool(np.all(np.isfinite(size))) and bool(np.all(size >= 0)), "nbytes",
            f"shape {size.shape}", f"give {count} x {count} byte counts >= 0")
    send_rows, recv_rows = _rows(graph, senders), _rows(graph, receivers)
    member = graph.ops.device[send_rows].astype(np.int64)
    if np.any(graph.ops.device[recv_rows] != member):
        raise PipeschedError("receivers: each member's receiver row must be on its sender row's device")
    # every ordered pair of members: sender index i, receiver index j
    i, j = (index.ravel() for index in np.nonzero(~np.eye(count, dtype=np.bool_)))
    src, dst, sent_by = member[i], member[j], send_rows[i]
    moved = size[i, j]
    seconds = network.latency[src, dst] + moved / network.bandwidth[src, dst]
    res_ptr, res, _ = link_resources(network, src, dst, graph.contention, graph.num_devices)
    pairs = len(moved)
    transfers = np.arange(graph.num_transfers, graph.num_transfers + pairs, dtype=np.int32)
    pred = _with_edges(graph, recv_rows[j], sent_by, transfers)
    return dataclasses.replace(
        graph,
        tr_src=np.concatenate([graph.tr_src, src]).astype(np.int32),
        tr_dst=np.concatenate([graph.tr_dst, dst]).astype(np.int32),
        tr_kind=np.concatenate([graph.tr_kind, np.full(pairs, ALL_TO_ALL, np.int8)]),
        tr_stage=np.concatenate([graph.tr_stage, graph.ops.stage[sent_by]]).astype(np.int32),
        tr_microbatch=np.concatenate([graph.tr_microbatch, graph.ops.microbatch[sent_by]]).astype(np.int32),
        tr_bytes=np.concatenate([graph.tr_bytes, moved]),
        tr_duration=np.concatenate([graph.tr_duration, seconds]),
        tr_rel_ptr=np.concatenate([graph.tr_rel_ptr, graph.tr_rel_ptr[-1] + np.arange(1, pairs + 1)]),
        tr_rel=np.concatenate([graph.tr_rel, sent_by]).astype(np.int32),
        tr_res_ptr=np.concatenate([graph.tr_res_ptr, graph.tr_res_ptr[-1] + res_ptr[1:]]),
        tr_res=np.concatenate([graph.tr_res, res]).astype(np.int32),
        pred_ptr=pred[0], pred_op=pred[1], pred_via=pred[2],
    )


def _rows(graph: TaskGraph, rows: Sequence[int]) -> np.ndarray:
    found = np.asarray(rows, np.int64)
    require(found.ndim == 1 and bool(np.all((found >= 0) & (found < graph.num_ops))), "op rows",
            f"{found.tolist()}"[:60], f"give op rows from 0 to {graph.num_ops - 1}")
    return found


def _with_edges(graph: TaskGraph, consumer: np.ndarray, producer: np.ndarray,
                via: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The graph's dependency CSR with edges consumer <- producer over transfer ``via``."""
    n = graph.num_ops
    old_consumer = np.repeat(np.arange(n), np.diff(graph.pred_ptr))
    consumers = np.concatenate([old_consumer, consumer])
    order = np.argsort(consumers, kind="stable")
    pred_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(consumers, minlength=n), out=pred_ptr[1:])
    pred_op = np.concatenate([graph.pred_op, producer])[order].astype(np.int32)
    pred_via = np.concatenate([graph.pred_via, via])[order].astype(np.int32)
    return pred_ptr, pred_op, pred_via
