"""Every default of pipesched's commands, in one place (the README's "Defaults" lists them).

The analytical commands (show, simulate, compare, costs, partition, search, synthesize)
start from one scenario: Llama-3-70B on 4 nodes of 8 H100 (NVLink inside a node,
400 Gb/s InfiniBand per GPU across nodes), a pipeline of p = 8 devices with tensor
parallelism 4 (sequence parallel, selective recompute), m = 32 microbatches of one
4096-token sequence, bf16. Real runs (run, check, profile) execute a model on this
machine's CPU ranks or GPUs: they start from the ``tiny`` model with 64-token sequences in
float32 on p = 2 ranks with m = 8 microbatches, sizes a laptop runs in seconds. Serving
(``serve``) starts from Llama-3-70B on one node of 8 H100 as one replica of tensor
parallelism 4 and 2 pipeline stages, Sarathi-Serve's scheduler with a 512-token chunk,
and a synthetic Poisson trace (the ``serve_`` rows); its real runs (``serve run``, ``serve
check``) from the ``tiny`` model on 2 CPU ranks.
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
    context_parallel: int = 1  # ranks that split every sequence (context parallelism): a stage spans t x cp devices
    cp_comm_type: str = "p2p"  # how context-parallel ranks exchange keys and values: p2p, a2a or allgather
    expert_parallel: int = 1  # ranks the routed experts of a MoE block are split over (folded over tp x dp)
    expert_tensor_parallel: int = 0  # tensor-parallel ranks of each expert; 0 = tensor_parallel
    moe_dispatcher: str = "alltoall"  # alltoall (a copy per expert) or deepep (per rank, once per node across nodes)
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
    profile_sizes: str = "4KiB,64KiB,1MiB,4MiB"  # message sizes per rank of profile --collectives
    # serving (serve simulate, capacity, search)
    serve_model: str = "llama3-70b"  # model preset or file served
    serve_cluster: str = "1x8-h100"  # cluster preset or file of the serving deployment
    serve_tensor_parallel: int = 4  # devices of one pipeline stage
    serve_p: int = 2  # pipeline stages of one replica
    replicas: int = 1  # copies of the model serving the trace
    scheduler: str = "sarathi"  # static, orca, vllm or sarathi
    chunk: int = 512  # Sarathi-Serve's token budget per iteration
    max_batch: int = 256  # sequences one iteration batches
    max_tokens: int = 8192  # tokens one iteration batches (vLLM, Orca, static)
    block_size: int = 16  # tokens per paged KV-cache block
    kv_fraction: float = 0.9  # share of device memory the weights, workspace and KV cache may use
    preemption: str = "recompute"  # recompute or swap, when the KV cache is full
    routing: str = "round-robin"  # round-robin or least-loaded across replicas
    cpu_overhead: float = 0.002  # seconds of scheduling and launch per iteration
    requests: int = 1000  # requests of a synthetic trace
    qps: float = 2.0  # requests per second of a synthetic trace
    arrival: str = "poisson"  # poisson or gamma:CV
    prompt_tokens: str = "lognormal:1024,0.8"  # prompt lengths: fixed:N, uniform:LO-HI, lognormal:MEDIAN,SIGMA, zipf:S,MAX or trace:FILE
    output_tokens: str = "lognormal:256,0.8"  # output lengths, the same forms
    slo_ttft: float = 2.0  # seconds to the first token
    slo_tpot: float = 0.1  # seconds per output token after the first
    attainment: float = 0.9  # share of requests that meet both SLOs (serve capacity)
    serve_db: str = "pipesched-serve.sqlite"  # serving search results store, in the working folder
    resident: float = 1.0  # share of each stage's layers kept on the GPU; the rest stream in every iteration
    resident_from: str = "host"  # where the non-resident layers live: host (memory) or disk
    residency_fractions: str = "0.25,0.5,0.75,1"  # residencies serve residency simulates
    placement: str = "greedy"  # how serve pool places the models: greedy, dedicated or round-robin
    pool_parallel: str = "1x1"  # TP x PP shapes a pool's model may take when its entry names none
    # real serving runs on this machine (serve run, serve check)
    serve_run_model: str = "small"  # model preset or file of serve run and check
    serve_run_p: int = 2  # ranks (pipeline stages) of serve run and check
    serve_run_requests: int = 32  # requests of the trace a real run serves
    serve_run_qps: float = 4.0  # requests per second of the trace a real run serves
    serve_run_prompt_tokens: str = "uniform:16-128"  # prompt lengths of a real run's synthetic trace
    serve_run_output_tokens: str = "uniform:8-32"  # output lengths of a real run's synthetic trace
    # offline inference with offloading (serve offline): FlexGen's OPT-6.7B case on one T4
    offline_model: str = "opt-6.7b"  # model preset or file of serve offline
    offline_device: str = "t4"  # device preset of serve offline, with its host memory and disk
    offline_weights: str = "100,0,0"  # weights' percentages in device memory, host memory, disk
    offline_cache: str = "100,0,0"  # KV cache's percentages, the same tiers
    offline_activations: str = "100,0,0"  # hidden states' percentages, the same tiers
    offline_gpu_batch: int = 2  # sequences of one GPU batch
    offline_num_batches: int = 1  # GPU batches of the block
    offline_prompt_len: int = 512  # prompt tokens of every sequence
    offline_gen_len: int = 32  # tokens generated for every sequence


DEFAULTS = Defaults()
