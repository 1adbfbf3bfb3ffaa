"""The event engine: start and end of every op and transfer of a task graph.

Resources. Each device has a compute stream, a send channel and a receive channel. When
the devices of a node share one NIC, the node also has an egress and an ingress channel
that all of its inter-node transfers pass through. A resource runs one task at a time.

    compute op            its device's compute stream
    transfer a -> b       send channel of a, receive channel of b (+ the NICs of a's and b's
                          nodes when shared and the nodes differ); with ``overlap=False``
                          also the compute streams of a and b (a blocking runtime: neither
                          device computes while it sends or receives)
    all-reduce a <-> b    send and receive channels of both devices (+ shared NICs, + both
                          compute streams with ``overlap=False``)

Sharing model: FIFO serialization. A transfer holds each channel it uses for its whole
duration (latency + bytes / bandwidth), so transfers that share a link or a NIC queue one
behind the other at the full link rate. With ``contention=False`` transfers hold no
channel: each starts as soon as its data are ready.

Service order. Every resource serves its tasks in one fixed global order: the order in
which the ops complete when communication is free, ranked by (completion time, sequence),
each transfer placed right after the op that releases it. Compute streams keep their table
order (a device completes its ops in table order); channels serve transfers in the order a
runtime posts them (a device's sends in its program order). A fixed order makes the engine

- deterministic: ties in completion time break by the sequence (the dependency order of
  the first pass), the same on every run;
- deadlock-free: every dependency and every resource order goes forward in that global
  order, so a table that runs with free communication never stalls on a channel;
- monotone: every start time is a max of sums of durations (max-plus algebra), so a
  slower link (more latency, less bandwidth) never makes any task finish earlier.
Free communication (zero latency, infinite bandwidth) reproduces the slot table exactly.

Two passes. (1) ``completion_order`` walks the device tables with free communication, as
the slot table does, and ranks the ops. (2) ``sweep`` visits all tasks once in the global
order, a discrete-event run whose events are already sorted: a task starts when its data
have arrived and each of its resources has finished the task before it there (per-resource
"free at" times), then occupies them until it ends. ``binder`` records, for every task, the
task that set its start (a data predecessor or the previous task on a resource): following
it back from the last task to end gives the critical path.

Task ids in ``binder``: op rows are 0..N-1, transfer t is N + t, -1 is the start of the
iteration.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _walk(device_offsets, pred0, pred1, duration):
    """Run the device tables with free communication (the slot table's semantics: an op
    starts when its device is free and its data predecessors have ended).

    Returns (sequence, end, count): the ops in the order they were evaluated (a dependency
    order), each op's end time, and how many ops could run (fewer than all: deadlock).
    """
    n = duration.shape[0]
    num_devices = device_offsets.shape[0] - 1
    pos = device_offsets[:-1].copy()
    stop = device_offsets[1:].copy()
    free = np.zeros(num_devices, np.float64)
    done = np.zeros(n, np.bool_)
    end = np.zeros(n, np.float64)
    sequence = np.empty(n, np.int32)
    # a device blocked on an op waits in waiting[op]; a valid table never has two devices
    # waiting on one op (its consumers on its own device come after it in the table)
    waiting = np.full(n, -1, np.int32)
    stack = np.empty(num_devices + n, np.int32)  # devices that may advance
    top = 0
    for d in range(num_devices - 1, -1, -1):
        stack[top] = d
        top += 1
    count = 0
    while top > 0:
        top -= 1
        d = stack[top]
        while pos[d] < stop[d]:
            x = pos[d]
            start = free[d]
            p0 = pred0[x]
            if p0 >= 0:
                if not done[p0]:
                    waiting[p0] = d
                    break
                if end[p0] > start:
                    start = end[p0]
            p1 = pred1[x]
            if p1 >= 0:
                if not done[p1]:
                    waiting[p1] = d
                    break
                if end[p1] > start:
                    start = end[p1]
            finish = start + duration[x]
            end[x] = finish
            free[d] = finish
            done[x] = True
            pos[d] += 1
            sequence[count] = x
            count += 1
            if waiting[x] >= 0:
                stack[top] = waiting[x]
                top += 1
    return sequence, end, count


def completion_order(device_offsets, pred0, pred1, duration):
    """The global service order: ops by (completion time with free communication, sequence).

    The sequence (the walk's dependency order) breaks ties, so an op of zero duration still
    comes after the op it depends on. Returns (order, count); count < number of ops when the
    tables deadlock.
    """
    sequence, end, count = _walk(device_offsets, pred0, pred1, duration)
    if count < duration.shape[0]:
        return sequence[:count], count
    # stable: equal completion times keep the walk's order (timsort, quick here: the walk
    # runs long stretches of one device, which are already in time order)
    return sequence[np.argsort(end[sequence], kind="stable")], count


@njit(cache=True)
def sweep(order, device, pred0, pred1, op_duration, op_transfer,
          tr_src, tr_dst, tr_bytes, tr_after, ar_after, num_p2p, latency, bandwidth,
          node_of, shared_nic, contention, overlap):
    """Start and end of every op and transfer, visiting tasks in the global service order.

    Transfers 0..num_p2p-1 are point-to-point, the rest all-reduces, released by their
    ``tr_after`` op and, for an all-reduce j, also by ``ar_after[j]``. A transfer a -> b
    lasts ``latency[a, b] + bytes / bandwidth[a, b]``; an all-reduce between two ranks pays
    the latency twice (the two steps of a ring). Returns (op_start, op_end, tr_start,
    tr_end, binder).
    """
    n = op_duration.shape[0]
    num_devices = node_of.shape[0]
    num_transfers = tr_src.shape[0]
    num_nodes = 1
    for d in range(num_devices):
        num_nodes = max(num_nodes, node_of[d] + 1)
    # resource ids: compute stream d, send channel d, receive channel d, NIC egress and
    # NIC ingress of each node
    send0 = num_devices
    recv0 = 2 * num_devices
    egress0 = 3 * num_devices
    ingress0 = egress0 + num_nodes
    free_at = np.zeros(ingress0 + num_nodes, np.float64)
    owner = np.full(ingress0 + num_nodes, -1, np.int64)
    # all-reduces run right after the later of the two ops that release them
    num_ar = num_transfers - num_p2p
    ar_key = np.empty(num_ar, np.int64)
    if num_ar > 0:
        rank = np.empty(n, np.int32)
        for k in range(n):
            rank[order[k]] = k
        for j in range(num_ar):
            ar_key[j] = rank[tr_after[num_p2p + j]]
            if ar_after[j] >= 0:
                ar_key[j] = max(ar_key[j], rank[ar_after[j]])
    ar_order = np.argsort(ar_key, kind="mergesort")
    op_start = np.empty(n, np.float64)
    op_end = np.empty(n, np.float64)
    tr_start = np.empty(num_transfers, np.float64)
    tr_end = np.empty(num_transfers, np.float64)
    binder = np.empty(n + num_transfers, np.int32)
    held = np.empty(10, np.int64)
    next_ar = 0
    for k in range(n):
        # --- compute op x on its device's stream
        x = order[k]
        d = device[x]
        start = free_at[d]
        bind = owner[d]
        for j in range(2):
            pred = pred0[x] if j == 0 else pred1[x]
            if pred < 0:
                continue
            if device[pred] != d:
                # the data came over a link: ready when the transfer ends
                t = op_transfer[pred]
                if tr_end[t] > start:
                    start = tr_end[t]
                    bind = n + t
            elif op_end[pred] > start:
                start = op_end[pred]
                bind = pred
        finish = start + op_duration[x]
        op_start[x] = start
        op_end[x] = finish
        free_at[d] = finish
        owner[d] = x
        binder[x] = bind
        # --- the transfers released here: x's own send, then all-reduces keyed on x
        t = op_transfer[x]
        while True:
            if t < 0:
                if next_ar < num_ar and ar_key[ar_order[next_ar]] == k:
                    t = num_p2p + ar_order[next_ar]
                    next_ar += 1
                else:
                    break
            is_allreduce = t >= num_p2p
            a = tr_src[t]
            b = tr_dst[t]
            start = op_end[tr_after[t]]
            bind = tr_after[t]
            if is_allreduce:
                other = ar_after[t - num_p2p]
                if other >= 0 and op_end[other] > start:
                    start = op_end[other]
                    bind = other
            count = 0
            if not overlap:
                held[0] = a
                held[1] = b
                count = 2
            if contention:
                held[count] = send0 + a
                held[count + 1] = recv0 + b
                count += 2
                if is_allreduce:
                    held[count] = send0 + b
                    held[count + 1] = recv0 + a
                    count += 2
                if shared_nic and node_of[a] != node_of[b]:
                    held[count] = egress0 + node_of[a]
                    held[count + 1] = ingress0 + node_of[b]
                    count += 2
                    if is_allreduce:
                        held[count] = egress0 + node_of[b]
                        held[count + 1] = ingress0 + node_of[a]
                        count += 2
            for j in range(count):
                r = held[j]
                if free_at[r] > start:
                    start = free_at[r]
                    bind = owner[r]
            duration = latency[a, b] + tr_bytes[t] / bandwidth[a, b]
            if is_allreduce:
                duration += latency[a, b]
            finish = start + duration
            for j in range(count):
                free_at[held[j]] = finish
                owner[held[j]] = n + t
            tr_start[t] = start
            tr_end[t] = finish
            binder[n + t] = bind
            t = -1
    return op_start, op_end, tr_start, tr_end, binder


@njit(cache=True)
def critical_chain(binder, last_task):
    """Task ids on the chain that set the end, from the first task to ``last_task``."""
    length = 0
    task = last_task
    while task >= 0:
        length += 1
        task = binder[task]
    chain = np.empty(length, np.int64)
    task = last_task
    for k in range(length - 1, -1, -1):
        chain[k] = task
        task = binder[task]
    return chain
