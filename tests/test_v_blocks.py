"""The V-shape building blocks' peak memory (the compiled count the reordering asks for)
against the count stated pass by pass."""

from __future__ import annotations

import random

from pipesched.generators.v_blocks import (
    I_DOWN,
    I_UP,
    block_half,
    block_min,
    peak_memory,
    place_w,
    repeat,
)

# stage-microbatches each pass type adds: F down, F up, I up, I down (kept for W), W
ADDS = (1, 1, 0, 0, -1)


def held_at_peak(device: list[list[int]]) -> float:
    """Walk the passes in slot order (ties: pass type, then microbatch); without a W list
    every I owes a W and owed W run in the free slots before each pass."""
    has_w = len(device) > 4
    events = sorted((slot, kind, mb) for kind, slots in enumerate(device) for mb, slot in enumerate(slots))
    held = peak = owed = 0
    last = -1
    for slot, kind, _ in events:
        if not has_w:
            idle = slot - last - 1
            ran = min(idle, owed)
            held, owed = held - ran, owed - ran
        held += ADDS[kind]
        owed += kind in (I_UP, I_DOWN)
        peak = max(peak, held)
        last = slot
    return peak


def test_peak_memory_counts_as_the_passes_run():
    rng = random.Random(7)
    for block in (block_half(4), block_min(6), block_half(3)):
        for m in (1, 4, 9):
            times = repeat(block, m)
            for device in times:
                with_w = place_w(device, split=False)
                assert peak_memory(device) == held_at_peak(device)
                assert peak_memory(with_w) == held_at_peak(with_w)
                # passes moved to random slots (ties included) count the same way
                moved = [[slot + rng.randint(-8, 8) for slot in slots] for slots in with_w]
                assert peak_memory(moved) == held_at_peak(moved)
                assert peak_memory(moved[:4]) == held_at_peak(moved[:4])
