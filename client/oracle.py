"""An independent oracle: the deployment's greedy output vs Hugging Face ``generate()`` on the same checkpoint.

``specbuild verify`` compares speculative with plain decoding on the *same* deployment, so a bug
shared by both paths (tokenization, the KV cache, the model port) would pass unnoticed. This
compares both server runs with transformers' own greedy ``generate()`` run here, on CPU in fp32:

    prompt ids   the checkpoint's tokenizer with add_special_tokens=True (what preprocessing does),
                 checked against the ids the server echoes with exclude_input_in_output=False
    server       greedy, num_draft_tokens=0 (plain) and the speculative default
    oracle       model.generate(do_sample=False, num_beams=1, max_new_tokens, eos = the request's end
                 token (the checkpoint's first eos when end_id is None, none when -1)), logits kept

A divergence is reported like :func:`~specbuild.client.verify.find_divergence`, with the margin
between the oracle's top-two logits there (from ``output_logits``), so a near-tie shows as such.
Needs transformers and torch (``pip install 'specbuild[engine]'``); the checkpoint is a local folder
(nothing is downloaded).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specbuild.prompts import Prompt
from specbuild.tokenizer import load_tokenizer
from .sdk import SpecClient
from .verify import Divergence, TokenDecoder, find_divergence


class OracleError(Exception):
    """The oracle cannot run: no checkpoint there, or the server tokenizes the prompt differently."""


@dataclass(frozen=True)
class OracleComparison:
    """One prompt: the oracle's ids and how each server run compares with them."""

    prompt_id: str
    oracle_ids: list[int]
    baseline_ids: list[int]
    speculative_ids: list[int]
    baseline_divergence: Divergence | None
    speculative_divergence: Divergence | None

    @property
    def match(self) -> bool:
        return self.baseline_divergence is None and self.speculative_divergence is None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.prompt_id,
            "match": self.match,
            "oracle_ids": self.oracle_ids,
            "baseline_divergence": None if self.baseline_divergence is None else self.baseline_divergence.to_json(),
            "speculative_divergence": None if self.speculative_divergence is None else self.speculative_divergence.to_json(),
        }


@dataclass(frozen=True)
class OracleReport:
    checkpoint: str
    results: list[OracleComparison]

    @property
    def num_match(self) -> int:
        return sum(r.match for r in self.results)

    @property
    def all_match(self) -> bool:
        return bool(self.results) and self.num_match == len(self.results)

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "num_prompts": len(self.results),
            "num_match": self.num_match,
            "all_match": self.all_match,
            "prompts": [r.to_json() for r in self.results],
        }

    def describe(self) -> str:
        verdict = "ORACLE AGREES" if self.all_match else "ORACLE DISAGREES"
        lines = [f"{verdict}: {self.num_match}/{len(self.results)} prompts equal Hugging Face generate() on {self.checkpoint}"]
        for r in self.results:
            for side, d in (("plain", r.baseline_divergence), ("speculative", r.speculative_divergence)):
                if d is not None:
                    margin = "" if d.logit_margin is None else f", oracle margin {d.logit_margin:.3g} (runner-up {d.runner_up_token})"
                    lines.append(f"  {r.prompt_id} {side}: @{d.position}: oracle {d.baseline_token} vs server {d.speculative_token}{margin}")
        return "\n".join(lines)


