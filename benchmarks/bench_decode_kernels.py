"""How close are the kernel model's GEMM times to published per-operator measurements, at
decode sizes (1-64 tokens) and at prefill sizes (128 tokens and more)?

Reads ``benchmarks/data/decode_gemms.csv`` (Vidur's profiled fp16 GEMMs of Llama-2-7B,
CodeLlama-34B and Llama-2-70B on H100 and A100, tensor parallelism 1 and 4; its header says
where from) and prints, per device and token count, the median of the model's relative error
(predicted - measured) / measured and of its absolute value over the rows of that size, then
the median absolute error over 1-64 tokens and over 128 tokens and up, per device. Each GEMM
is timed as the layer model times it: ``matmul_time`` with the bytes of both inputs and the
output.

    python benchmarks/bench_decode_kernels.py
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

from pipesched.model import load_device
from pipesched.model.kernels import matmul_time

DATA = Path(__file__).parent / "data" / "decode_gemms.csv"
ELEMENT_BYTES = 2  # fp16


def _rows() -> list[dict[str, str]]:
    with DATA.open(encoding="utf-8") as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def _error(row: dict[str, str]) -> float:
    device = load_device(row["device"])
    m, n, k = (float(row[name]) for name in ("m", "n", "k"))
    traffic = ELEMENT_BYTES * (m * k + k * n + m * n)
    predicted = matmul_time(device, m, n, k, traffic=traffic)
    measured = float(row["measured_s"])
    return (predicted - measured) / measured


def main() -> None:
    errors: dict[tuple[str, int], list[float]] = defaultdict(list)
    for row in _rows():
        errors[(row["device"], int(row["tokens"]))].append(_error(row))
    print(f"{'device':<10} {'tokens':>6} {'rows':>5} {'median error':>13} {'median |error|':>15}")
    for (device, tokens), values in sorted(errors.items()):
        print(f"{device:<10} {tokens:>6} {len(values):>5} {statistics.median(values):>+13.1%} "
              f"{statistics.median(abs(v) for v in values):>15.1%}")
    print()
    for device in sorted({device for device, _ in errors}):
        small = [abs(v) for (d, t), values in errors.items() if d == device and t <= 64 for v in values]
        large = [abs(v) for (d, t), values in errors.items() if d == device and t >= 128 for v in values]
        print(f"{device}: median |error| at 1-64 tokens {statistics.median(small):.1%} ({len(small)} GEMMs), "
              f"at >= 128 tokens {statistics.median(large):.1%} ({len(large)} GEMMs)")


if __name__ == "__main__":
    main()
