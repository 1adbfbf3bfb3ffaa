"""How close is ``serve offline``'s block schedule to FlexGen's published single-T4
throughputs, and does it order the placements as the measurements do?

Reads ``benchmarks/data/flexgen_t4.csv`` (FlexGen's Table 2 figures with the policies its
benchmark script runs; its header says where from) and runs each row's placement on the
``t4`` preset, OPT prompt 512 / output 32. Prints per row the prediction, the published
figure and the error; per model whether FlexGen's policy beats every baseline placement
(the order the table shows); and what ``--optimize`` finds for each model, with its time.
Target: within 25% of each FlexGen row, and the order right.

    python benchmarks/bench_flexgen.py
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

from pipesched.model import load_device, load_model
from pipesched.serving.offload import (
    OfflineTask,
    OffloadPolicy,
    TierShares,
    offline_run,
    offline_units,
)
from pipesched.serving.offload_search import optimize_policy

DATA = Path(__file__).parent / "data" / "flexgen_t4.csv"
TASK = OfflineTask(512, 32)
TARGET = 0.25  # the largest relative error allowed on a FlexGen row


def _rows() -> list[dict[str, str]]:
    with DATA.open(encoding="utf-8") as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def _predict(row: dict[str, str]) -> float:
    policy = OffloadPolicy(TierShares.parse("weights", row["weights"]), TierShares.parse("cache", row["cache"]),
                           TierShares.parse("activations", row["activations"]), gpu_batch=int(row["gpu_batch"]),
                           num_batches=int(row["num_batches"]), host_attention=row["host_attention"] == "true",
                           overlap=row["overlap"] == "true")
    return offline_run(load_model(row["model"]), load_device("t4"), TASK, policy).throughput_tokens_per_s


def _disk_cache_bound(row: dict[str, str]) -> None:
    """What a cache on disk costs by itself: reading the block's cache share back once per
    decode token at the disk's rate, against the time per decode token the published
    throughput leaves after the predicted prefill."""
    model, device = load_model(row["model"]), load_device("t4")
    gpu_batch, batches = int(row["gpu_batch"]), int(row["num_batches"])
    units = offline_units(model, device, TASK, gpu_batch)
    share = TierShares.parse("cache", row["cache"]).disk / 100
    cached = TASK.prompt_len + TASK.gen_len / 2  # the mean context of a decode step
    per_token = float(units.kv_bytes.sum()) * gpu_batch * batches * cached * share / device.disk_read_bandwidth
    sequences = gpu_batch * batches
    policy = OffloadPolicy(TierShares.parse("weights", row["weights"]), TierShares.parse("cache", row["cache"]),
                           TierShares.parse("activations", row["activations"]), gpu_batch=gpu_batch,
                           num_batches=batches)
    prefill = offline_run(model, device, TASK, policy).prefill_s
    allowed = (sequences * TASK.gen_len / float(row["tokens_per_s"]) - prefill) / (TASK.gen_len - 1)
    print(f"{row['model']}: its cache share on disk read back once per decode token at "
          f"{device.disk_read_bandwidth / 1e9:.3f} GB/s takes {per_token:,.0f} s; the published "
          f"{row['tokens_per_s']} tokens/s leaves {allowed:,.0f} s per decode token after the predicted prefill")


def main() -> None:
    rows = _rows()
    print(f"{'system':<26} {'model':<9} {'weights':>9} {'cache':>9} {'batch':>7} {'predicted':>10} "
          f"{'published':>10} {'error':>8}")
    predicted = {}
    for row in rows:
        value = predicted[(row["system"], row["model"])] = _predict(row)
        published = float(row["tokens_per_s"])
        error = (value - published) / published
        mark = "" if row["role"] != "target" else (" ok" if abs(error) <= TARGET else " MISS")
        print(f"{row['system']:<26} {row['model']:<9} {row['weights']:>9} {row['cache']:>9} "
              f"{row['gpu_batch'] + 'x' + row['num_batches']:>7} {value:>10.3f} {published:>10.2f} {error:>+8.1%}{mark}")
    print()
    for model in dict.fromkeys(row["model"] for row in rows):
        flexgen = predicted[("FlexGen", model)]
        others = [(row["system"], predicted[(row["system"], model)]) for row in rows
                  if row["model"] == model and row["role"] == "order"]
        right = all(flexgen > value for _, value in others)
        print(f"{model}: FlexGen's policy {flexgen:.3f} tokens/s against "
              + ", ".join(f"{name} {value:.3f}" for name, value in others) + f": order {'right' if right else 'WRONG'}")
    print()
    for row in rows:
        if row["role"] == "target" and TierShares.parse("cache", row["cache"]).disk > 0:
            _disk_cache_bound(row)
    print()
    for model in dict.fromkeys(row["model"] for row in rows):
        start = time.perf_counter()
        found = optimize_policy(load_model(model), load_device("t4"), TASK)
        seconds = time.perf_counter() - start
        policy = found.run.policy
        print(f"{model} --optimize: {found.run.throughput_tokens_per_s:.3f} tokens/s with weights {policy.weights} "
              f"(placed {found.run.weights_placed}), cache {policy.cache}, activations {policy.activations}, "
              f"{policy.gpu_batch} x {policy.num_batches}; {found.feasible:,} of {found.evaluated:,} fit; {seconds:.2f} s")


if __name__ == "__main__":
    main()
