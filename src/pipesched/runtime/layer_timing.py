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
from pipesched.runtime.torch_model import StageModule, build_stage, make_batch, torch_dtype

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
    # only the timing matters here: draw the weights where they will live (fast on a GPU)
    module = build_stage(model, layers, seed=seed, dtype=torch_dtype(dtype), device=torch_device, init_on_device=True)
    batch = make_batch(model, microbatches=1, micro_batch_size=micro_batch_size, seq_len=seq_len,
                       seed=seed, device=torch_device)
    timer = StageTimer(module, first=layers.start == 0, last=layers.stop == model.num_cost_layers,
                       tokens=batch.tokens[0], targets=batch.targets[0],
                       hidden_shape=(micro_batch_size, seq_len, model.hidden_size), seed=seed)
    timer.sample(warmup, record=False)
    timer.sample(repeats)
    return timer.timing()


class StageTimer:
    """Times F, I, W and B of a built stage on one microbatch, in rounds that may be spread
    over time (``sample``); ``timing`` gives the medians of every round so far.

    ``tokens`` feed a first stage and ``targets`` a last one; other inputs and output
    gradients are random. B and W add to existing weight gradients, as every backward of a
    run's step but the first does: autograd then reads and writes each gradient once more
    than when it can hand its result over (milliseconds for a large stage). The rounds
    leave the module's gradients set: zero them before using the module for anything else.
    """

    def __init__(self, module: StageModule, *, first: bool, last: bool, tokens: torch.Tensor,
                 targets: torch.Tensor, hidden_shape: tuple[int, ...], seed: int = 0) -> None:
        param = next(module.parameters())
        device, kind = param.device, param.dtype
        self.module, self.first = module, first
        self.targets = targets if last else None
        generator = torch.Generator(device=device).manual_seed(seed)
        self.x_data = tokens if first else torch.randn(hidden_shape, generator=generator, device=device).to(kind)
        self.grad = None if last else torch.randn(hidden_shape, generator=generator, device=device).to(kind)
        self.now = _clock(device)
        self.samples: dict[str, list[float]] = {"F": [], "I": [], "W": [], "B": []}
        # sizes, from untimed forwards
        with torch.no_grad():
            output = module(self._input())
        self.output_bytes = 0.0 if last else float(output.numel() * output.element_size())
        _, self.activation_bytes = _saved_bytes(module, lambda: self._forward(self._input()))

    def _input(self) -> torch.Tensor:
        return self.x_data if self.first else self.x_data.detach().clone().requires_grad_(True)

    def _forward(self, x: torch.Tensor):
        return forward(self.module, x, targets=self.targets, loss_scale=1.0)

    def _timed(self, name: str, call: Callable[[], object], record: bool) -> object:
        begun = self.now()
        result = call()
        if record:
            self.samples[name].append((self.now() - begun) * 1e-9)
        return result

    def sample(self, rounds: int, *, record: bool = True) -> None:
        """Run ``rounds`` rounds of F, I (split backward), F (untimed) and B, then the first
        F's W: W runs after other work, as zero-bubble schedules defer it."""
        module, first, grad = self.module, self.first, self.grad
        for _ in range(rounds):
            for param in module.parameters():
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
            x = self._input()
            split = self._timed("F", lambda x=x: self._forward(x), record)
            self._timed("I", lambda state=split: backward_input(module, state, grad, first=first), record)
            full = self._forward(self._input())
            self._timed("B", lambda state=full: backward_full(state, grad), record)
            self._timed("W", lambda state=split: backward_weight(module, state, first=first), record)

    def timing(self) -> StageTiming:
        return StageTiming(
            forward=statistics.median(self.samples["F"]),
            backward_input=statistics.median(self.samples["I"]),
            backward_weight=statistics.median(self.samples["W"]),
            backward=statistics.median(self.samples["B"]),
            activation_bytes=self.activation_bytes,
            output_bytes=self.output_bytes,
            params=sum(p.numel() for p in self.module.parameters()),
            repeats=tuple((kind, tuple(times)) for kind, times in self.samples.items()),
        )


def time_ranges(task: ProfileTask, *, rank: int = 0, sync: Callable[[], None] = lambda: None) -> list[StageTiming]:
    """Time every run of layers of the task, in order; ``sync`` is called before each, so
    ranks profiling together time the same layers at the same time."""
    options = task.options
    device = f"cuda:{rank}" if options.device == "cuda" else "cpu"
    timings = []
    for start, stop in task.ranges:
        sync()
        timings.append(time_stage(task.model, range(start, stop), micro_batch_size=options.micro_batch_size,
                                  seq_len=options.seq_len, dtype=options.dtype, device=device,
                                  warmup=options.warmup, repeats=options.repeats, seed=options.seed))
    return timings
