"""The proposer interface every speculative method implements (one module per method)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

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
        base_dir: directory that relative paths in speculative_config are resolved against (the engine
            directory), or None outside an engine directory.
        trust_remote_code: passed to Hugging Face loaders of extra checkpoints.
    """

    target: Any
    base_dir: Path | None = None
    trust_remote_code: bool = False


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


def resolve_weights_dir(speculative_model_dir: str | None, base_dir: Path | None, *, subdir: str, what: str) -> Path:
    """Where a method's weights are: ``speculative_model_dir`` resolved against the engine directory.

    Examples (subdir "medusa"): (None, /e) -> /e/medusa; ("h", /e) -> /e/h; ("/abs/h", /e) -> /abs/h;
    ("h", None) -> h.

    Raises:
        ValueError: ``speculative_model_dir`` is None outside an engine directory (names ``what``).
    """
    if speculative_model_dir is None:
        if base_dir is None:
            raise ValueError(f"speculative_config needs speculative_model_dir ({what})")
        return base_dir / subdir
    path = Path(speculative_model_dir)
    return path if path.is_absolute() or base_dir is None else base_dir / path


def check_config_keys(
    config: Mapping[str, Any], allowed: Collection[str], *, decoding_type: str, also: Collection[str] = (), hint: str = ""
) -> None:
    """Refuse speculative_config keys outside ``allowed``; ``decoding_type`` and ``also`` pass unlisted.

    Example: ``check_config_keys({"decoding_type": "Medusa", "tree": 1}, ("decoding_type", "medusa_choices"),
    decoding_type="Medusa")`` raises "unknown Medusa speculative_config keys ['tree']; allowed:
    ['decoding_type', 'medusa_choices']".

    Raises:
        ValueError: naming the unknown keys, the allowed ones (sorted), then ``hint``.
    """
    unknown = set(config) - set(allowed) - {"decoding_type", *also}
    if unknown:
        raise ValueError(f"unknown {decoding_type} speculative_config keys {sorted(unknown)}; allowed: {sorted(allowed)}{hint}")


def config_from_dict(cls, config, *, decoding_type: str):
    """A method's frozen-dataclass config from a speculative_config dict; ``decoding_type`` itself is
    ignored, ``max_draft_len`` is required.

    Example: ``config_from_dict(NGramConfig, {"decoding_type": "NGram", "max_draft_len": 4}, decoding_type="NGram")``.

    Raises:
        ValueError: on unknown keys (the allowed ones are listed), a missing ``max_draft_len``, or
            whatever ``cls`` itself refuses.
    """
    from dataclasses import fields

    allowed = {f.name for f in fields(cls)}
    check_config_keys(config, allowed, decoding_type=decoding_type)
    if "max_draft_len" not in config:
        raise ValueError(f"{decoding_type} speculative_config needs max_draft_len")
    return cls(**{k: v for k, v in config.items() if k in allowed})


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
