"""Sampling: the target distribution of TensorRT-LLM's sampling parameters, and a seeded per-request sampler.

``p = softmax(logits / temperature)``, cut to the ``top_k`` most likely tokens, then to the smallest set
whose probability reaches ``top_p``, renormalised: the order of TensorRT-LLM's sampling layers and of
Hugging Face's ``TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper``.
"""

from __future__ import annotations

import torch

from .types import SamplingParams


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Row-wise sampling distribution of ``logits`` under ``params`` (fp32).

    Example: logits [2, 1, 0, -9], temperature 1, top_k 2 -> [0.73, 0.27, 0, 0];
    with top_p 0.5 instead -> [1, 0, 0, 0] (the most likely token alone reaches 0.5).

    Args:
        logits: ``[n, vocab]``.
        params: validated parameters (``temperature > 0``).

    Returns:
        ``[n, vocab]`` probabilities, each row summing to 1.
    """
    scaled = logits.float() / params.temperature  # [n, vocab]
    if 0 < params.top_k < scaled.shape[-1]:
        kth = scaled.topk(params.top_k, dim=-1).values[..., -1:]  # [n, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(dim=-1)  # [n, vocab]
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    return probs


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest most-likely prefix whose mass reaches ``top_p`` (the first token always), renormalised.

    Example: probs [0.5, 0.3, 0.2], top_p 0.6 -> keep 0.5 and 0.3 -> [0.625, 0.375, 0].
    """
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [n, vocab] each
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, mass_before >= top_p)
    kept = probs.masked_fill(drop, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


class Sampler:
    """One request's sampling: its parameters and its seeded random stream.

    Every random draw of the request (draft tokens, acceptance tests, resampling, plain steps) comes from
    ``generator`` in a fixed order, so the same seed gives the same output.
    """

    def __init__(self, params: SamplingParams, *, device: torch.device | str = "cpu") -> None:
        self.params = params
        self.generator = torch.Generator(device=device).manual_seed(params.seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``[n, vocab]`` logits -> ``[n, vocab]`` sampling distribution (see :func:`sampling_probs`)."""
        return sampling_probs(logits, self.params)

    def sample(self, probs: torch.Tensor) -> int:
        """One token drawn from ``probs`` (``[vocab]``)."""
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def uniform(self) -> torch.Tensor:
        """A scalar drawn uniformly from ``[0, 1)``."""
        return torch.rand((), generator=self.generator, device=self.generator.device)
