"""Test-only fault injection: serve a reference engine with a deliberately WRONG acceptance rule.

A statistical test proves it has power only if it fails on a broken deployment. Setting the
environment variable ``SPECBUILD_FAULT_ACCEPTANCE`` for ``tritonserver`` (its Python-backend
stubs inherit it) makes the ``tensorrt_llm`` model replace the engine's speculative-sampling rule
(:func:`specbuild.engine.acceptance.accept_speculative`, bound in :mod:`specbuild.engine.worker`)
with one of the wrong rules below, and log a warning. Greedy requests are not affected (they use
token matching). Unset (the default), nothing changes. Never set it on a real deployment.

    SPECBUILD_FAULT_ACCEPTANCE=accept_always   every draft token accepted: the output follows the draft
    SPECBUILD_FAULT_ACCEPTANCE=no_residual     min(1, p/q) acceptance, but a rejection resamples from p
                                                instead of norm(max(0, p - q)) (the subtle, common bug)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch

from specbuild.engine.acceptance import Acceptance

ENV_VAR = "SPECBUILD_FAULT_ACCEPTANCE"


def accept_always(draft_tokens: Sequence[int], draft_probs, target_probs: torch.Tensor, *, sampler) -> Acceptance:
    """Wrong: accept all ``k`` drafts, bonus from ``p_k`` (``target_probs`` [k + 1, vocab])."""
    return Acceptance(list(draft_tokens), sampler.sample(target_probs[len(draft_tokens)]))


def no_residual(draft_tokens: Sequence[int], draft_probs, target_probs: torch.Tensor, *, sampler) -> Acceptance:
    """Wrong: the right acceptance test, but on rejection the bonus comes from ``p_i``, not the residual."""
    k = len(draft_tokens)
    for i, token in enumerate(draft_tokens):
        q_x = 1.0 if draft_probs is None else draft_probs[i, token]
        if not sampler.uniform() * q_x < target_probs[i, token]:
            return Acceptance(list(draft_tokens[:i]), sampler.sample(target_probs[i]))
    return Acceptance(list(draft_tokens), sampler.sample(target_probs[k]))


WRONG_RULES: dict[str, Callable[..., Acceptance]] = {"accept_always": accept_always, "no_residual": no_residual}


def install_from_environment(environ: dict[str, str] | None = None) -> str | None:
    """Patch the engine's sampling rule when ``SPECBUILD_FAULT_ACCEPTANCE`` names a wrong rule.

    Returns the rule's name, or None when the variable is unset or empty.
    Raises ``ValueError`` naming the valid choices for an unknown name.
    """
    name = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    if not name:
        return None
    if name not in WRONG_RULES:
        raise ValueError(f"{ENV_VAR}={name!r} is not a known wrong rule; choose one of {sorted(WRONG_RULES)} or unset it")
    from specbuild.engine import worker as runtime

    runtime.accept_speculative = WRONG_RULES[name]
    return name
