"""Held-out acceptance of a trained draft, measured with the reference engine in this process.

Mean acceptance length = tokens per verification step after the prefill, bonus token included
(1.0 for plain decoding), summed over the held-out prompts before dividing (``1 + sum(accepted) /
sum(num_decoding_iterations)``, :func:`specbuild.interface.mean_acceptance_length`, the engine's
:attr:`GenerationResult.acceptance_length` pooled). The draft
is measured as a chain of ``draft_len`` tokens: EAGLE and Medusa with the tree ``[[0], [0, 0], ...]``,
draft-target with ``max_draft_len = draft_len``. With ``timing`` each prompt also runs plain decoding
right after the speculative run (interleaved, same process), giving a side-by-side speed-up.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specbuild.interface import acceptance_rate, mean_acceptance_length

if TYPE_CHECKING:
    from specbuild.methods import MethodParams


@dataclass(frozen=True)
class HeldOutAcceptance:
    """Held-out measurement; ``speed_up`` is spec tokens/s over plain tokens/s (None without timing)."""

    prompts: int
    max_tokens: int
    draft_len: int
    mean_acceptance_length: float
    acceptance_rate: float
    draft_tokens: int
    accepted_tokens: int
    identical_to_plain: bool | None = None
    speed_up: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


def speculative_config_for(spec: MethodParams, artefact: Path, draft_len: int) -> dict:
    """The engine's speculative_config measuring ``artefact`` as a chain of ``draft_len`` draft tokens, as
    the recipe's method says (its :attr:`~specbuild.methods.Training.held_out_config`).

    Raises:
        ValueError: the method has nothing to train, or ``draft_len`` does not fit it (Medusa: more
            than its heads).
    """
    training = spec.definition.training
    if training is None:
        raise ValueError(f"no held-out measurement for method {spec.method!r}")
    return training.held_out_config(spec, artefact, draft_len)


def measure_acceptance(
    target, prompts: list[list[int]], speculative_config: dict, *, max_tokens: int, end_id: int,
    timing: bool = False, progress=None, draft_weights: str = "auto",
) -> HeldOutAcceptance:
    """Run every prompt speculatively (and plainly, with ``timing``) and pool the counters.

    ``draft_weights``: as the recipe's ``build.draft_weights`` (what the served engine will stream).

    Raises:
        ValueError: the artefact does not fit the target (as the engine's loaders raise).
    """
    from specbuild.runtime import EngineLimits, ReferenceEngine
    from specbuild.engine.types import GenerationRequest

    k = speculative_config["max_draft_len"]
    limits = EngineLimits(max_batch_size=1, max_input_len=8192, max_seq_len=16384, max_draft_len=k)
    engine = ReferenceEngine(target, limits=limits, end_id=end_id, speculative_config=speculative_config, draft_weights=draft_weights)
    iterations = drafted = accepted = 0
    spec_s = plain_s = 0.0
    spec_tokens = plain_tokens = 0
    identical = True if timing else None
    for n, ids in enumerate(prompts):
        start = time.perf_counter()
        result = engine.generate(GenerationRequest(input_ids=ids, max_tokens=max_tokens))
        spec_s += time.perf_counter() - start
        spec_tokens += len(result.output_ids)
        iterations += result.num_decoding_iterations
        drafted += result.total_draft_tokens
        accepted += result.total_accepted_draft_tokens
        if timing:
            start = time.perf_counter()
            plain = engine.generate(GenerationRequest(input_ids=ids, max_tokens=max_tokens, num_draft_tokens=0))
            plain_s += time.perf_counter() - start
            plain_tokens += len(plain.output_ids)
            identical = identical and plain.output_ids == result.output_ids
        if progress is not None:
            progress(n + 1, len(prompts))
    speed_up = (spec_tokens / spec_s) / (plain_tokens / plain_s) if timing and plain_s > 0 and spec_s > 0 else None
    return HeldOutAcceptance(
        prompts=len(prompts), max_tokens=max_tokens, draft_len=k,
        mean_acceptance_length=mean_acceptance_length(accepted, iterations) or 1.0,
        acceptance_rate=acceptance_rate(accepted, drafted) or 0.0,
        draft_tokens=drafted, accepted_tokens=accepted, identical_to_plain=identical, speed_up=speed_up,
    )
