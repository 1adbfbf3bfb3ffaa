"""Make the shipped example trace, ``src/pipesched/data/traces/example.csv``:

    python benchmarks/make_example_trace.py [OUTPUT]

500 requests arriving as a Poisson process at 2 requests per second, with conversation-like
lengths: lognormal prompts of median 1,020 tokens and outputs of median 129 tokens (the
medians of the public Splitwise conversation trace), each request cut to fit a 4,096-token
context. Seed 0: the same file every time (``tests/test_serving_trace.py`` checks that the
shipped file is this script's output).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipesched.serving.trace import TraceSpec, synthetic_trace, write_trace

EXAMPLE = TraceSpec(requests=500, qps=2.0, arrival="poisson", prompt="lognormal:1020,0.9",
                    output="lognormal:129,0.9", seed=0, max_context=4096)
SHIPPED = Path(__file__).resolve().parent.parent / "src" / "pipesched" / "data" / "traces" / "example.csv"


def main(argv: list[str]) -> None:
    write_trace(synthetic_trace(EXAMPLE), argv[0] if argv else SHIPPED)


if __name__ == "__main__":
    main(sys.argv[1:])
