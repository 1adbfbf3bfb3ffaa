"""V-shape schedules from a repeating building block ("Pipeline Parallelism with
Controllable Memory", Qi et al., NeurIPS 2024; the greedy V schedules of
sail-sg/zero-bubble-pipeline-parallelism).

A building block fixes, for one microbatch, the slot (unit time) at which each device runs
its four passes: F down (stage d), F up (stage 2p-1-d), I up and I down. Repeating the block
every 6 slots (each device has 6 unit ops per microbatch: 2 F, 2 I, 2 W) gives a periodic
schedule whose activation memory is set by the block's lifespans: 1F1B's for ZB-V, about
half for V-Half, about a third for V-Min. Then, as in the paper:

1. weight gradients (W) go into the first free slots after their I;
2. warm-up and cool-down ops are moved to earlier free slots when that does not raise the
   peak memory of the steady state (reordering), once with W in place and once without;
3. the final per-device order is the slot order.

All times here are in unit slots; the order is what the schedule keeps.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipesched.ops import F, I, Op, W
from pipesched.rules import RULES

# Pass types of one device, in the order ties are broken.
F_DOWN, F_UP, I_UP, I_DOWN, W_ANY = 0, 1, 2, 3, 4
W_UP, W_DOWN = 4, 5  # after the final split of W by chunk
PERIOD = 6  # slots per microbatch per device
# stage-microbatches in flight each pass type adds (F, F, I, I, W), as the rules count them
_MEMORY = tuple(RULES.units_delta(kind) for kind in (F, F, I, I, W))

# times[device][pass type][microbatch] -> slot
Times = list[list[list[int]]]


def block_half(p: int) -> list[tuple[int, int, int, int]]:
    """V-Half's block: about half of 1F1B's activation memory."""
    gap = 3 if p % 2 == 0 else 0  # keeps the slots of one device distinct modulo 6
    return [(2 * d, 3 * p - d - 2, 3 * p + gap + 2 * d - 1, 6 * p + gap - d - 2) for d in range(p)]


def block_min(p: int) -> list[tuple[int, int, int, int]]:
    """V-Min's block: about a third of 1F1B's activation memory."""
    gap = 2 if p % 3 == 0 else 0  # keeps the slots of one device distinct modulo 6
    return [(d, 2 * p - d - 1, 2 * p + gap + d, 4 * p + gap - d - 1) for d in range(p)]


def repeat(block: Sequence[tuple[int, int, int, int]], m: int) -> Times:
    """The block's slots for microbatches 0..m-1, one period apart."""
    return [[[start + PERIOD * mb for mb in range(m)] for start in device] for device in block]


def _events(device: Sequence[Sequence[int]]) -> list[tuple[int, int, int]]:
    """(slot, pass type, microbatch) of one device's passes in slot order."""
    return sorted((slot, kind, mb) for kind, slots in enumerate(device) for mb, slot in enumerate(slots))


def place_w(device: Sequence[Sequence[int]], *, split: bool) -> list[list[int]]:
    """Add W passes in the first free slots after their I (W of the up chunk first).

    With ``split`` the W of each chunk get their own list (W_UP, W_DOWN); otherwise one list
    where the k-th W follows the k-th I of either chunk.
    """
    lanes = 2 if split else 1
    placed: list[list[int]] = [[] for _ in range(lanes)]
    owed = [0] * lanes
    slot = 0
    for busy, kind, _ in _events(device[:4]):
        while slot < busy:  # free slots before the next pass
            for lane in range(lanes):
                if owed[lane]:
                    placed[lane].append(slot)
                    owed[lane] -= 1
                    break
            slot += 1
        if kind in (I_UP, I_DOWN):
            owed[kind - I_UP if split else 0] += 1
        slot = busy + 1
    # W still owed after the last pass
    for lane in range(lanes):
        for _ in range(owed[lane]):
            placed[lane].append(slot)
            slot += 1
    return [list(slots) for slots in device[:4]] + placed


def peak_memory(device: Sequence[Sequence[int]]) -> float:
    """Peak stage-microbatches in flight on one device. Without a W list, owed W run in
    the free slots as ``place_w`` would put them."""
    # compiled (pipesched.generators.v_memory), loaded when a V schedule is first built so
    # that listing the families does not load the compiler
    from pipesched.generators.v_memory import lists_peak

    return lists_peak(device, _MEMORY)


