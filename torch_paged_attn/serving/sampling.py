"""Per-request sampling parameters and batched sampling on the device.

Every row of a step's logits is sampled in one batched call, whatever mix of greedy and sampled
requests the step holds. Sampling is Gumbel-max over counter-based noise:

    token = argmax_v( logits[v] / temperature + g(seed, position, v) ),   g = -log(-log(u))

with ``u`` a uniform in (0, 1) hashed from ``(seed, position, v)`` (integer mixing on the device,
no generator state). That draws from ``softmax(logits / temperature)`` restricted to the top-k /
top-p set, and the draw of a request depends on its own seed, the position it samples at and its
logits only: the same tokens whether it runs alone or among 500 others, before or after a
preemption that recomputed it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["SamplingParams", "sample"]

_MASK32 = 0xFFFFFFFF


@dataclass
class SamplingParams:
    """What one request generates.

    Args:
        max_new_tokens: tokens to generate at most (>= 1).
        temperature: 0 for greedy (the default), > 0 to sample from ``softmax(logits / T)``.
        top_k: keep the ``k`` most likely tokens (0: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches ``p`` (1: all).
        seed: the request's noise seed (any int); None draws one from the engine's generator.
        stop_token_ids: generation ends after any of these tokens (it is returned).
        ignore_eos: do not add the model's EOS tokens to ``stop_token_ids``.
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: Sequence[int] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected an int >= 1, got {self.max_new_tokens!r}")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature: expected a finite float >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k: expected an int >= 0 (0 keeps every token), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p: expected a float in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise TypeError(f"seed: expected an int or None, got {type(self.seed).__name__}")
        if isinstance(self.stop_token_ids, int):
            self.stop_token_ids = (self.stop_token_ids,)
        if not all(isinstance(t, int) for t in self.stop_token_ids):
            raise TypeError(f"stop_token_ids: expected a sequence of ints, got {self.stop_token_ids!r}")
        self.stop_token_ids = tuple(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def filtered(self) -> bool:
        return not self.greedy and (self.top_k > 0 or self.top_p < 1)


def seed32(seed: int) -> int:
    """A request seed folded to 31 bits (it travels in the engine's int32 step buffer)."""
    seed &= (1 << 64) - 1
    return (seed ^ (seed >> 31) ^ (seed >> 62)) & 0x7FFFFFFF


def _mix(x: Tensor) -> Tensor:
    """A 32-bit integer hash (two rounds of xorshift-multiply) on int64 values in [0, 2^32):
    the products stay below 2^59, so nothing overflows."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    return (x >> 16) ^ x


def gumbel_noise(seed: Tensor, position: Tensor, vocab_size: int) -> Tensor:
    """``g [B, V]`` float32 standard Gumbel noise, a pure function of ``(seed[b], position[b], v)``."""
    key = _mix((seed.to(torch.int64) & _MASK32) ^ _mix((position.to(torch.int64) + 0x9E3779B9) & _MASK32))
    vocab = _mix(torch.arange(vocab_size, device=seed.device, dtype=torch.int64) + 0x7F4A7C15)
    h = _mix(((key[:, None] ^ vocab[None, :]) + key[:, None]) & _MASK32)
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # in (0, 1), never 0 or 1
    return -torch.log(-torch.log(u))


def sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seed: Tensor,
    position: Tensor,
    *,
    any_sampled: bool,
    any_filtered: bool,
) -> Tensor:
    """Tokens ``[B]`` int64 for ``logits [B, V]``: argmax where ``temperature[b] == 0``, else a
    Gumbel-max draw (see the module docstring). ``top_k [B]`` int (0: off), ``top_p [B]`` float,
    ``seed``/``position [B]`` int. ``any_sampled``/``any_filtered`` are host-side facts of the
    step (no sampled row: argmax only; no top-k/top-p row: no sort)."""
    greedy = logits.argmax(-1)
    if not any_sampled:
        return greedy
    x = logits.float() / temperature.clamp_min(1e-6)[:, None]
    if any_filtered:
        vocab = x.shape[-1]
        ranked, order = x.sort(-1, descending=True)
        ranks = torch.arange(vocab, device=x.device)
        k = torch.where(top_k > 0, top_k, vocab).to(torch.int64)
        probs = ranked.softmax(-1)
        keep = (ranks[None, :] < k[:, None]) & ((probs.cumsum(-1) - probs) < top_p[:, None])
        x = torch.empty_like(x).scatter_(-1, order, ranked.masked_fill(~keep, -math.inf))
    sampled = (x + gumbel_noise(seed, position, x.shape[-1])).argmax(-1)
    return torch.where(temperature > 0, sampled, greedy)
