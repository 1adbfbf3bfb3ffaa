"""The compute of one op on one stage, shared by our executor and the profiler, so that what
the profiler times is exactly what a run executes.

Semantics are PyTorch's (torch/distributed/pipelining/stage.py and _backward.py):
    F   the stage's forward; on the last stage also the microbatch's loss
    B   full backward: input and weight gradients (``torch.autograd.backward``)
    I   input gradient only (``stage_backward_input``); keeps what W needs
    W   weight gradient (``stage_backward_weight``)
On the first stage, whose input (token ids) has no gradient, I does nothing and W runs the
whole backward, as PyTorch does.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesched.runtime.torch_import import require_torch
from pipesched.runtime.torch_model import StageModule, lm_loss

torch = require_torch()
from torch.distributed.pipelining._backward import (  # noqa: E402 - needs the guarded torch import
    stage_backward_input,
    stage_backward_weight,
)


@dataclass
class Forwarded:
    """What a stage keeps from F(s, mb) until its backward ends."""

    input: torch.Tensor  # the stage input (a leaf requiring grad, or token ids on stage 0)
    output: torch.Tensor  # the stage output, or the scaled loss on the last stage
    loss: torch.Tensor | None = None  # unscaled microbatch loss (last stage)
    output_grad: torch.Tensor | None = None  # kept by I on the first stage for W
    param_groups: list | None = None  # kept by I for W


def forward(module: StageModule, x: torch.Tensor, *, targets: torch.Tensor | None,
            loss_scale: float) -> Forwarded:
    """F. ``targets`` is given on the last stage: the output becomes loss * loss_scale."""
    out = module(x)
    if targets is None:
        return Forwarded(x, out)
    loss = lm_loss(out, targets)
    return Forwarded(x, loss * loss_scale, loss.detach())


def backward_full(state: Forwarded, output_grad: torch.Tensor | None) -> torch.Tensor | None:
    """B; returns the input gradient (None on the first stage)."""
    torch.autograd.backward(state.output, output_grad)
    return state.input.grad if state.input.requires_grad else None


def backward_input(module: StageModule, state: Forwarded, output_grad: torch.Tensor | None, *,
                   first: bool) -> torch.Tensor | None:
    """I; returns the input gradient (None on the first stage, where I does nothing)."""
    if first:
        state.output_grad = output_grad
        return None
    grads, state.param_groups = stage_backward_input(
        [state.output], None if output_grad is None else [output_grad], [state.input], module.parameters()
    )
    return grads[0]


def backward_weight(module: StageModule, state: Forwarded, *, first: bool) -> None:
    """W: the weight gradients (the whole backward on the first stage)."""
    if first:
        torch.autograd.backward(state.output, state.output_grad)
        return
    stage_backward_weight(module.parameters(), state.param_groups)
