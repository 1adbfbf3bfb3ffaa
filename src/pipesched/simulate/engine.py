"""The event engine: start and end of every op and transfer of a compiled task graph.

Resources. Every op runs on a queue: one of its device's streams (the compute stream, for
every kind of the default rules), in program order. A transfer holds a list of resources
for its whole duration: the send channel of its source and the receive channel of its
destination, the shared NICs of their nodes, and with a blocking runtime the compute
streams of both ends (``pipesched.simulate.graph`` decides which). A resource runs one task
at a time.

Sharing model: FIFO serialization. Transfers that share a link or a NIC queue one behind
the other at the full link rate; with contention off they hold no channel and start as
soon as their data are ready.

Service order. Every resource serves its tasks in one fixed global order: the order in
which the ops complete when communication is free, ranked by (completion time, sequence),
each transfer placed right after the last op that releases it (ties: transfer order).
Queues keep their program order (a queue completes its ops in order); channels serve
transfers in the order a runtime posts them. A fixed order makes the engine

- deterministic: ties in completion time break by the sequence (the dependency order of
  the first pass), the same on every run;
- deadlock-free: every dependency and every resource order goes forward in that global
  order, so a table that runs with free communication never stalls on a channel;
- monotone: every start time is a max of sums of durations (max-plus algebra), so a
  slower link or a longer op never makes any task finish earlier.
Free communication (zero latency, infinite bandwidth) reproduces the slot table exactly.

Two passes. (1) ``completion_order`` walks the queues with free communication, as the slot
table does, and ranks the ops. (2) ``sweep`` visits all tasks once in the global order, a
discrete-event run whose events are already sorted: a task starts when its data have
arrived and each of its resources has finished the task before it there (per-resource
"free at" times), then occupies them until it ends. ``binder`` records, for every task, the
task that set its start (a data predecessor or the previous task on a resource): following
it back from the last task to end gives the critical path.

Release times. An op may carry a release time (``TaskGraph.op_release``: a request that
arrives at t): it starts no earlier, in both passes. A graph without them passes an empty
``None`` and runs the same loop as before.

Task ids in ``binder``: op rows are 0..N-1, transfer t is N + t, -1 is the start of the
iteration. ``makespans`` runs both passes for a batch of duration vectors in one compiled
loop (Monte Carlo, what-ifs): nothing is lowered again.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipesched.ordering import walk_queues

# no release times: every op may start at time 0 (the default of every graph); numba compiles
# the loops for None without the release code, so the default path is the loop it always was
NO_RELEASE = None
# the tables' walk (``pipesched.ordering``), compiled
_walk_queues = njit(cache=True)(walk_queues)


@njit(cache=True)
def _walk(queue_rows, queue_offsets, pred_ptr, pred_op, duration, release):
    """Run the queues with free communication and release times (``walk_queues``; ``release``
    None: none). Returns (sequence, end, count): the ops in the order they were evaluated (a
    dependency order), each op's end time, and how many ops could run (fewer than all:
    deadlock)."""
    n = duration.shape[0]
    num_queues = queue_offsets.shape[0] - 1
    end = np.zeros(n, np.float64)
    sequence = np.empty(n, np.int32)
    count = _walk_queues(queue_rows, queue_offsets, pred_ptr, pred_op, duration, queue_offsets[:-1].copy(),
                         np.zeros(num_queues, np.float64), np.zeros(n, np.bool_), np.empty(n, np.float64), end,
                         sequence, np.full(n, -1, np.int32), np.full(num_queues, -1, np.int32),
                         np.empty(num_queues + 1, np.int32), np.zeros(num_queues, np.bool_), release)
    return sequence, end, count


@njit(cache=True)
def merge_order(sequence, end, queue_rows, queue_offsets):
    """The ops of a completed walk by (end, position in ``sequence``): a merge of the queues,
    each already in that order (a queue's ops end in program order), through a heap of
    queues, in O(ops x log queues)."""
    n = sequence.shape[0]
    position = np.empty(n, np.int64)
    for k in range(n):
        position[sequence[k]] = k
    num_queues = queue_offsets.shape[0] - 1
    # heap of queues keyed by (end, position) of their next op
    heap_queue = np.empty(num_queues, np.int64)
    heap_end = np.empty(num_queues, np.float64)
    heap_position = np.empty(num_queues, np.int64)
    pos = queue_offsets[:-1].copy()
    size = 0
    for q in range(num_queues):
        if pos[q] < queue_offsets[q + 1]:
            x = queue_rows[pos[q]]
            e, s = end[x], position[x]
            j = size
            size += 1
            while j > 0:
                parent = (j - 1) >> 1
                if heap_end[parent] < e or (heap_end[parent] == e and heap_position[parent] < s):
                    break
                heap_queue[j], heap_end[j], heap_position[j] = heap_queue[parent], heap_end[parent], heap_position[parent]
                j = parent
            heap_queue[j], heap_end[j], heap_position[j] = q, e, s
    order = np.empty(n, np.int32)
    for k in range(n):
        q = heap_queue[0]
        order[k] = queue_rows[pos[q]]
        pos[q] += 1
        if pos[q] < queue_offsets[q + 1]:
            x = queue_rows[pos[q]]
            e, s = end[x], position[x]
        else:
            size -= 1
            if size == 0:
                break
            q, e, s = heap_queue[size], heap_end[size], heap_position[size]
        j = 0
        while True:
            child = 2 * j + 1
            if child >= size:
                break
            right = child + 1
            if right < size and (heap_end[right] < heap_end[child]
                                 or (heap_end[right] == heap_end[child] and heap_position[right] < heap_position[child])):
                child = right
            if e < heap_end[child] or (e == heap_end[child] and s < heap_position[child]):
                break
            heap_queue[j], heap_end[j], heap_position[j] = heap_queue[child], heap_end[child], heap_position[child]
            j = child
        heap_queue[j], heap_end[j], heap_position[j] = q, e, s
    return order


def completion_order(queue_rows, queue_offsets, pred_ptr, pred_op, duration, release=NO_RELEASE):
    """The global service order: ops by (completion time with free communication, sequence).

    The sequence (the walk's dependency order) breaks ties, so an op of zero duration still
    comes after the op it depends on. Returns (order, count); count < number of ops when the
    tables deadlock. ``release``: each op's release time (None: none).
    """
    sequence, end, count = _walk(queue_rows, queue_offsets, pred_ptr, pred_op, duration, release)
    if count < duration.shape[0]:
        return sequence[:count], count
    return merge_order(sequence, end, queue_rows, queue_offsets), count


def free_ends(queue_rows, queue_offsets, pred_ptr, pred_op, duration, release=NO_RELEASE):
    """End time of every op with free communication (the first pass alone, the slot
    table's run), and how many ops could run (fewer than all: deadlock). With the same
    durations no run with links ends any op earlier (the engine is monotone)."""
    _, end, count = _walk(queue_rows, queue_offsets, pred_ptr, pred_op, duration, release)
    return end, count


@njit(cache=True)
def transfer_order(order, tr_rel_ptr, tr_rel):
    """Transfers in service order: each right after the last (in ``order``) of the ops that
    release it; transfers released by the same op keep their index order (a counting sort
    by that op's rank)."""
    n = order.shape[0]
    num_transfers = tr_rel_ptr.shape[0] - 1
    rank = np.empty(n, np.int64)
    for k in range(n):
        rank[order[k]] = k
    key = np.empty(num_transfers, np.int64)
    start = np.zeros(n + 1, np.int64)
    for t in range(num_transfers):
        best = -1
        for e in range(tr_rel_ptr[t], tr_rel_ptr[t + 1]):
            r = rank[tr_rel[e]]
            if r > best:
                best = r
        key[t] = best
        start[best + 1] += 1
    for k in range(n):
        start[k + 1] += start[k]
    sorted_transfers = np.empty(num_transfers, np.int64)
    for t in range(num_transfers):
        sorted_transfers[start[key[t]]] = t
        start[key[t]] += 1
    return sorted_transfers, key


@njit(cache=True)
def sweep(order, op_queue, pred_ptr, pred_op, pred_via, op_duration,
          tr_order, tr_key, tr_rel_ptr, tr_rel, tr_res_ptr, tr_res, tr_duration, num_resources, release):
    """Start and end of every op and transfer, visiting tasks in the global service order;
    an op starts no earlier than its release time (``release`` None: none; a release that
    sets the start binds the op to the start of the iteration, -1).

    Returns (op_start, op_end, tr_start, tr_end, binder).
    """
    n = op_duration.shape[0]
    num_transfers = tr_duration.shape[0]
    free_at = np.zeros(num_resources, np.float64)
    owner = np.full(num_resources, -1, np.int64)
    op_start = np.empty(n, np.float64)
    op_end = np.empty(n, np.float64)
    tr_start = np.empty(num_transfers, np.float64)
    tr_end = np.empty(num_transfers, np.float64)
    binder = np.empty(n + num_transfers, np.int32)
    next_tr = 0
    for k in range(n):
        # --- compute op x on its queue
        x = order[k]
        q = op_queue[x]
        start = free_at[q]
        bind = owner[q]
        if release is not None and release[x] > start:
            start = release[x]
            bind = -1
        for e in range(pred_ptr[x], pred_ptr[x + 1]):
            t = pred_via[e]
            if t >= 0:
                # the data came over a link: ready when the transfer ends
                if tr_end[t] > start:
                    start = tr_end[t]
                    bind = n + t
            else:
                p = pred_op[e]
                if op_end[p] > start:
                    start = op_end[p]
                    bind = p
        finish = start + op_duration[x]
        op_start[x] = start
        op_end[x] = finish
        free_at[q] = finish
        owner[q] = x
        binder[x] = bind
        # --- the transfers released here
        while next_tr < num_transfers and tr_key[tr_order[next_tr]] == k:
            t = tr_order[next_tr]
            next_tr += 1
            first = tr_rel[tr_rel_ptr[t]]
            start = op_end[first]
            bind = first
            for e in range(tr_rel_ptr[t] + 1, tr_rel_ptr[t + 1]):
                other = tr_rel[e]
                if op_end[other] > start:
                    start = op_end[other]
                    bind = other
            for e in range(tr_res_ptr[t], tr_res_ptr[t + 1]):
                r = tr_res[e]
                if free_at[r] > start:
                    start = free_at[r]
                    bind = owner[r]
            finish = start + tr_duration[t]
            for e in range(tr_res_ptr[t], tr_res_ptr[t + 1]):
                r = tr_res[e]
                free_at[r] = finish
                owner[r] = n + t
            tr_start[t] = start
            tr_end[t] = finish
            binder[n + t] = bind
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


@njit(cache=True)
def last_task(op_end, tr_end):
    """The task that ends last: an op, or a transfer that ends after every op."""
    n = op_end.shape[0]
    last = 0
    for x in range(1, n):
        if op_end[x] > op_end[last]:
            last = x
    if tr_end.shape[0] > 0:
        best = 0
        for t in range(1, tr_end.shape[0]):
            if tr_end[t] > tr_end[best]:
                best = t
        if tr_end[best] > op_end[last]:
            return n + best
    return last


@njit(cache=True)
def makespans(queue_rows, queue_offsets, op_queue, pred_ptr, pred_op, pred_via, tr_rel_ptr, tr_rel,
              tr_res_ptr, tr_res, num_resources, op_durations, tr_durations, critical_counts, critical_seconds,
              op_group, tr_group, group_end, release):
    """Iteration time of each row of ``op_durations`` (samples x ops) with the transfer
    durations of the same row of ``tr_durations`` (samples x transfers). When
    ``critical_counts`` (ops + transfers) is not empty, each task's count of samples in
    which it lies on the critical path is added to it, and its duration in those samples to
    ``critical_seconds``. When ``group_end`` (samples x groups) has columns, each task
    belongs to group ``op_group[x]`` / ``tr_group[t]`` (the iterations of a steady-state
    graph) and ``group_end[i, g]`` is set to the last end of a task of group g in sample i,
    from the sample's first op start. ``release``: each op's release time (None: none).
    Returns -1 for a sample whose tables deadlock (never, for a graph that compiled)."""
    samples = op_durations.shape[0]
    n = op_durations.shape[1]
    out = np.empty(samples, np.float64)
    count_path = critical_counts.shape[0] > 0
    groups = group_end.shape[1]
    for i in range(samples):
        duration = op_durations[i]
        sequence, end, count = _walk(queue_rows, queue_offsets, pred_ptr, pred_op, duration, release)
        if count < n:
            out[i] = -1.0
            continue
        order = merge_order(sequence, end, queue_rows, queue_offsets)
        tr_ord, tr_key = transfer_order(order, tr_rel_ptr, tr_rel)
        op_start, op_end, _tr_start, tr_end, binder = sweep(
            order, op_queue, pred_ptr, pred_op, pred_via, duration, tr_ord, tr_key, tr_rel_ptr, tr_rel,
            tr_res_ptr, tr_res, tr_durations[i], num_resources, release)
        finish = op_end.max() if n else 0.0
        if tr_end.shape[0] > 0 and tr_end.max() > finish:
            finish = tr_end.max()
        origin = op_start.min() if n else 0.0
        out[i] = finish - origin
        if groups > 0:
            for g in range(groups):
                group_end[i, g] = 0.0
            for x in range(n):
                g = op_group[x]
                if op_end[x] - origin > group_end[i, g]:
                    group_end[i, g] = op_end[x] - origin
            for t in range(tr_end.shape[0]):
                g = tr_group[t]
                if tr_end[t] - origin > group_end[i, g]:
                    group_end[i, g] = tr_end[t] - origin
        if count_path and n:
            task = last_task(op_end, tr_end)
            while task >= 0:
                critical_counts[task] += 1
                critical_seconds[task] += duration[task] if task < n else tr_durations[i, task - n]
                task = binder[task]
    return out