def _earliest(times: Times, device: int, kind: int, mb: int) -> int:
    """The first slot a pass may take: after its inputs and its previous microbatch."""
    p = len(times)
    after = -1
    if kind in (F_DOWN, I_UP) and device > 0:
        after = max(after, times[device - 1][kind][mb])  # down forwards and up gradients come from d-1
    if kind in (F_UP, I_DOWN) and device + 1 < p:
        after = max(after, times[device + 1][kind][mb])  # up forwards and down gradients from d+1
    if F_DOWN < kind < W_ANY:
        after = max(after, times[device][kind - 1][mb])  # the V's turn on this device
    if kind == W_ANY:
        after = max(after, sorted(times[device][I_UP] + times[device][I_DOWN])[mb])
    if mb > 0:
        after = max(after, times[device][kind][mb - 1])
    return after + 1


def reorder(times: Times, *, with_w: bool) -> Times:
    """Move warm-up and cool-down passes to earlier free slots without raising the peak
    memory; return the squeezed slots (with a single W list)."""
    work = [place_w(device, split=False) if with_w else [list(s) for s in device] for device in times]
    ceiling = max(peak_memory(device) for device in work)
    last_mb = len(work[0][F_DOWN]) - 1
    occupied: list[set[int]] = [set() for _ in work]
    order = sorted(
        (slot, device, kind, mb)
        for device, lists in enumerate(work)
        for kind, slots in enumerate(lists)
        for mb, slot in enumerate(slots)
    )
    # phases: 0 warm-up (until device 0's first down gradient), 1 steady (until the first
    # forward of the last microbatch), 2 cool-down; only warm-up (with W) and cool-down move
    phase = 0
    for slot, device, kind, mb in order:
        if kind == I_DOWN and device == 0 and phase == 0:
            phase = 1
        if phase == 1 or (phase == 0 and not with_w):
            if phase == 1 and kind == F_DOWN and mb == last_mb:
                phase = 2
            occupied[device].add(slot)
            continue
        lists = work[device]
        for candidate in range(_earliest(work, device, kind, mb), slot):
            if candidate in occupied[device]:
                continue
            lists[kind][mb] = candidate
            if peak_memory(lists) <= ceiling:
                break
        else:
            lists[kind][mb] = slot
        occupied[device].add(lists[kind][mb])
    if not with_w:
        work = [place_w(device, split=False) for device in work]
    return squeeze(work)


def squeeze(times: Times) -> Times:
    """Run every pass as early as its inputs and its device allow, keeping the slot order."""
    p = len(times)
    start: Times = [[[0] * len(slots) for slots in device] for device in times]
    free = [0] * p
    order = sorted(
        (slot, device, kind, mb)
        for device, lists in enumerate(times)
        for kind, slots in enumerate(lists)
        for mb, slot in enumerate(slots)
    )
    done = [[[0] * len(slots) for slots in device] for device in times]
    for _, device, kind, mb in order:
        ready = free[device]
        if kind in (F_DOWN, I_UP) and device > 0:
            ready = max(ready, done[device - 1][kind][mb])
        if kind in (F_UP, I_DOWN) and device + 1 < p:
            ready = max(ready, done[device + 1][kind][mb])
        if F_DOWN < kind < W_ANY:
            ready = max(ready, done[device][kind - 1][mb])
        if mb > 0:
            ready = max(ready, done[device][kind][mb - 1])
        start[device][kind][mb] = ready
        done[device][kind][mb] = free[device] = ready + 1
    return start


def block_schedule(block: Sequence[tuple[int, int, int, int]], m: int) -> list[list[Op]]:
    """Per-device op orders from a building block: repeat, place W, reorder, split W."""
    p = len(block)
    first = reorder(repeat(block, m), with_w=True)
    second = reorder([device[:4] for device in first], with_w=False)
    final = [place_w(device[:4], split=True) for device in second]
    tables = []
    for d, lists in enumerate(final):
        down, up = d, 2 * p - 1 - d
        op_of = {
            F_DOWN: lambda mb, s=down: Op(s, F, mb),
            F_UP: lambda mb, s=up: Op(s, F, mb),
            I_UP: lambda mb, s=up: Op(s, I, mb),
            I_DOWN: lambda mb, s=down: Op(s, I, mb),
            W_UP: lambda mb, s=up: Op(s, W, mb),
            W_DOWN: lambda mb, s=down: Op(s, W, mb),
        }
        tables.append([op_of[kind](mb) for _, kind, mb in _events(lists)])
    return tables
