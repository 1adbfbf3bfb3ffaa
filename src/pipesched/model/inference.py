"""What one serving iteration costs on one pipeline stage: the record the serving engine reads.

An iteration batches prefill chunks (a chunk of a prompt, over the context already cached
before it) and decode steps (one new token of a running request, reading its whole KV
cache). Its time on a stage, per device of the stage's tensor-parallel group::

    time = base_s
         + token_s[T]                     GEMMs, norms, tensor-parallel all-reduces at T tokens
         + prefill_attention_s x A        A = sum over chunks of chunk x (context + chunk)
         + decode_request_s x D           D decode requests (per-sequence fixed work)
         + kv_token_s x K                 K = KV tokens the decodes read (their contexts)
         + sample_s[n]                    last stage: LM head and sampling of n sequences

with T = prefill chunk tokens + D. ``send_s[T]`` is the hidden state of T tokens sent to the
next stage (zeros on the last stage). The kernel model fills ``token_s`` from the GEMM
shapes at each token count (decode sizes are memory-bound: the weights are read once per
iteration); a fitted latency model (DistServe's form, ``--latency-model``) fills it as a line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.errors import require


@dataclass(frozen=True, eq=False)
class StageIterationCosts:
    """One stage's iteration time as a function of its batch (module docstring), its memory
    per device and the model FLOPs it does (for MFU)."""

    stage: int
    layers: tuple[int, int]  # the model's layer positions [first, end) on this stage (embedding = 0)
    base_s: float  # seconds of every iteration, whatever it holds
    token_s: np.ndarray  # float64 [max_tokens + 1]: seconds at T tokens (token_s[0] = 0)
    prefill_attention_s: float  # seconds per unit of chunk x (context + chunk)
    decode_request_s: float  # seconds per decode request
    kv_token_s: float  # seconds per KV token a decode reads
    sample_s: np.ndarray  # float64 [max_batch + 1]: LM head and sampling of n sequences (zeros but the last stage)
    send_s: np.ndarray  # float64 [max_tokens + 1]: hidden state of T tokens to the next stage (zeros on the last)
    weight_bytes: float  # parameters held per device
    kv_bytes_per_token: float  # KV cache of one token over this stage's layers, per device
    workspace_bytes: float  # activation workspace per device at the largest iteration
    flops_per_token: float  # model FLOPs per token of the stage's GEMMs, all its devices together
    flops_per_attention: float  # model FLOPs per unit of A (prefill) and per KV token read (decode)

    def __post_init__(self) -> None:
        for name in ("token_s", "sample_s", "send_s"):
            values = np.ascontiguousarray(getattr(self, name), np.float64)
            require(values.ndim == 1 and values.size >= 1 and bool(np.isfinite(values).all()) and values.min() >= 0,
                    name, "an array", "give finite seconds >= 0 per count, from 0")
            object.__setattr__(self, name, values)

    @property
    def max_tokens(self) -> int:
        return int(self.token_s.shape[0]) - 1

    @property
    def max_batch(self) -> int:
        return int(self.sample_s.shape[0]) - 1

    def time(self, tokens: int, attention: float, decodes: int, kv_tokens: float, sampled: int) -> float:
        """Seconds of one iteration of ``tokens`` tokens (module docstring)."""
        return iteration_seconds(self.base_s, float(self.token_s[tokens]), self.prefill_attention_s, attention,
                                 self.decode_request_s, decodes, self.kv_token_s, kv_tokens,
                                 float(self.sample_s[sampled]))

    def flops(self, tokens: int, attention: float, kv_tokens: float) -> float:
        """Model FLOPs of one iteration on this stage (all its devices)."""
        return iteration_flops(self.flops_per_token, tokens, self.flops_per_attention, attention, kv_tokens)


def iteration_seconds(base_s, token_s, prefill_attention_s, attention, decode_request_s, decodes, kv_token_s,
                      kv_tokens, sample_s):
    """The iteration time of the module docstring from a stage's terms, ``token_s`` and
    ``sample_s`` already read at the batch's T and n: plain arithmetic, so the serving
    engine compiles this one statement of it."""
    return (base_s + token_s + prefill_attention_s * attention + decode_request_s * decodes
            + kv_token_s * kv_tokens + sample_s)


def iteration_flops(flops_per_token, tokens, flops_per_attention, attention, kv_tokens):
    """Model FLOPs of an iteration on a stage: its GEMMs at T tokens, its attention (plain
    arithmetic, compiled by the serving engine)."""
    return flops_per_token * tokens + flops_per_attention * (attention + kv_tokens)


@dataclass(frozen=True)
class LatencyRow:
    """One stage's fitted latency model (``--latency-model FILE``, CSV ``stage,base_s,
    prefill_token_s,prefill_attention_s,decode_request_s,kv_token_s``; DistServe's form): an
    iteration takes ``base_s + prefill_token_s x prefill tokens + prefill_attention_s x sum
    of chunk x (context + chunk) + decode_request_s x decode requests + kv_token_s x KV
    tokens the decodes read`` on that stage."""

    stage: int
    base_s: float
    prefill_token_s: float
    prefill_attention_s: float
    decode_request_s: float
    kv_token_s: float
