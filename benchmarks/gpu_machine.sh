#!/usr/bin/env bash
# The ground-truth checks that need a machine with an NVIDIA GPU and 16 CPU cores, as one
# run of at most 9 minutes (each phase has its own time limit, so a slow phase never costs
# the others their results):
#
#   1. machine: torch, CUDA device, cores.
#   2. gpu-profile: per-layer F/I/W of Llama-3-70B (one block, the embedding, the head) on
#      the GPU, bf16, micro-batch 1 x 4096 tokens, written as a measured-layer model file
#      headed by how it was measured (commit it as examples/h200_llama3_70b_layers.yaml).
#   3. accuracy-p4 / accuracy-p8: the prediction check over the schedule families with 4 and
#      8 gloo ranks on the CPU cores (benchmarks/bench_accuracy.py): predicted vs measured
#      step time and the median absolute error.
#
# Run it from the repository root; results go to $OUT (default: gpu-results/). It needs
# torch, numpy, numba, pyyaml, rich and typer importable by python3; the package itself is
# taken from src/ (no install).
#
#     OUT=gpu-results bash benchmarks/gpu_machine.sh
set -uo pipefail

out=${OUT:-gpu-results}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# phase NAME SECONDS COMMAND...: run COMMAND under a time limit, its output to $out/NAME.log
phase() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit} s), started $(date -u +%H:%M:%S)"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]}, ended $(date -u +%H:%M:%S)"
}

phase machine 60 "$py" -c '
import os, torch, numpy, numba
print("torch", torch.__version__, "numpy", numpy.__version__, "numba", numba.__version__)
print("cores", len(os.sched_getaffinity(0)), "load", os.getloadavg())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, round(p.total_memory / 2**30, 1), "GiB", torch.cuda.device_count(), "device(s)")
else:
    print("gpu: none visible to torch")
'

phase gpu-profile 150 "$py" -m pipesched profile --model llama3-70b --device cuda --dtype bfloat16 \
    -b 1 -s 4096 --repeats 20 --warmup 5 --no-link -o "$out/h200_llama3_70b_layers.yaml"

# 5 measured steps after 1 warm-up, 6 profile rounds per stage, 4 families per launch (their rows
# print as each launch ends, so a phase cut short keeps what it measured)
phase accuracy-p4 150 "$py" benchmarks/bench_accuracy.py -p 4 --ms 8 --steps 5 --warmup 1 --repeats 6 --per-launch 4
phase accuracy-p8 170 "$py" benchmarks/bench_accuracy.py -p 8 --layers 14 --ms 16 --steps 5 --warmup 1 --repeats 6 --per-launch 4
