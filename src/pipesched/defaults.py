"""Every default of pipesched's commands, in one place (the README's "Defaults" lists them).

The analytical commands (show, simulate, compare, costs, partition, search, synthesize)
start from one scenario: Llama-3-70B on 4 nodes of 8 H100 (NVLink inside a node,
400 Gb/s InfiniBand per GPU across nodes), a pipeline of p = 8 devices with tensor
parallelism 4 (sequence parallel, selective recompute), m = 32 microbatches of one
4096-token sequence, bf16. Real runs (run, check, profile) execute a model on this
machine's CPU ranks or GPUs: they start from the ``tiny`` model with 64-token sequences in
float32 on p = 2 ranks with m = 8 microbatches, sizes a laptop runs in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Defaults:
    # the schedule
    p: int = 8  # pipeline devices
    m: int = 32  # microbatches per iteration
    # the analytical workload and machine
    model: str = "llama3-70b"  # model preset or file
    cluster: str = "4x8-h100"  # cluster preset or file
    device: str = "h100-sxm"  # device preset of commands that take one device (costs): the cluster's
    micro_batch_size: int = 1  # sequences per microbatch
    seq_len: int = 4096  # tokens per sequence
    tensor_parallel: int = 4  # pipeline device d runs on cluster rank d x t
    sequence_parallel: bool = True  # norms and dropouts split across the tensor-parallel group too
    recompute: str = "selective"  # none, selective or full
    dtype: str = "bf16"  # training dtype of the analytical costs
    partition: str = "balanced"  # layers to stages: uniform, balanced, memory, or a Megatron layout
    # Monte Carlo over durations (--jitter, --straggler, ...)
    samples: int = 1000  # iterations drawn
    seed: int = 0  # of the random streams
    # the design-space search
    global_batch: int = 32  # sequences per iteration: the default scenario's m x micro-batch size
    search_db: str = "pipesched-search.sqlite"  # results store, in the working folder
    top: int = 10  # configurations printed
    steady_iterations: int = 4  # iterations run back to back for a steady state (--steady-state, PipeDream)
    # real runs on this machine
    run_p: int = 2  # ranks (pipeline devices) of run and check
    run_m: int = 8  # microbatches per step of run and check
    run_model: str = "tiny"  # model preset or file of run, check and profile
    run_seq_len: int = 64  # tokens per sequence
    run_micro_batch_size: int = 2  # sequences per microbatch
    run_dtype: str = "float32"  # the runtime's dtype (float32, float64 or bfloat16)
    run_steps: int = 5  # measured steps of a real run (after warm-up)
    run_warmup: int = 2  # steps run first and not measured
    run_timeout: float = 600.0  # seconds a real run may take before every rank is killed


DEFAULTS = Defaults()
