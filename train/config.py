"""The recipe's optional ``train:`` section (pydantic v2, no torch import: validating a recipe stays fast).

Example (``recipes/smollm2-eagle.yaml``)::

    speculation: {method: eagle, eagle_model: heads/smollm2-eagle, ...}
    train:
      prompts: humaneval-train      # HumanEval problems 40..163; or a .jsonl / .txt file of your own
      held_out: "humaneval:20"      # evaluation prompts; must not overlap the training prompts
      max_new_tokens: 256           # length of each target-generated response
      steps: 1500
      learning_rate: 0.0003

The trained artefact is written where the speculation section points (``eagle_model``,
``medusa_model``, ``draft_checkpoint``), with ``model_card.json`` / ``MODEL_CARD.md`` beside it.
"""

from __future__ import annotations

from typing import Literal

import re

from pydantic import ConfigDict, Field, field_validator

from specbuild.util.strict import StrictModel

HUMANEVAL_TRAIN = "humaneval-train"
MIXED_TRAIN = "mixed"  # the bundled training mix (specbuild/data/train_mix.jsonl; SOURCES.md)
HUMANEVAL_TRAIN_START = 40  # HumanEval/40 .. HumanEval/163 train; 0 .. 39 stay held out
MAGPIE_TRAIN = "magpie"  # magpie:N, N user messages the target writes itself (specbuild.train.magpie)
MAGPIE_MAX = 20_000


def magpie_count(source: str) -> int | None:
    """N of a ``magpie:N`` prompt source; None for any other source.

    Raises:
        ValueError: ``magpie`` without N, or N outside 1..:data:`MAGPIE_MAX`.
    """
    if source != MAGPIE_TRAIN and not source.startswith(f"{MAGPIE_TRAIN}:"):
        return None
    match = re.fullmatch(r"magpie:(\d+)", source)
    if match is None or not 1 <= int(match.group(1)) <= MAGPIE_MAX:
        raise ValueError(f"prompt source {source!r}: expected 'magpie:N' with N in 1..{MAGPIE_MAX} "
                         "(N user messages the target writes itself, e.g. magpie:400)")
    return int(match.group(1))


class PromptSourceWeight(StrictModel):
    """One training prompt source of a mix, with how much of it to take.

    Example: ``{source: traffic.jsonl, weight: 2}`` takes that file's prompts twice over;
    ``{source: mixed, weight: 0.25}`` takes the first quarter of the bundled mix.
    """

    source: str
    """A training prompt source, as `train.prompts` names one (`mixed`, `humaneval-train`, `magpie:N`, a .jsonl / .txt file)."""
    weight: float = Field(1.0, gt=0, le=100)
    """Share of that source taken: round(weight * its prompts), its prompts in order, cycled when weight > 1."""

    @field_validator("source")
    @classmethod
    def _known_magpie(cls, source: str) -> str:
        magpie_count(source)
        return source


