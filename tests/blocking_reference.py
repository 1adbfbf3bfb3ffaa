"""An independent reference for the simulator's blocking runtime (``overlap=False``), written
as a real blocking runtime executes a table (Megatron's non-overlapped point-to-point
communication: ``send_forward_recv_backward`` and friends). Each device runs its table in
order; between two ops it posts one batch holding the sends of the op it just finished and
the receives of the op it runs next, and waits until every transfer of the batch is done::

    op k  ->  [send outputs of op k, receive inputs of op k+1]  ->  op k+1

A transfer starts once both ends have posted it (the sender right after the producing op,
the receiver right before the consuming op, each in its own table order), then runs for
latency + bytes / bandwidth; both devices compute nothing until their batch is done. No
channel contention: compare with ``simulate(..., contention=False, overlap=False)``.

Pure Python, no numpy, meant to be read against the engine, not to be fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipesched.costs import StageCosts
from pipesched.ops import B, F, I, Op
from pipesched.schedule import Schedule
from pipesched.simulate import Network


@dataclass
class _Transfer:
    src: int
    dst: int
    seconds: float
    send_post: float | None = None
    recv_post: float | None = None
    end: float | None = None


@dataclass
class BlockingRun:
    """When each op ran, and how long each device sat blocked in sends and receives."""

    start: dict[tuple[int, Op], float] = field(default_factory=dict)  # (device, op) -> start
    end: dict[tuple[int, Op], float] = field(default_factory=dict)
    blocked: list[float] = field(default_factory=list)  # seconds per device in sends and receives
    # seconds per device in batches beyond waiting for the producers of its receives to end
    # (what blocking costs, apart from the pipeline's own waits for data)
    exposed: list[float] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max(self.end.values()) - min(self.start.values())


def blocking_run(schedule: Schedule, costs: StageCosts, network: Network, *, lookahead: int = 1,
                 steps: str = "op") -> BlockingRun:
    """Run every device's program until all ops are done; raises RuntimeError on a deadlock.

    ``steps``: "op" puts a batch between every two ops; "pair" runs a forward and the
    backward right after it as one step with no batch between them (Megatron's interleaved
    schedule: one batch sends both results and receives for the next forward and backward).
    ``lookahead``: a batch posts the receives of the next ``lookahead`` steps (those not
    posted yet)."""
    where = {op: device for device, ops in enumerate(schedule.device_ops) for op in ops}
    transfers: dict[tuple[Op, Op], _Transfer] = {}
    receives: dict[Op, list[tuple[Op, Op]]] = {}
    sends: dict[Op, list[tuple[Op, Op]]] = {}
    for device, ops in enumerate(schedule.device_ops):
        for op in ops:
            for producer in schedule.predecessors(op):
                if where[producer] != device:
                    # an activation is the producing stage's output; a gradient the consuming stage's
                    nbytes = costs.output_bytes[producer.stage] if op.kind is F else costs.output_bytes[op.stage]
                    key = (producer, op)
                    transfers[key] = _Transfer(where[producer], device,
                                               network.transfer_time(where[producer], device, nbytes))
                    receives.setdefault(op, []).append(key)
                    sends.setdefault(producer, []).append(key)
    # program of a device: batch, step, batch, step, ..., batch
    programs: list[list[tuple[str, object]]] = []
    for ops in schedule.device_ops:
        groups = _steps(ops, steps)
        program: list[tuple[str, object]] = []
        posted: set[tuple[Op, Op]] = set()
        for k, group in enumerate(groups):
            batch = [key for op in (groups[k - 1] if k > 0 else []) for key in sends.get(op, [])]
            for ahead in groups[k:k + lookahead]:
                batch += [key for op in ahead for key in receives.get(op, []) if key not in posted]
            posted.update(batch)
            program += [("batch", batch)] + [("op", op) for op in group]
        if groups:
            program.append(("batch", [key for op in groups[-1] for key in sends.get(op, [])]))
        programs.append(program)

    run = BlockingRun(blocked=[0.0] * schedule.num_devices, exposed=[0.0] * schedule.num_devices)
    clock = [0.0] * schedule.num_devices
    position = [0] * schedule.num_devices
    remaining = sum(len(p) for p in programs)
    while remaining:
        progressed = False
        for device, program in enumerate(programs):
            while position[device] < len(program):
                step, what = program[position[device]]
                if step == "op":
                    run.start[(device, what)] = clock[device]
                    clock[device] += costs.duration(what)
                    run.end[(device, what)] = clock[device]
                else:
                    for key in what:  # post every transfer of the batch at once
                        transfer = transfers[key]
                        side = "send_post" if transfer.src == device else "recv_post"
                        if getattr(transfer, side) is None:
                            setattr(transfer, side, clock[device])
                    if any(transfers[key].send_post is None or transfers[key].recv_post is None for key in what):
                        break  # blocked until the other ends post
                    done = clock[device]
                    for key in what:
                        transfer = transfers[key]
                        if transfer.end is None:
                            transfer.end = max(transfer.send_post, transfer.recv_post) + transfer.seconds
                        done = max(done, transfer.end)
                    run.blocked[device] += done - clock[device]
                    produced = max([clock[device]] + [run.end[(where[key[0]], key[0])] for key in what
                                                      if transfers[key].dst == device])
                    run.exposed[device] += done - produced
                    clock[device] = done
                position[device] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [f"d{d}: waits on {programs[d][position[d]][1]}" for d in range(len(programs))
                     if position[d] < len(programs[d])]
            raise RuntimeError("blocking runtime deadlocks: " + "; ".join(stuck))
    return run


def _steps(ops: tuple[Op, ...], steps: str) -> list[list[Op]]:
    """A device's ops grouped into steps: one op each, or a forward with the backward (I or
    B) right after it."""
    groups: list[list[Op]] = []
    for op in ops:
        if steps == "pair" and groups and len(groups[-1]) == 1 and groups[-1][0].kind is F and op.kind in (I, B):
            groups[-1].append(op)
        else:
            groups.append([op])
    return groups
