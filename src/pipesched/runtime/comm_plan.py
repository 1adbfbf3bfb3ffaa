"""The communication plan of a real run: each device's compute ops with the sends and
receives they need, in an order that cannot deadlock.

Like PyTorch's ``_add_send_recv`` lowering, the plan comes from a walk over the devices in
rounds: a device takes its next op once the op's data predecessors have run somewhere.
When an op produces a result that another device consumes, the walk appends a ``Send`` to
the producer's plan and, at the same moment, the matching ``Recv`` to the consumer's plan.
So every pair of devices sees the traffic between them in the same order on both sides
(what NCCL needs; gloo matches by tag and would not care), and a receive is posted long
before its consumer waits on it.

Messages:
    activation  after F(s, mb) when F(s+1, mb) runs on another device
    gradient    after I/B(s, mb) when the backward of (s-1, mb) runs on another device
A consumer on the producer's device takes the result in place: no message.
"""

from __future__ import annotations

from typing import NamedTuple

from pipesched.errors import PipeschedError
from pipesched.ops import F, Op, is_backward
from pipesched.schedule import Schedule

ACTIVATION = "activation"
GRADIENT = "gradient"


class Message(NamedTuple):
    """A tensor between two stages: ``kind`` from stage ``stage`` for ``microbatch``."""

    kind: str  # ACTIVATION (to stage + 1) or GRADIENT (to stage - 1)
    stage: int  # the producing stage
    microbatch: int

    def tag(self, num_stages: int, num_microbatches: int) -> int:
        """A tag unique within one iteration (gloo matches sends to receives by it)."""
        kind = 0 if self.kind == ACTIVATION else 1
        return (kind * num_stages + self.stage) * num_microbatches + self.microbatch


class Compute(NamedTuple):
    op: Op


class Send(NamedTuple):
    message: Message
    peer: int  # destination device


class Recv(NamedTuple):
    message: Message
    peer: int  # source device


Action = Compute | Send | Recv


def consumed_message(schedule: Schedule, op: Op) -> Message | None:
    """The result ``op`` needs from another op (None for F of stage 0 and the last stage's
    backward, which starts from the loss; W reads only its own stage's state)."""
    if op.kind is F:
        return Message(ACTIVATION, op.stage - 1, op.microbatch) if op.stage > 0 else None
    if is_backward(op.kind) and op.stage < schedule.num_stages - 1:
        return Message(GRADIENT, op.stage + 1, op.microbatch)
    return None


def produced_message(schedule: Schedule, op: Op) -> tuple[Message, int] | None:
    """The result ``op`` hands on and the device that consumes it, if any."""
    if op.kind is F and op.stage < schedule.num_stages - 1:
        return Message(ACTIVATION, op.stage, op.microbatch), schedule.device_of(op.stage + 1, op.microbatch)
    if is_backward(op.kind) and op.stage > 0:
        return Message(GRADIENT, op.stage, op.microbatch), schedule.device_of(op.stage - 1, op.microbatch)
    return None


def communication_plan(schedule: Schedule) -> tuple[tuple[Action, ...], ...]:
    """Per device: its compute ops in table order, with sends and receives interleaved.

    Raises PipeschedError when the tables deadlock (no device can take its next op).

    >>> from pipesched.generators import generate
    >>> [str(a.op) if isinstance(a, Compute) else type(a).__name__
    ...  for a in communication_plan(generate("gpipe", 2, 1))[0]]
    ['0F0', 'Send', 'Recv', '0B0']
    """
    num_devices = schedule.num_devices
    plans: list[list[Action]] = [[] for _ in range(num_devices)]
    position = [0] * num_devices
    done: set[Op] = set()
    remaining = schedule.num_ops
    while remaining:
        progress = False
        # one op per device per round, devices in rank order (PyTorch's lowering does the same)
        for device in range(num_devices):
            ops = schedule.device_ops[device]
            if position[device] == len(ops):
                continue
            op = ops[position[device]]
            if not all(pred in done for pred in schedule.predecessors(op)):
                continue
            plans[device].append(Compute(op))
            done.add(op)
            position[device] += 1
            remaining -= 1
            progress = True
            produced = produced_message(schedule, op)
            if produced is not None and produced[1] != device:
                message, consumer = produced
                plans[device].append(Send(message, consumer))
                plans[consumer].append(Recv(message, device))
        if not progress:
            stuck = "; ".join(
                f"device {d} waits at {schedule.device_ops[d][position[d]]}"
                for d in range(num_devices) if position[d] < len(schedule.device_ops[d])
            )
            raise PipeschedError(
                f"schedule={schedule.name}: the tables deadlock ({stuck}); run `pipesched validate` for the report"
            )
    return tuple(tuple(plan) for plan in plans)
