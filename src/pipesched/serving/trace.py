"""A serving workload: requests, each arriving at a time with a prompt and an output length.

``Trace`` is the one record of it (columnar, one row per request, sorted by arrival). The
file format is the public Splitwise and Vidur traces' CSV, ``arrived_at,num_prefill_tokens,
num_decode_tokens``: arrival in seconds from the start, prompt tokens, output tokens (the
first output token is the prefill's; each later one is one decode iteration).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.errors import require
from pipesched.limits import MAX_REQUESTS, MAX_SECONDS, MAX_SEQ_LEN, check_count


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests in arrival order; arrays of equal length, one row each."""

    arrived_at: np.ndarray  # float64 seconds, >= 0, non-decreasing
    prefill_tokens: np.ndarray  # int64 >= 1: prompt tokens
    decode_tokens: np.ndarray  # int64 >= 1: output tokens, the first (made by the prefill) included

    def __post_init__(self) -> None:
        arrived = np.ascontiguousarray(self.arrived_at, np.float64)
        prefill = np.ascontiguousarray(self.prefill_tokens, np.int64)
        decode = np.ascontiguousarray(self.decode_tokens, np.int64)
        require(arrived.ndim == 1 and arrived.shape == prefill.shape == decode.shape, "trace",
                f"{arrived.shape}, {prefill.shape}, {decode.shape}", "give one arrival and two lengths per request")
        check_count("requests", int(arrived.shape[0]), MAX_REQUESTS, what="requests")
        bad = np.flatnonzero(~np.isfinite(arrived) | (arrived < 0) | (arrived > MAX_SECONDS))
        require(bad.size == 0, "arrived_at", arrived[bad[0]] if bad.size else "",
                f"arrivals are seconds from the start, 0 to {MAX_SECONDS:g} (request {bad[0] if bad.size else 0})")
        unsorted = np.flatnonzero(np.diff(arrived) < 0)
        require(unsorted.size == 0, "arrived_at", arrived[unsorted[0] + 1] if unsorted.size else "",
                f"sort the requests by arrival (request {unsorted[0] + 1 if unsorted.size else 0} arrives "
                "before the one above it)")
        for name, column in (("num_prefill_tokens", prefill), ("num_decode_tokens", decode)):
            bad = np.flatnonzero((column < 1) | (column > MAX_SEQ_LEN))
            require(bad.size == 0, name, column[bad[0]] if bad.size else "",
                    f"token counts are whole numbers from 1 to {MAX_SEQ_LEN:,} (request {bad[0] if bad.size else 0})")
        object.__setattr__(self, "arrived_at", arrived)
        object.__setattr__(self, "prefill_tokens", prefill)
        object.__setattr__(self, "decode_tokens", decode)

    def __len__(self) -> int:
        return int(self.arrived_at.shape[0])

    @property
    def total_tokens(self) -> np.ndarray:
        """Prompt plus output tokens of each request: its KV cache when it ends."""
        return self.prefill_tokens + self.decode_tokens