class TrainConfig(StrictModel):
    """How to train the recipe's draft (self-distillation from the target).

    Attributes:
        prompts: training prompts: ``humaneval-train`` (HumanEval problems 40..163, never the first 40),
            ``mixed`` (the bundled training mix of six categories, disjoint from every evaluation set;
            ``mixed:CATEGORY`` one of them), ``magpie:N`` (N user messages the target writes itself from its
            chat template's user turn, Magpie, Xu et al. 2025: :mod:`specbuild.train.magpie`), or a
            ``.jsonl`` / ``.txt`` file relative to the recipe: objects
            with ``prompt`` or ``text`` (sent as written) or OpenAI-style ``messages`` (a chat log, rendered
            with the target's chat template, a final assistant turn dropped); or a list of these, each
            optionally ``{source, weight}`` (:class:`PromptSourceWeight`). Bundled user messages (``mixed``,
            ``chat``, ``summarize``, ``specbench:...``) go inside the chat template as verify and bench send them.
        held_out: prompts for the held-out acceptance measurement (``humaneval:N`` with N <= 40, or a
            file); a prompt also in ``prompts`` is an error.
        max_prompts: use only the first N training prompts (None: all).
        max_new_tokens: tokens the target generates per response.
        samples_per_prompt: responses per training prompt: the first greedy, the others sampled at
            ``temperature`` (seeded by ``seed``), so a small prompt set still gives varied data in the
            target's own distribution (default 1: greedy only).
        temperature: sampling temperature of the extra responses.
        texts: extra training text, teacher-forced (the target generates nothing there; its features and
            argmax labels are recorded on the text, as EAGLE trains on fixed ShareGPT text): ``python-stdlib``
            (the running Python's standard-library sources, PSF licence), ``python-docs`` (English prose:
            the running Python's pydoc topics, PSF licence) or a ``.jsonl`` (objects with
            ``text``) / ``.txt`` (the whole file) path relative to the recipe. None: only generated data.
            Medusa skips these sequences (its labels must be the target's own tokens).
        text_tokens: how many tokens to take from ``texts`` (files in a seeded order, cut in
            ``text_chunk_tokens`` pieces).
        generation_batch_size: prompts per batched ``generate()`` call.
        steps: optimizer steps. batch_tokens: tokens per step (sequences packed, block-diagonal mask).
        learning_rate / warmup_steps / weight_decay / grad_clip: AdamW with linear warm-up and cosine decay.
        seed: seeds initialisation, batch order and feature noise; the same seed gives the same weights.
        checkpoint_every: save a resumable checkpoint every N steps (and at the end).
        device: ``auto`` -> CUDA when available, else CPU.
        num_layers: EAGLE decoder layers (default 1); Medusa residual blocks per head (default 1);
            draft model: target layers kept (default 4).
        feature_noise: EAGLE input-feature noise, uniform in ``±feature_noise * std(features)`` (EAGLE §4.3).
        token_loss_weight: EAGLE classification-loss weight (the paper's w_cls = 0.1).
        loss_decay: weight ``loss_decay ** k`` of Medusa head ``k`` (Medusa §2.2.1 uses 0.8) and of EAGLE-3's
            ``k``-th training-time-test step.
        ttt_steps: EAGLE-3 training-time-test depth: the head is unrolled on its own outputs this many
            steps (EAGLE-3 §3.2).
        distill_temperature: draft model KL temperature.
        token_map_size: write the recipe's ``speculation.speculative_token_map`` when it is missing: the
            ``token_map_size`` tokens the target predicts most often in the training data (its argmax at
            every position), most frequent first (FR-Spec, Zhao et al. 2025). Not part of the training
            fingerprint: changing it rewrites the map, not the draft. None: write none.
        soft_labels: EAGLE-3 only: the loss of each training-time-test step is the cross-entropy against
            the target's softmax over the draft vocabulary (the target's logits recomputed from the stored
            final hidden states), at positions whose target argmax is in that vocabulary, as EAGLE-3's reference
            trainer (SafeAILab/EAGLE ``eagle/traineagle3/cnets.py``) and SpecForge train; False: against the argmax only.
        draft_vocab_size: EAGLE-3 only: the head drafts over a reduced vocabulary of this many target tokens,
            those the target predicts most often in the training data (ranked as ``token_map_size``), with
            an ``lm_head`` of its own ``[draft_vocab_size, hidden]`` (started from the target's rows) and
            ``d2t`` / ``t2d`` mapping draft ids to target ids (:func:`specbuild.methods.eagle3.train.draft_vocabulary`).
            Lossless either way: the target verifies every draft. None: the target's lm_head, no ``d2t``.
        eval_prompts / eval_max_tokens / eval_draft_len: held-out acceptance measurement size.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    prompts: str | list[str | PromptSourceWeight] = Field(HUMANEVAL_TRAIN, min_length=1)
    """Training prompts: `humaneval-train` (HumanEval 40..163), `mixed[:CATEGORY]` (the bundled six-category mix), `magpie:N` (N user messages the target writes itself), or a .jsonl (`prompt` / `text`, or OpenAI `messages` chat logs, rendered with the target's chat template) / .txt file relative to the recipe; or a list of these, each optionally `{source, weight}`."""
    @property
    def prompt_sources(self) -> list[PromptSourceWeight]:
        """``prompts`` as a list of weighted sources (a single name: weight 1)."""
        items = [self.prompts] if isinstance(self.prompts, str) else self.prompts
        return [PromptSourceWeight(source=i) if isinstance(i, str) else i for i in items]

    @field_validator("prompts")
    @classmethod
    def _known_magpie_names(cls, prompts):
        for item in [prompts] if isinstance(prompts, str) else prompts:
            if isinstance(item, str):
                magpie_count(item)
        return prompts

    @property
    def prompts_label(self) -> str:
        """``prompts`` in one line for messages and model cards, e.g. ``"mixed + traffic.jsonl x2"``."""
        return " + ".join(s.source + ("" if s.weight == 1 else f" x{s.weight:g}") for s in self.prompt_sources)

    held_out: str = "humaneval:20"
    """Prompts for the held-out acceptance measurement (`humaneval:N`, N <= 40, or a file); none may be a training prompt."""
    max_prompts: int | None = Field(None, ge=1)
    """Use only the first N training prompts; null: all."""
    max_new_tokens: int = Field(256, ge=1, le=8192)
    """Tokens the target generates per training response."""
    samples_per_prompt: int = Field(1, ge=1, le=64)
    """Responses per training prompt: the first greedy, the others sampled at `temperature`."""
    temperature: float = Field(0.8, gt=0, le=4)
    """Sampling temperature of the extra responses."""
    texts: str | None = None
    """Extra teacher-forced text: `python-stdlib`, `python-docs` or a .jsonl / .txt path; null: generated data only (Medusa skips it)."""
    text_tokens: int = Field(100_000, ge=1)
    """Tokens taken from `texts`."""
    text_chunk_tokens: int = Field(512, ge=16, le=8192)
    """Length of the pieces `texts` is cut into."""
    generation_batch_size: int = Field(16, ge=1, le=1024)
    """Prompts per batched generate() call while making the data."""
    steps: int = Field(1000, ge=1)
    """Optimizer steps."""
    batch_tokens: int = Field(1024, ge=8)
    """Tokens per step (sequences packed, block-diagonal mask)."""
    learning_rate: float = Field(3e-4, gt=0, lt=1)
    """AdamW peak learning rate (linear warm-up, cosine decay)."""
    warmup_steps: int = Field(20, ge=0)
    """Steps of linear warm-up."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    grad_clip: float = Field(1.0, gt=0)
    """Gradient norm clip."""
    seed: int = Field(0, ge=0)
    """Seeds initialisation, batch order and noise: the same seed gives the same weights."""
    checkpoint_every: int = Field(100, ge=1)
    """Save a resumable checkpoint every N steps (and at the end)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto`: CUDA when available, else CPU."""
    num_layers: int | None = Field(None, ge=1, le=64)
    """EAGLE decoder layers (1); Medusa residual blocks per head (1); draft model: target layers kept (4). null: those defaults."""
    feature_noise: float = Field(0.05, ge=0)
    """EAGLE input-feature noise, uniform in ±feature_noise * std(features)."""
    token_loss_weight: float = Field(0.1, ge=0)
    """EAGLE classification-loss weight (the paper's w_cls)."""
    loss_decay: float = Field(0.8, gt=0, le=1)
    """Weight loss_decay**k of Medusa head k and of EAGLE-3's k-th training-time-test step."""
    ttt_steps: int = Field(3, ge=1, le=8)
    """EAGLE-3 training-time-test depth."""
    soft_labels: bool = False
    """EAGLE-3 only: cross-entropy against the target's distribution over the draft vocabulary (EAGLE-3's and SpecForge's loss) instead of its argmax."""
    distill_temperature: float = Field(1.0, gt=0)
    """Draft model: KL distillation temperature."""
    token_map_size: int | None = Field(None, ge=1)
    """Write speculation.speculative_token_map with the target's N most frequent predictions in the data; null: none."""
    draft_vocab_size: int | None = Field(None, ge=1)
    """EAGLE-3 only: train the head's own lm_head over the N tokens the target predicts most often in the data and write d2t / t2d, as public EAGLE-3 heads store them; null: the target's full vocabulary (no d2t)."""
    eval_prompts: int = Field(10, ge=0)
    """Held-out prompts for the model card's acceptance measurement."""
    eval_max_tokens: int = Field(128, ge=1)
    """Tokens per held-out prompt."""
    eval_draft_len: int = Field(4, ge=1, le=64)
    """Draft length of the held-out measurement."""
