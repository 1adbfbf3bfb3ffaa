"""Timing a run of layers in isolation: one process, no pipeline, the same op code as a run
(``stage_ops``). Each op is timed after warm-up over several repeats; the median is kept.

A "stage" here is any contiguous run of layers: a single layer for the per-layer profile, or
a whole pipeline stage for per-stage costs (the first stage's I/W split and the last stage's
loss then come out exactly as a run executes them).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from pipesched.model.spec import ModelSpec
from pipesched.runtime.profile import ProfileTask, StageTiming
from pipesched.runtime.stage_ops import backward_full, backward_input, backward_weight, forward
from pipesched.runtime.torch_import import require_torch
from pipesched.runtime.torch_model import build_stage, make_batch, torch_dtype

torch = require_torch()


def _clock(device: torch.device) -> Callable[[], int]:
    if device.type == "cuda":
        def now() -> int:
            torch.cuda.synchronize(device)
            return time.perf_counter_ns()
        return now
    return time.perf_counter_ns


def _saved_bytes(module: torch.nn.Module, run: Callable[[], object]) -> tuple[object, float]:
    """Run ``run`` and count the bytes of the distinct tensors autograd saved for backward."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = run()
    return result, float(sum(storages.values()))


def time_stage(model: ModelSpec, layers: range, *, micro_batch_size: int, seq_len: int, dtype: str,
               device: str, warmup: int, repeats: int, seed: int = 0) -> StageTiming:
    """Time F, I, W and B of the stage holding ``layers`` (model order indices)."""
    torch_device = torch.device(device)
    kind = torch_dtype(dtype)
    module = build_stage(model, layers, seed=seed, dtype=kind, device=torch_device)
    first = layers.start == 0
    last = layers.stop == model.num_cost_layers
    batch = make_batch(model, microbatches=1, micro_batch_size=micro_batch_size, seq_len=seq_len,
                       seed=seed, device=torch_device)
    targets = batch.targets[0] if last else None
    hidden = (micro_batch_size, seq_len, model.hidden_size)
    generator = torch.Generator(device=torch_device).manual_seed(seed)
    x_data = batch.tokens[0] if first else torch.randn(hidden, generator=generator, device=torch_device).to(kind)
    grad = None if last else torch.randn(hidden, generator=generator, device=torch_device).to(kind)
    now = _clock(torch_device)
    samples: dict[str, list[float]] = {"F": [], "I": [], "W": [], "B": []}

    def stage_input() -> torch.Tensor:
        return x_data if first else x_data.detach().clone().requires_grad_(True)

    def timed(name: str, call: Callable[[], object], record: bool) -> object:
        begun = now()
        result = call()
        if record:
            samples[name].append((now() - begun) * 1e-9)
        return result

    # sizes, from one untimed forward
    with torch.no_grad():
        output = module(stage_input())
    output_bytes = 0.0 if last else float(output.numel() * output.element_size())
    _, activation = _saved_bytes(module, lambda: forward(module, stage_input(), targets=targets, loss_scale=1.0))
    for repeat in range(warmup + repeats):
        record = repeat >= warmup
        module.zero_grad(set_to_none=True)
        # split backward: F, I, W
        x = stage_input()
        state = timed("F", lambda x=x: forward(module, x, targets=targets, loss_scale=1.0), record)
        timed("I", lambda state=state: backward_input(module, state, grad, first=first), record)
        timed("W", lambda state=state: backward_weight(module, state, first=first), record)
        # full backward: F again (untimed), then B
        state = forward(module, stage_input(), targets=targets, loss_scale=1.0)
        timed("B", lambda state=state: backward_full(state, grad), record)
    return StageTiming(
        forward=statistics.median(samples["F"]),
        backward_input=statistics.median(samples["I"]),
        backward_weight=statistics.median(samples["W"]),
        backward=statistics.median(samples["B"]),
        activation_bytes=activation,
        output_bytes=output_bytes,
        params=sum(p.numel() for p in module.parameters()),
    )


def time_ranges(task: ProfileTask) -> list[StageTiming]:
    """Time every run of layers of the task, in order."""
    options = task.options
    device = "cuda:0" if options.device == "cuda" else "cpu"
    return [
        time_stage(task.model, range(start, stop), micro_batch_size=options.micro_batch_size,
                   seq_len=options.seq_len, dtype=options.dtype, device=device, warmup=options.warmup,
                   repeats=options.repeats, seed=options.seed)
        for start, stop in task.ranges
    ]
