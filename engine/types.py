"""Request and result types of the reference engine (no torch import: clients and Triton models use them)."""

from __future__ import annotations

from dataclasses import dataclass

from specbuild.interface import SpecDecodeMetrics

SEED_RANGE = 2**64  # TensorRT-LLM ``seed`` is UINT64


class InvalidRequestError(ValueError):
    """A request field is out of range; the message names the field, its value and the allowed values."""


@dataclass(frozen=True)
class GenerationRequest:
    """One generation request: greedy decoding by default, sampling when ``temperature > 0``.

    The sampling fields carry TensorRT-LLM's names and meanings (``temperature``, ``runtime_top_k``,
    ``runtime_top_p``, ``seed``). With sampling the target distribution is
    ``p = softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens, then to the
    smallest set whose probability reaches ``top_p``, renormalised (:func:`specbuild.engine.sampling.
    sampling_probs`).

    Attributes:
        input_ids: prompt token ids, non-empty, each in ``[0, vocab_size)``.
        max_tokens: number of new tokens to generate, ``>= 1`` (TensorRT-LLM ``request_output_len``).
        end_id: ``None`` -> the engine's default end token (tokenizer eos); ``-1`` -> never stop on a token.
        num_draft_tokens: draft tokens per verification step. ``None`` -> the engine's ``max_draft_len``;
            ``0`` -> plain (non-speculative) decoding; at most ``max_draft_len``.
        temperature: ``None`` or ``0`` -> greedy (the other sampling fields are then ignored); ``> 0`` -> sample.
        top_k: keep the ``top_k`` most likely tokens; ``None`` or ``0`` -> no top-k cut.
        top_p: keep the smallest set of tokens whose probability reaches ``top_p``, in ``(0, 1]``;
            ``None`` or ``1.0`` -> no top-p cut.
        seed: random seed in ``[0, 2**64)``; the same seed gives the same output. ``None`` -> 0
            (TensorRT-LLM's default ``seed``).
        lookahead_config: Lookahead engines only: this request's ``(w, n, g)`` (window size, n-gram
            size, verification set size; TensorRT-LLM's ``lookahead_config``) within the built
            ``(W, N, G)``; ``None`` -> ``(W, N, G)``; ``(1, 1, 0)`` -> plain decoding.
    """

    input_ids: list[int]
    max_tokens: int
    end_id: int | None = None
    num_draft_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    lookahead_config: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling parameters of one request (greedy requests have none).

    Attributes:
        temperature: ``> 0``.
        top_k: ``0`` (off) or the number of most likely tokens kept.
        top_p: in ``(0, 1]``; ``1.0`` is off.
        seed: in ``[0, 2**64)``.
    """

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


FINISH_REASONS = ("length", "stop")


@dataclass(frozen=True)
class GenerationResult:
    """Tokens generated for one request and the speculation counters (the vocabulary of
    :class:`specbuild.interface.SpecDecodeMetrics`).

    Attributes:
        output_ids: generated tokens only (no prompt). If the end token was hit it is the last token.
        finish_reason: ``"stop"`` (end token emitted) or ``"length"`` (``max_tokens`` emitted).
        total_draft_tokens: draft tokens proposed and sent to verification.
        total_accepted_draft_tokens: draft tokens the target accepted AND that were emitted, the bonus
            (target) token of each step excluded; a step cut at the end token counts its last kept
            token as the target's, so ``len(output_ids) == 1 + num_decoding_iterations + accepted``.
        num_decoding_iterations: target forward passes after the prefill (``num_spec_steps``). The
            prefill emits the first token, so ``len(output_ids) - 1`` tokens come from these passes.
    """

    output_ids: list[int]
    finish_reason: str
    total_draft_tokens: int
    total_accepted_draft_tokens: int
    num_decoding_iterations: int

    @property
    def metrics(self) -> SpecDecodeMetrics:
        """The counters as the shared vocabulary's record (steps: this engine's own count)."""
        return SpecDecodeMetrics(len(self.output_ids), self.total_draft_tokens, self.total_accepted_draft_tokens,
                                 self.num_decoding_iterations)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / draft tokens; 0.0 when no draft token was proposed (the value the
        ``acceptance_rate`` output tensor carries, as TensorRT-LLM's does)."""
        return self.metrics.acceptance_rate or 0.0

    @property
    def acceptance_length(self) -> float | None:
        """Mean tokens per verification step after the prefill, bonus token included:
        ``1 + total_accepted_draft_tokens / num_decoding_iterations`` (``mean_acceptance_length``).

        Plain decoding gives exactly 1.0. ``None`` when there was no decoding iteration
        (``max_tokens == 1`` or the prefill emitted the end token).
        """
        return self.metrics.mean_acceptance_length
