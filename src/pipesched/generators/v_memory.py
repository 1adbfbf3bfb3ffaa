"""The peak activation memory of one device of a V-shape building-block schedule, compiled:
the reordering of ``v_blocks`` asks for it once per candidate slot of every moved pass.

A device's passes are given as slots per pass type and microbatch (pass types in
``v_blocks``' tie order); they run in slot order, ties broken by pass type,
then microbatch. ``memory[kind]`` is what a pass of that type adds to the stage-microbatches
held (F adds one, I and W free their shares). Without W passes (``has_w`` false) every I owes
a W, and owed W run in the free slots before each pass, freeing as they run.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
from numba import njit


@njit(cache=True)
def device_peak(slots, counts, memory, has_w):
    """The most stage-microbatches held at once on the device (``v_blocks.peak_memory``):
    ``slots`` holds every pass's slot, pass type by pass type, ``counts[kind]`` passes of each."""
    kinds = np.empty(slots.size, np.int64)
    keys = np.empty(slots.size, np.int64)
    most = counts.max() + 1
    index = 0
    for kind in range(counts.size):
        for mb in range(counts[kind]):
            kinds[index] = kind
            # (slot, kind, mb) as one sortable integer: kind < 8, mb < most
            keys[index] = (slots[index] * 8 + kind) * most + mb
            index += 1
    held = 0.0
    peak = 0.0
    owed = 0
    last = -1
    for index in np.argsort(keys):
        kind = kinds[index]
        slot = slots[index]
        if not has_w:
            freed = min(slot - last - 1, owed)
            held -= freed
            owed -= freed
        held += memory[kind]
        if kind == 2 or kind == 3:  # I up, I down: each owes its W
            owed += 1
        if held > peak:
            peak = held
        last = slot
    return peak


def lists_peak(device: Sequence[Sequence[int]], memory: Sequence[float]) -> float:
    """``device_peak`` of a device given as slot lists per pass type (``v_blocks``'
    layout), ``memory[kind]`` as there; W passes present when there are more than four lists."""
    slots = np.fromiter(chain.from_iterable(device), np.int64)
    counts = np.array([len(passes) for passes in device], np.int64)
    return float(device_peak(slots, counts, np.asarray(memory, np.float64), len(device) > 4))
