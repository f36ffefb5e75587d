"""Test-only fault injection: deliberately WRONG speculative-sampling rules, and a reference repository
whose ``tensorrt_llm`` model serves one of them.

A statistical test proves it has power only if it fails on a broken deployment. Nothing here ships:
:func:`faulty_repository` copies a reference repository and replaces its ``tensorrt_llm/1/model.py``
with a test model that wraps specbuild's (:mod:`specbuild.triton_repo.models.reference_engine`),
swaps the engine's rule (:func:`specbuild.engine.acceptance.accept_speculative`, bound in
:mod:`specbuild.engine.worker`) for a wrong one before loading, and logs a warning saying so.
Greedy requests are not affected (they use token matching).

    accept_always   every draft token accepted: the output follows the draft
    no_residual     min(1, p/q) acceptance, but a rejection resamples from p instead of
                    norm(max(0, p - q)) (the subtle, common bug)
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from specbuild.engine.acceptance import Acceptance

WARNING = "serving a WRONG acceptance rule (tests only)"


def accept_always(draft_tokens: Sequence[int], draft_probs, target_probs: torch.Tensor, *, sampler) -> Acceptance:
    """Wrong: accept all ``k`` drafts, bonus from ``p_k`` (``target_probs`` [k + 1, vocab])."""
    return Acceptance(list(draft_tokens), sampler.sample(target_probs[len(draft_tokens)]))


def no_residual(draft_tokens: Sequence[int], draft_probs, target_probs: torch.Tensor, *, sampler) -> Acceptance:
    """Wrong: the right acceptance test, but on rejection the bonus comes from ``p_i``, not the residual.
    ``draft_probs`` [k, vocab] or None (a deterministic draft: q = one-hot)."""
    k = len(draft_tokens)
    for i, token in enumerate(draft_tokens):
        q_x = 1.0 if draft_probs is None else draft_probs[i, token]
        if not sampler.uniform() * q_x < target_probs[i, token]:
            return Acceptance(list(draft_tokens[:i]), sampler.sample(target_probs[i]))
    return Acceptance(list(draft_tokens), sampler.sample(target_probs[k]))


WRONG_RULES: dict[str, Callable[..., Acceptance]] = {"accept_always": accept_always, "no_residual": no_residual}


def install(name: str) -> None:
    """Make the engine's workers sample with the wrong rule ``name`` (this process only).
    Raises ``ValueError`` naming the choices for an unknown name."""
    if name not in WRONG_RULES:
        raise ValueError(f"{name!r} is not a known wrong rule; choose one of {sorted(WRONG_RULES)}")
    from specbuild.engine import worker

    worker.accept_speculative = WRONG_RULES[name]


# The Python-backend stub runs model.py in the server's interpreter: it finds this module through the
# tests directory put on sys.path, and specbuild as installed.
MODEL = '''\
# Test-only (tests/fault_injection.py): specbuild's reference engine model with a WRONG sampling rule.
import sys

sys.path.insert(0, {tests_dir!r})

import fault_injection
from specbuild.triton_repo.models.reference_engine import TritonPythonModel as CorrectModel


class TritonPythonModel(CorrectModel):
    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        fault_injection.install({rule!r})
        pb_utils.Logger.log_warn("{rule}: " + fault_injection.WARNING)
        super().initialize(args)
'''


def faulty_repository(repo: Path, rule: str, out: Path) -> Path:
    """A copy of the reference repository ``repo`` at ``out`` whose ``tensorrt_llm`` serves the wrong
    rule ``rule``. Raises ``ValueError`` for an unknown rule."""
    if rule not in WRONG_RULES:
        raise ValueError(f"{rule!r} is not a known wrong rule; choose one of {sorted(WRONG_RULES)}")
    shutil.copytree(repo, out)
    model = out / "tensorrt_llm" / "1" / "model.py"
    model.write_text(MODEL.format(tests_dir=str(Path(__file__).parent.resolve()), rule=rule))
    return out
