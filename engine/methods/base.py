"""The proposer interface every speculative method implements (one module per method), and a method's engine side."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import torch

    from ..sampling import Sampler


@dataclass(frozen=True)
class Draft:
    """What a proposer proposes: draft tokens and, for a draft model, the distributions they came from.

    Attributes:
        tokens: ``k`` draft token ids.
        probs: ``[k, vocab]`` the draft distributions ``q`` the tokens were sampled from, or None for
            deterministic drafts (n-gram; any greedy proposal). Only sampled requests use it.
    """

    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None


@dataclass(frozen=True)
class MethodContext:
    """What a method may need when the engine loads it (once per engine, not per request).

    Attributes:
        target: the loaded target model (its vocabulary, dtype and device).
        trust_remote_code: passed to Hugging Face loaders of extra checkpoints.
    """

    target: Any
    trust_remote_code: bool = False


def _settings_themselves(params: Any, context: MethodContext) -> Any:
    del context
    return params


def _any_prompt(loaded: Any, input_ids: Sequence[int]) -> None:
    del loaded, input_ids


Verification = Literal["chain", "tree", "feature_tree", "feature_chain", "lookahead"]


@dataclass(frozen=True)
class EngineMethod:
    """A method's side in the reference engine: load what it needs, make each request's proposer.

    The engine validates ``speculative_config`` with the method's settings model
    (:meth:`specbuild.methods.SpeculationMethod.parse_speculative_config`), then calls ``load`` once
    (it returns what ``make_proposer`` and ``check_prompt`` take: the settings themselves, or e.g. a
    loaded draft model), ``check_prompt`` before a speculative request (raises InvalidRequestError),
    and ``make_proposer`` per request.

    Attributes:
        verification: ``"chain"``: the proposer is a :class:`Proposer` (k tokens in a row, verified by
            token matching or speculative sampling); ``"tree"``: a
            :class:`~specbuild.engine.medusa_decode.TreeProposer` filling a token tree from the target's
            hidden state, verified in one pass with a tree attention mask; ``"feature_tree"``: a
            :class:`~specbuild.engine.eagle_decode.FeatureTreeProposer` (EAGLE) fed with the target's
            features of every accepted position, verified like ``"tree"``; ``"feature_chain"``: an
            :class:`~specbuild.engine.methods.eagle3.Eagle3Proposer` (EAGLE-3) drafting a chain from features
            it captures from several target layers; ``"lookahead"``: no proposer, the loaded config
            resolves each request's ``(w, n, g)``. :meth:`ReferenceEngine._drafter
            <specbuild.engine.runtime.ReferenceEngine>` wraps each kind in its
            :class:`~specbuild.engine.drafters.Drafter`.
        greedy_only: sampled requests (``temperature > 0``) are refused, as TensorRT-LLM refuses them.
    """

    make_proposer: Callable[[Any], Any]
    verification: Verification
    load: Callable[[Any, MethodContext], Any] = _settings_themselves
    check_prompt: Callable[[Any, Sequence[int]], None] = _any_prompt
    greedy_only: bool = False


class Proposer(Protocol):
    """Proposes draft tokens for one request; the engine verifies them with the target.

    The engine makes a new proposer per request, so a proposer may keep per-request state (a draft
    model's KV cache, a lookahead pool) and drop it with the request.
    """

    def propose(
        self, context: Sequence[int], num_draft_tokens: int, sampler: Sampler | None = None
    ) -> list[int] | Draft:
        """Return at most ``num_draft_tokens`` draft tokens to follow ``context`` (prompt + emitted tokens).

        An empty draft means "no guess": the engine then runs a plain one-token step. ``sampler`` is the
        request's sampler for sampled requests; the engine leaves it out for greedy ones, so a greedy
        proposer may take just ``(context, num_draft_tokens)``. A proposer that samples its drafts
        returns a :class:`Draft` with their ``[k, vocab]`` distributions.
        """
        ...

    def update(self, context: Sequence[int], num_accepted: int) -> None:
        """Called after each verification with the new context and how many draft tokens were accepted."""
        ...


def as_draft(proposal: list[int] | Draft) -> Draft:
    """A proposer's return value as a :class:`Draft` (a plain list is a deterministic draft)."""
    return proposal if isinstance(proposal, Draft) else Draft(list(proposal))


class DraftProjection:
    """A draft-side vocabulary projection ``x @ W^T + b`` of an ``nn.Linear`` ``[vocab, hidden]``, fast on CPU.

    Drafting projects one to a few rows per step (EAGLE's tree nodes of one depth, each Medusa head's
    last hidden state). On CPU PyTorch's GEMM for so few rows against a ``[vocab, hidden]`` weight is
    several times slower than against the same weight stored transposed (SmolLM2's 49152 x 576
    lm_head, 2 threads: one row 9.5 ms vs 4.7 ms, three rows 34 ms vs under 10 ms), so on CPU this
    keeps a transposed copy (one more weight's memory). On other devices it calls the layer itself.

    Only drafts are projected this way: the target's own logits always come from the model's forward,
    so verification, and greedy equality with plain decoding, never depend on this kernel choice. The
    copy is taken once: build it from weights that no longer change (an engine's loaded model).

    Args:
        linear: the projection (``weight [vocab, hidden]``, optional ``bias [vocab]``).

    Call with ``x [..., hidden]``; returns ``[..., vocab]`` logits in the weight's dtype.
    """

    def __init__(self, linear: Any) -> None:
        weight = linear.weight.detach()
        self.linear = linear
        self.bias = None if getattr(linear, "bias", None) is None else linear.bias.detach()
        self.weight_t = weight.t().contiguous() if weight.device.type == "cpu" else None

    def __call__(self, x: Any) -> Any:
        if self.weight_t is None:
            return self.linear(x.to(self.linear.weight.dtype))
        logits = x.to(self.weight_t.dtype) @ self.weight_t
        return logits if self.bias is None else logits + self.bias
