"""Training settings of the model tests: one device, no recompute, no sequence parallelism,
2048-token sequences, unless a test says otherwise (the commands' defaults are a
tensor-parallel scenario: pipesched.defaults)."""

from __future__ import annotations

from pipesched.model.spec import TrainingSettings


def one_device(**fields: object) -> TrainingSettings:
    """TrainingSettings of one device without recompute or sequence parallelism, with ``fields``."""
    return TrainingSettings(**{"seq_len": 2048, "recompute": "none", "tensor_parallel": 1,
                               "sequence_parallel": False, **fields})
