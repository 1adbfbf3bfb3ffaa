"""Our executor: runs any pipesched Schedule on torch.distributed point-to-point ops.

It covers what PyTorch's runtime cannot express: a model stage kept on two devices (the
replicas of Chimera and DualPipe), each microbatch going through the replica its route
names, and the gradient all-reduce between the replicas. Each rank walks its actions from
the communication pass (``pipesched.passes.communication``): receives are posted early and
waited on by the op that consumes them, sends go out right after the op that produced them
and are waited on at the end of the step, and a replicated stage's all-reduce is posted
after its last weight-gradient op here and waited on at the end. The recorder notes every
message when its send is posted and when its consumer's wait for it returns
(``pipesched.runtime.measure``: the measured timeline's point-to-point transfers).

The compute of each op is ``stage_ops``' (PyTorch's semantics). The loss is divided by the
number of microbatches before the backward, so gradients are those of the mean loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pipesched.ops import B, F, I, Op, W
from pipesched.passes.communication import AllReduce, Message, Recv, Send, with_communication
from pipesched.runtime.measure import HostRecorder, RankStep
from pipesched.runtime.stage_ops import (
    Forwarded,
    backward_full,
    backward_input,
    backward_weight,
    forward,
)
from pipesched.runtime.torch_import import require_torch
from pipesched.runtime.torch_model import Batch, StageModule
from pipesched.schedule import Schedule
from pipesched.timeline import ACTIVATION, GRADIENT

torch = require_torch()
dist = torch.distributed


@dataclass
class RankSetup:
    """Everything one rank needs to run steps of a schedule."""

    schedule: Schedule
    rank: int
    modules: dict[tuple[int, int], StageModule]  # (stage, replica) -> module on this rank
    batch: Batch
    boundary_shape: tuple[int, ...]  # [b, s, h]: every stage boundary tensor
    dtype: object  # torch.dtype of boundary tensors
    device: object  # torch.device of this rank
    recorder: HostRecorder
    before_op: Callable[[int, int], None]  # (step, position) -> None; progress and fault hooks
    reduce_groups: dict[int, object] = field(default_factory=dict)  # replicated stage -> its 2-rank group


@dataclass
class _StepState:
    forwarded: dict[tuple[int, int], Forwarded] = field(default_factory=dict)  # (stage, mb) -> F's state
    produced: dict[Message, object] = field(default_factory=dict)
    pending: dict[Message, tuple[object, object, int]] = field(default_factory=dict)  # (work, buffer, sender)
    sends: list[tuple[object, object]] = field(default_factory=list)
    reduces: list[tuple[int, int, list, tuple, int]] = field(default_factory=list)  # replica gradient exchanges
    losses: dict[int, object] = field(default_factory=dict)


def replicated_stages(schedule: Schedule) -> dict[int, tuple[int, int]]:
    """Stage -> its two devices, for stages whose replicas live on different devices."""
    placement = schedule.placement
    if placement.num_replicas < 2:
        return {}
    return {
        s: (placement.device(s, 0), placement.device(s, 1))
        for s in range(schedule.num_stages)
        if placement.device(s, 0) != placement.device(s, 1)
    }


def hosted_modules(schedule: Schedule, rank: int) -> list[tuple[int, int]]:
    """(stage, replica) pairs whose module lives on ``rank``."""
    placement = schedule.placement
    return [(s, r) for r in range(placement.num_replicas) for s in range(schedule.num_stages)
            if placement.device(s, r) == rank]


class Executor:
    """Runs steps of ``setup.schedule`` on one rank."""

    def __init__(self, setup: RankSetup) -> None:
        self.setup = setup
        schedule = setup.schedule
        self.plan = with_communication(schedule).actions[setup.rank]
        self.num_stages = schedule.num_stages
        self.num_microbatches = schedule.num_microbatches
        replicated = replicated_stages(schedule)
        self.partner = {s: (b if a == setup.rank else a) for s, (a, b) in replicated.items()
                        if setup.rank in (a, b)}
        # a replicated stage keeps its gradients in one flat buffer (the parameters' .grad are
        # views into it), sent as it is; ``theirs`` receives the other replica's
        self.flat_grads: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for stage in self.partner:
            params = list(setup.modules[self._replica_here(stage)].parameters())
            flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
            self.flat_grads[stage] = (flat, torch.empty_like(flat))

    # --- one step ---------------------------------------------------------------------------
    def step(self, step_index: int) -> tuple[RankStep, dict[int, float]]:
        """Run one iteration; returns the rank's op records and its microbatch losses."""
        setup = self.setup
        for module in setup.modules.values():
            module.zero_grad(set_to_none=True)
        for stage, (flat, _) in self.flat_grads.items():
            flat.zero_()
            offset = 0
            for param in setup.modules[self._replica_here(stage)].parameters():
                param.grad = flat[offset:offset + param.numel()].view_as(param)
                offset += param.numel()
        setup.recorder.start_step()
        state = _StepState()
        compute_index = 0
        for action in self.plan:
            if isinstance(action, Op):
                # a fused entry's parts run one after the other (no overlap on these ranks)
                for op in action.atoms:
                    setup.before_op(step_index, compute_index)
                    self._compute(op, state)
                    compute_index += 1
            elif isinstance(action, AllReduce):
                self._post_reduce(action.stage, state)
            elif isinstance(action, Send):
                tensor = state.produced.pop(action.message)
                setup.recorder.sent(action.message, action.peer, tensor.numel() * tensor.element_size())
                work = dist.isend(tensor, action.peer, tag=self._tag(action.message))
                state.sends.append((work, tensor))
            else:
                assert isinstance(action, Recv)
                buffer = torch.empty(setup.boundary_shape, dtype=setup.dtype, device=setup.device)
                work = dist.irecv(buffer, action.peer, tag=self._tag(action.message))
                state.pending[action.message] = (work, buffer, action.peer)
        for work, _ in state.sends:
            work.wait()
        self._finish_reduces(state)
        self._sum_local_replicas()
        record = setup.recorder.finish()
        losses = {mb: float(loss) for mb, loss in state.losses.items()}
        return record, losses

    def _tag(self, message: Message) -> int:
        return message.tag(self.num_stages, self.num_microbatches)

    def _take(self, message: Message, state: _StepState) -> tuple[object, int]:
        """The tensor ``message`` carries and the ns spent waiting for it; a message from
        another rank is recorded as received once the wait returns."""
        if message in state.pending:
            work, buffer, sender = state.pending.pop(message)
            recorder = self.setup.recorder
            begun = recorder.now()
            work.wait()
            recorder.received(message, sender)
            return buffer, recorder.now() - begun
        return state.produced.pop(message), 0

    def _compute(self, op: Op, state: _StepState) -> None:
        setup = self.setup
        s, kind, mb = op.stage, op.kind, op.microbatch
        key = (s, mb)
        module = setup.modules[(s, setup.schedule.route[mb])]
        first, last = s == 0, s == self.num_stages - 1
        recorder = setup.recorder
        waited = 0
        if kind is F:
            if first:
                x = setup.batch.tokens[mb]
            else:
                x, waited = self._take(Message(ACTIVATION, s - 1, mb), state)
                x = x.detach().requires_grad_(True)
            begun = recorder.begin()
            done = forward(module, x, targets=setup.batch.targets[mb] if last else None,
                           loss_scale=1.0 / self.num_microbatches)
            recorder.end(op, begun, wait_ns=waited)
            state.forwarded[key] = done
            if last:
                state.losses[mb] = done.loss
            else:
                state.produced[Message(ACTIVATION, s, mb)] = done.output.detach()
            return
        if kind is W:
            begun = recorder.begin()
            backward_weight(module, state.forwarded.pop(key), first=first)
            recorder.end(op, begun)
            return
        grad = None
        if not last:
            grad, waited = self._take(Message(GRADIENT, s + 1, mb), state)
        done = state.forwarded[key]
        begun = recorder.begin()
        if kind is B:
            input_grad = backward_full(done, grad)
        else:
            assert kind is I
            input_grad = backward_input(module, done, grad, first=first)
        recorder.end(op, begun, wait_ns=waited)
        if not first:
            state.produced[Message(GRADIENT, s, mb)] = input_grad
        if kind is B:
            del state.forwarded[key]

    # --- replicas (Chimera, DualPipe) ---------------------------------------------------------
    def _post_reduce(self, stage: int, state: _StepState) -> None:
        flat, theirs = self.flat_grads[stage]
        posted = self.setup.recorder.now()
        # a two-rank all-reduce as an exchange: each rank sends its gradients and adds the
        # other's (a + b == b + a, so both end with the same bits). One process group per
        # replicated stage: the order in which a rank finishes its stages does not matter.
        # (gloo's all_reduce on CPU ranks moves the same bytes, but several times slower.)
        partner, group = self.partner[stage], self.setup.reduce_groups[stage]
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, flat, partner, group),
                                        dist.P2POp(dist.irecv, theirs, partner, group)])
        state.reduces.append((stage, partner, works, (flat, theirs), posted))

    def _replica_here(self, stage: int) -> tuple[int, int]:
        return next(key for key in self.setup.modules if key[0] == stage)

    def _finish_reduces(self, state: _StepState) -> None:
        record = self.setup.recorder.step
        for stage, partner, works, (flat, theirs), posted in state.reduces:
            for work in works:
                work.wait()
            flat += theirs  # the parameters' .grad are views: they now hold the sum
            finished = self.setup.recorder.now()
            record.reduces.append((stage, partner, posted, finished))
            record.reduce_bytes.append(float(flat.numel() * flat.element_size()))

    def _sum_local_replicas(self) -> None:
        """Both replicas of a stage on this rank: their gradients are summed in place."""
        modules = self.setup.modules
        for (stage, replica), module in modules.items():
            other = modules.get((stage, 1 - replica))
            if replica != 0 or other is None:
                continue
            for mine, theirs in zip(module.parameters(), other.parameters(), strict=True):
                total = _add(mine.grad, theirs.grad)
                mine.grad = total
                theirs.grad = None if total is None else total.clone()


def _add(a: object, b: object) -> object:
    if a is None:
        return b
    if b is None:
        return a
    return a + b
