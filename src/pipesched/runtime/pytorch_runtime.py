"""Running a schedule through PyTorch's own runtime, ``_PipelineScheduleRuntime``, from our
compute-only CSV (``pipesched.io.torch_csv``): PyTorch lowers it (``_add_send_recv``) and
executes it with its PipelineStage objects.

PyTorch places every stage on exactly one rank, so schedules with replicated stages
(Chimera, DualPipe) are out of its reach; ``pytorch_limitation`` says why for a given
schedule. Op timing wraps PipelineStage's three compute entry points
(``forward_one_chunk``, ``backward_one_chunk``, ``backward_weight_one_chunk``): they run
after PyTorch has waited for the op's input, so an op's time is its compute alone. The
point-to-point messages are recorded as the executor records them
(``pipesched.runtime.measure``): a send when PipelineStage hands its send ops to be posted
(``get_fwd_send_ops``, ``get_bwd_send_ops``), a receive when its consumer starts, right after
PyTorch's wait for it returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipesched.errors import PipeschedError
from pipesched.io import torch_csv
from pipesched.ops import B, F, I, Op, W
from pipesched.runtime.executor import RankSetup
from pipesched.runtime.measure import RankStep
from pipesched.runtime.torch_import import require_torch
from pipesched.runtime.torch_model import lm_loss
from pipesched.schedule import Schedule
from pipesched.timeline import ACTIVATION, GRADIENT

torch = require_torch()
from torch.distributed.pipelining import PipelineStage  # noqa: E402 - needs the guarded torch import
from torch.distributed.pipelining import schedules as torch_schedules  # noqa: E402
from torch.distributed.pipelining.schedules import (  # noqa: E402
    _Action,
    _add_send_recv,
    _PipelineScheduleRuntime,
    _validate_schedule,
)

_ORIGINAL_WAIT = torch_schedules._wait_batch_p2p


def pytorch_limitation(schedule: Schedule) -> str | None:
    """Why PyTorch's runtime cannot run ``schedule`` (one sentence), or None if it can."""
    placement = schedule.placement
    if placement.num_replicas > 1 and any(set(stage_devices) != {stage_devices[0]}
                                          for stage_devices in zip(*placement.replicas, strict=True)):
        return ("its stages live on two ranks as replicas, and PyTorch's runtime places every "
                "stage on exactly one rank")
    try:
        text = torch_csv.dumps(schedule)
    except PipeschedError as exc:
        return str(exc)
    actions = {rank: [_Action.from_str(cell) for cell in row.split(",")]
               for rank, row in enumerate(text.splitlines())}
    try:
        stage_to_rank = _validate_schedule(actions, schedule.num_devices, schedule.num_stages,
                                           schedule.num_microbatches)
        compute_only = {rank: [a for a in row if a is not None] for rank, row in actions.items()}
        _add_send_recv(compute_only, stage_to_rank=lambda s: stage_to_rank[s], num_stages=schedule.num_stages)
    except AssertionError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"PyTorch's schedule checks reject it ({first_line})"
    return None


@dataclass
class _Hooks:
    """Shared by the stages of one rank: op timing, progress and the current step."""

    setup: RankSetup
    step: int = 0
    position: int = 0
    last_forward_mb: int = -1

    waited_ns: int = 0  # time PyTorch spent waiting for the next op's input

    def begin(self) -> object:
        self.setup.before_op(self.step, self.position)
        self.position += 1
        return self.setup.recorder.begin()

    def end(self, op: Op, begun: object) -> None:
        self.setup.recorder.end(op, begun, wait_ns=self.waited_ns)
        self.waited_ns = 0

    def remote(self, stage: int) -> int | None:
        """The rank of ``stage`` when it is not this one (PyTorch places each stage once)."""
        device = self.setup.schedule.placement.device(stage, 0)
        return None if device == self.setup.rank else device

    def received(self, kind: int, stage: int, microbatch: int) -> None:
        """The op about to run read ``kind`` of ``microbatch`` from ``stage``: recorded as
        received when that stage is on another rank (PyTorch waited for it just before)."""
        peer = self.remote(stage)
        if peer is not None:
            self.setup.recorder.received((kind, stage, microbatch), peer)

    def sent(self, kind: int, stage: int, microbatch: int, to_stage: int, ops: list) -> None:
        """``ops`` (PyTorch's P2POps carrying the message) are about to be posted."""
        if not ops:
            return
        peer = self.remote(to_stage)
        if peer is not None:
            nbytes = sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
            self.setup.recorder.sent((kind, stage, microbatch), peer, nbytes)

    def timed_wait(self, original):
        """Wrap PyTorch's ``_wait_batch_p2p`` to count the time an op waits for its input."""
        recorder = self.setup.recorder

        def wait(work):
            begun = recorder.now()
            original(work)
            self.waited_ns += recorder.now() - begun

        return wait


