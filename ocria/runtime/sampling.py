"""Sampling parameters and position-keyed sampling that makes speculative decoding lossless.

A token at sequence index ``p`` of a request with seed ``s`` is drawn by Gumbel-max with noise that
is a pure function of ``(s, p, vocab id)``: the draw at a position never depends on how many draws
happened before it, so ``spec`` (which evaluates and discards drafts) and ``ar`` emit the same
tokens, and a row's tokens never depend on the rest of the batch. Everything runs on the device
(no per-row generators, no host sync), ready for graph capture.
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ocria.errors import RequestError

MODES = ("spec", "ar")
_M1, _M2, _GOLD = 0x5851F42D4C957F2D, 0x14057B7EF767814F, 0x9E3779B97F4A7C15


def _i64(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


SEED_RANGE = (-(1 << 63), 1 << 64)  # any signed or unsigned 64-bit seed


@dataclass
class SamplingParams:
    """One request's generation settings (checked against the engine by ``check``)."""

    max_tokens: int = 256  # generated tokens at most
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept; 1 = off
    top_k: int = 0  # most likely tokens kept; 0 = off
    seed: int = 0  # any 64-bit integer, signed or unsigned (``seed64``)
    stop: tuple[str, ...] = ()  # stop strings: the output ends before the first one
    stop_token_ids: tuple[int, ...] = ()  # tokens that end the output (not returned), besides EOS
    mode: str = "spec"  # one of MODES: "spec" (speculative, needs a drafter) or "ar" (one token per step)
    ignore_eos: bool = False
    extra: dict = field(default_factory=dict)  # free-form request fields; the runtime does not read them

    def check(self, max_new_tokens: int) -> None:
        """One-line RequestError for any out-of-range field.

        Args:
            max_new_tokens: tokens that fit in the engine's max length after the prompt.
        """
        if not isinstance(self.seed, int) or not SEED_RANGE[0] <= self.seed < SEED_RANGE[1]:
            raise RequestError(f"seed must be a 64-bit integer (signed or unsigned), got {self.seed!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise RequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.max_tokens > max_new_tokens:
            raise RequestError(f"max_tokens={self.max_tokens} is beyond what fits in the engine's max length "
                               f"after this prompt ({max_new_tokens})")
        if not 0 <= self.temperature < float("inf"):
            raise RequestError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0, got {self.top_k}")
        if self.mode not in MODES:
            raise RequestError(f"mode must be one of {MODES}, got {self.mode!r}")
        if any(not s for s in self.stop):
            raise RequestError("stop strings must not be empty")

    @property
    def seed64(self) -> int:
        """The seed as the int64 the sampler hashes: an unsigned seed of 2^63 or more by two's complement, so
        every 64-bit pattern is one seed whichever way a client writes it (-1 and 2^64 - 1 draw alike)."""
        return _i64(self.seed % (1 << 64))


def _mix(x: Tensor) -> Tensor:
    """SplitMix64-style integer finaliser on int64 (wrapping arithmetic, same on CPU and CUDA)."""
    x = x ^ ((x >> 31) & 0x1FFFFFFFF)
    x = x * _i64(_M1)
    x = x ^ ((x >> 29) & 0x7FFFFFFFF)
    x = x * _i64(_M2)
    return x ^ ((x >> 32) & 0xFFFFFFFF)


def gumbel_noise(seeds: Tensor, positions: Tensor, vocab: int) -> Tensor:
    """Gumbel(0, 1) noise keyed by seed, position and vocabulary id.

    Args:
        seeds: [...] int64 seeds.
        positions: [...] int64 sequence indices, the shape of ``seeds``.
        vocab: V.

    Returns:
        [..., V] float32 noise on the seeds' device.
    """
    key = _mix(seeds.long() * _i64(_GOLD) + positions.long())
    ids = torch.arange(vocab, device=seeds.device, dtype=torch.long)
    bits = _mix(key[..., None] ^ (ids * _i64(_M2)))
    u = ((bits >> 11) & ((1 << 53) - 1)).double().add_(0.5).mul_(2.0**-53)
    return -torch.log(-torch.log(u)).float()


def filter_logits(logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor) -> Tensor:
    """Scale by temperature and mask outside top-k / top-p (per row; top_k 0 = off, top_p 1 = off).

    Args:
        logits: [..., V] logits.
        temperature: [...] float, clamped to at least 1e-6.
        top_p: [...] float in (0, 1].
        top_k: [...] long, 0 for all of V.

    Returns:
        [..., V] float32 scores, -inf outside the kept tokens (the most likely token is always kept).
    """
    scores = logits.float() / temperature.clamp_min(1e-6)[..., None]
    vocab = scores.shape[-1]
    sorted_scores, order = scores.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=scores.device)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    keep = rank < k[..., None]
    probs = torch.softmax(sorted_scores.masked_fill(~keep, float("-inf")), dim=-1)
    keep &= (probs.cumsum(-1) - probs) < top_p[..., None]
    keep[..., 0] = True
    masked = sorted_scores.masked_fill(~keep, float("-inf"))
    return torch.empty_like(scores).scatter_(-1, order, masked)


def sample(logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, seeds: Tensor,
           positions: Tensor, all_greedy: bool | None = None) -> Tensor:
    """Tokens from logits; greedy where temperature == 0, else a Gumbel-max draw keyed by (seed, position).

    Args:
        logits: [B, V] or [B, T, V].
        temperature: [B] float32 (broadcast over T).
        top_p: [B] float32.
        top_k: [B] long.
        seeds: [B] long.
        positions: [B] or [B, T] long, the sequence index of each token drawn.
        all_greedy: whether every temperature is 0, if known on the host (skips the sampling path without a
            device sync); None checks on the device.

    Returns:
        [B] or [B, T] long token ids.
    """
    while temperature.dim() < logits.dim() - 1:
        temperature, top_p, top_k, seeds = (x[..., None].expand(positions.shape)
                                             for x in (temperature, top_p, top_k, seeds))
    greedy = logits.argmax(-1)
    if all_greedy if all_greedy is not None else not bool((temperature > 0).any()):
        return greedy
    scores = filter_logits(logits, temperature, top_p, top_k)
    drawn = (scores + gumbel_noise(seeds, positions, logits.shape[-1])).argmax(-1)
    return torch.where(temperature > 0, drawn, greedy)