class HFOracle:
    """transformers' greedy ``generate()`` on a local checkpoint folder, fp32 CPU.

    Raises ``OracleError`` when the folder has no config.json, ``ImportError`` (with the install
    hint) without transformers/torch.
    """

    def __init__(self, checkpoint_dir: str | os.PathLike[str]) -> None:
        path = Path(checkpoint_dir)
        if not (path / "config.json").is_file():
            raise OracleError(f"{path}: not a Hugging Face checkpoint folder (no config.json); give the target's folder")
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError as e:
            raise ImportError("the Hugging Face oracle needs transformers and torch: pip install 'specbuild[engine]'") from e
        self.checkpoint = str(path)
        self._torch = torch
        self.tokenizer = load_tokenizer(self.checkpoint)
        self.model = AutoModelForCausalLM.from_pretrained(self.checkpoint, dtype=torch.float32).eval()

    def default_end_id(self) -> int | None:
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = getattr(self.model.config, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        return eos

    def prompt_ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def generate(self, prompt_ids: list[int], *, max_tokens: int, end_id: int | None) -> tuple[list[int], list[Any]]:
        """Greedy ids (at most ``max_tokens``, the end token included) and each step's ``[vocab]`` logits."""
        import copy

        torch = self._torch
        eos = self.default_end_id() if end_id is None else (None if end_id < 0 else end_id)
        config = copy.deepcopy(self.model.generation_config)
        overrides = dict(
            do_sample=False, num_beams=1, max_new_tokens=max_tokens, min_new_tokens=0, eos_token_id=eos,
            temperature=None, top_k=None, top_p=None, repetition_penalty=None,
            pad_token_id=eos if eos is not None else 0, output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
        for key, value in overrides.items():
            setattr(config, key, value)
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)  # [1, T]
        with torch.inference_mode():
            out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config)
        ids = out.sequences[0, len(prompt_ids) :].tolist()
        if eos is not None and eos in ids:
            ids = ids[: ids.index(eos) + 1]
        logits = [step[0] for step in out.logits][: len(ids)]  # each [vocab]
        return ids, logits


def compare_with_oracle(
    client: SpecClient,
    prompts: Sequence[Prompt],
    oracle: HFOracle,
    *,
    max_tokens: int,
    num_draft_tokens: int | None = None,
    end_id: int | None = None,
    decoder: TokenDecoder | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> OracleReport:
    """Compare the server's plain and speculative greedy ids with the oracle's, prompt by prompt.

    Raises ``OracleError`` when the server's prompt ids differ from the oracle tokenizer's (the
    comparison would be meaningless), and what ``SpecClient.generate`` raises.
    """
    results = []
    for done, prompt in enumerate(prompts, start=1):
        settings = dict(max_tokens=max_tokens, num_draft_tokens=num_draft_tokens, end_id=end_id, decoder=decoder)
        results.append(_compare_prompt(client, prompt, oracle, **settings))
        if progress is not None:
            progress(done, len(prompts))
    return OracleReport(checkpoint=oracle.checkpoint, results=results)


def _compare_prompt(
    client: SpecClient, prompt: Prompt, oracle: HFOracle, *, max_tokens: int, num_draft_tokens: int | None,
    end_id: int | None, decoder: TokenDecoder | None,
) -> OracleComparison:  # fmt: skip
    prompt_ids = oracle.prompt_ids(prompt.text)
    n = len(prompt_ids)
    full = {
        k: client.generate(
            prompt.text, max_tokens=max_tokens, num_draft_tokens=k, end_id=end_id, exclude_input_in_output=False
        ).output_ids
        for k in (0, num_draft_tokens)
    }
    baseline, speculative = full[0], full[num_draft_tokens]
    if baseline[:n] != prompt_ids:
        raise OracleError(
            f"prompt {prompt.id!r}: the server tokenized it as {baseline[: n + 2]}..., the oracle's tokenizer as "
            f"{prompt_ids}; point --hf-oracle at the deployment's target checkpoint"
        )
    oracle_ids, logits = oracle.generate(prompt_ids, max_tokens=max_tokens, end_id=end_id)
    return OracleComparison(
        prompt_id=prompt.id,
        oracle_ids=oracle_ids,
        baseline_ids=baseline[n:],
        speculative_ids=speculative[n:],
        baseline_divergence=_with_margin(find_divergence(oracle_ids, baseline[n:], decoder=decoder), logits),
        speculative_divergence=_with_margin(find_divergence(oracle_ids, speculative[n:], decoder=decoder), logits),
    )


def _with_margin(divergence: Divergence | None, logits: list[Any]) -> Divergence | None:
    """``divergence`` (oracle = "baseline" side) with the oracle's top-two logit margin at its position."""
    if divergence is None:
        return None
    if divergence.position >= len(logits):
        return replace(divergence, margin_note="the oracle ended before this position")
    top = logits[divergence.position].float().topk(2)
    return replace(
        divergence,
        logit_margin=float(top.values[0] - top.values[1]),
        runner_up_token=int(top.indices[1]),
    )