class TimedStage(PipelineStage):
    """A PipelineStage that records when each of its compute ops runs."""

    def __init__(self, *args: object, hooks: _Hooks, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.hooks = hooks

    def _get_init_p2p_neighbors_ops(self):
        # The connection warm-up before the first step. PyTorch up to 2.11 also posts it to a
        # neighbouring stage on this same rank (the turn of a V: ZB-V, DualPipeV), a message to
        # itself that gloo refuses ("Pair is not connected"); such a neighbour needs none.
        return [op for op in super()._get_init_p2p_neighbors_ops() if op.group_peer != self.group_rank]

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):
        if not self.is_first:
            self.hooks.received(ACTIVATION, self.stage_index - 1, fwd_chunk_id)
        begun = self.hooks.begin()
        output = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        self.hooks.end(Op(self.stage_index, F, fwd_chunk_id), begun)
        self.hooks.last_forward_mb = fwd_chunk_id
        return output

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        if not self.is_last:
            self.hooks.received(GRADIENT, self.stage_index + 1, bwd_chunk_id)
        begun = self.hooks.begin()
        super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                   last_backward=last_backward)
        self.hooks.end(Op(self.stage_index, B if full_backward else I, bwd_chunk_id), begun)

    def get_fwd_send_ops(self, fwd_chunk_id):
        ops = super().get_fwd_send_ops(fwd_chunk_id)
        self.hooks.sent(ACTIVATION, self.stage_index, fwd_chunk_id, self.stage_index + 1, ops)
        return ops

    def get_bwd_send_ops(self, bwd_chunk_id):
        ops = super().get_bwd_send_ops(bwd_chunk_id)
        self.hooks.sent(GRADIENT, self.stage_index, bwd_chunk_id, self.stage_index - 1, ops)
        return ops

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        begun = self.hooks.begin()
        super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
        self.hooks.end(Op(self.stage_index, W, bwd_chunk_id), begun)


class PyTorchRunner:
    """Runs steps of a schedule on one rank through ``_PipelineScheduleRuntime``."""

    def __init__(self, setup: RankSetup, csv_path: Path) -> None:
        self.setup = setup
        schedule = setup.schedule
        self.hooks = _Hooks(setup)
        self.losses: dict[int, torch.Tensor] = {}
        num_stages = schedule.num_stages
        b, s, _ = setup.boundary_shape
        # shapes for PyTorch's static stage metadata; requires_grad marks the tensors whose
        # gradients travel back between stages
        hidden = torch.empty(setup.boundary_shape, dtype=setup.dtype, device=setup.device, requires_grad=True)
        tokens = torch.zeros((b, s), dtype=torch.long, device=setup.device)
        stages = []
        for (stage, _), module in sorted(setup.modules.items()):
            first, last = stage == 0, stage == num_stages - 1
            vocab = module.layers[-1].lm_head.out_features if last else 0
            output = (torch.empty((b, s, vocab), dtype=setup.dtype, device=setup.device, requires_grad=True)
                      if last else hidden)
            stages.append(TimedStage(module, stage, num_stages, setup.device, input_args=tokens if first else hidden,
                                     output_args=output, hooks=self.hooks))
        self.has_first = any(st.is_first for st in stages)
        self.has_last = any(st.is_last for st in stages)
        self.runtime = _PipelineScheduleRuntime(stages, n_microbatches=schedule.num_microbatches,
                                                loss_fn=self._loss, scale_grads=True)
        self.runtime._load_csv(str(csv_path), format="compute_only")
        # the runtime waits for an op's input through this module function; timing it gives
        # the op's input wait (the rank process runs one runtime at a time)
        torch_schedules._wait_batch_p2p = self.hooks.timed_wait(_ORIGINAL_WAIT)

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # PyTorch computes the loss right after the last stage's forward: count it in that F
        loss = lm_loss(logits, targets)
        self.hooks.setup.recorder.extend_last()
        self.losses[self.hooks.last_forward_mb] = loss.detach()
        return loss

    def step(self, step_index: int) -> tuple[RankStep, dict[int, float]]:
        setup = self.setup
        for module in setup.modules.values():
            module.zero_grad(set_to_none=True)
        setup.recorder.start_step()
        self.hooks.step, self.hooks.position, self.hooks.waited_ns = step_index, 0, 0
        self.losses = {}
        args = (torch.cat(setup.batch.tokens),) if self.has_first else ()
        target = torch.cat(setup.batch.targets) if self.has_last else None
        self.runtime.step(*args, target=target, losses=[] if self.has_last else None, return_outputs=False)
        return setup.recorder.finish(), {mb: float(loss) for mb, loss in self.losses.items()}
