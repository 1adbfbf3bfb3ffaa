"""The cause of every op's start in words (``pipesched.waits`` finds the causes)."""

from __future__ import annotations

from pipesched.render.style import time_scale
from pipesched.timeline import TRANSFER_KIND_NAMES, Timeline
from pipesched.waits import WAIT_NAMES, WAIT_NONE, WAIT_TRANSFER, Waits


def wait_texts(timeline: Timeline, waits: Waits) -> list[str]:
    """The cause of every op's start, in words (for traces; the HTML report builds the same
    sentences in the page).

    >>> from pipesched.generators import generate
    >>> from pipesched.slots import slot_table
    >>> from pipesched.waits import waited_for
    >>> t = slot_table(generate("1f1b", 2, 2))  # device 0 runs 0F0 0F1 0B0 0B1
    >>> wait_texts(t, waited_for(t))[:3]
    ['nothing: starts the iteration', 'device: 0F0 on device 0 ended at 1 slots', 'dependency: 1B0 on device 1 ended at 4 slots']
    """
    scale = time_scale(timeline.unit, timeline.makespan)
    letters = timeline.schedule.rules.letters
    stage, kind, microbatch = (timeline.op_stage.tolist(), timeline.op_kind.tolist(),
                               timeline.op_microbatch.tolist())
    device = timeline.op_device.tolist()
    table = timeline.transfers
    when = ((waits.ready - timeline.origin) * scale.factor).tolist()
    texts = []
    for row, (code, target) in enumerate(zip(waits.cause.tolist(), waits.ref.tolist(), strict=True)):
        at = f"{when[row]:.6g} {scale.unit}"
        if code == WAIT_NONE:
            texts.append("nothing: starts the iteration")
        elif code == WAIT_TRANSFER:
            texts.append(f"transfer: {TRANSFER_KIND_NAMES[int(table.kind[target])]} of microbatch "
                         f"{int(table.microbatch[target])} d{int(table.src_device[target])}->"
                         f"d{int(table.dst_device[target])} arrived at {at}")
        else:
            op = f"{stage[target]}{letters[kind[target]]}{microbatch[target]}"
            texts.append(f"{WAIT_NAMES[code]}: {op} on device {device[target]} ended at {at}")
    return texts
