"""A stand-in for TensorRT-LLM's LLM API (``tensorrt_llm.LLM``, ``tensorrt_llm.SamplingParams``) for
tests on machines without a GPU. Only the call shapes specbuild uses are here, with the real names:

- ``LLM(model=..., **llm_args)``, ``LLM.generate(prompts, sampling_params) -> list[RequestOutput]``,
  ``LLM.shutdown()``;
- ``SamplingParams`` (a dataclass: an unknown keyword is a TypeError, as with the real one);
- ``RequestOutput.prompt_token_ids``, ``RequestOutput.outputs[i].token_ids`` / ``.text`` /
  ``.request_perf_metrics.speculative_decoding`` (``acceptance_rate``,
  ``total_accepted_draft_tokens``, ``total_draft_tokens``), filled when ``return_perf_metrics``.

- ``RequestOutput.decoding_iter``: decoding iterations, the prefill's included (1.2.1's
  ``GenerationResultBase.decoding_iter``).

With ``TRTLLM_STANDIN_SPEC_METRICS=zero`` in the environment the speculative counts stay zero, as
1.2.1's PyTorch backend leaves them with its default sampler (NVIDIA/TensorRT-LLM PR #17082).

The "model" is the toy greedy language model of tests/trtllm_standin.py over the checkpoint's own
tokenizer; with a ``speculative_config`` it drafts ``max_draft_len`` tokens per step with a draft
that is wrong at every third position, and verifies them as TensorRT-LLM does (accepted prefix plus
one target token), so the output equals plain greedy decoding and the counts are exact.
Greedy only: a temperature above 0 raises.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))  # tests/: trtllm_standin
import trtllm_standin  # noqa: E402

__version__ = "1.2.1"


@dataclass
class SamplingParams:
    max_tokens: int = 32
    end_id: int | None = None
    pad_id: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    ignore_eos: bool = False
    return_perf_metrics: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False


@dataclass
class SpeculativeDecodingMetrics:
    acceptance_rate: float = 0.0
    total_accepted_draft_tokens: int = 0
    total_draft_tokens: int = 0


@dataclass
class RequestPerfMetrics:
    speculative_decoding: SpeculativeDecodingMetrics = field(default_factory=SpeculativeDecodingMetrics)


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    request_perf_metrics: RequestPerfMetrics | None = None


@dataclass
class RequestOutput:
    prompt: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    decoding_iter: int = 0


def _cut(tokens: list[int], stops: set[int]) -> list[int]:
    """``tokens`` up to and including the first of ``stops``."""
    end = next((i for i, t in enumerate(tokens) if t in stops), None)
    return tokens if end is None else tokens[: end + 1]


class LLM:
    def __init__(self, model: str, speculative_config=None, **kwargs):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.speculative_config = speculative_config
        self.kwargs = kwargs

    def generate(self, inputs, sampling_params=None):
        single = isinstance(inputs, str)
        prompts = [inputs] if single else list(inputs)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
        outputs = [self._one(p, s) for p, s in zip(prompts, params)]
        return outputs[0] if single else outputs

    def _one(self, prompt: str, params: SamplingParams) -> RequestOutput:
        if params.temperature:
            raise NotImplementedError("the stand-in decodes greedily only")
        ids = self.tokenizer(prompt)["input_ids"]
        end_id = -1 if params.ignore_eos else (params.end_id if params.end_id is not None else self.tokenizer.eos_token_id)
        stops = {end_id, *(params.stop_token_ids or ())} - {-1}
        if self.speculative_config is None:
            tokens = _cut(trtllm_standin.run(trtllm_standin.target_next, ids, params.max_tokens, end_id), stops)
            accepted, drafted, iterations = 0, 0, len(tokens)
        else:
            tokens, accepted, drafted, iterations = self._speculate(ids, params.max_tokens, stops, self.speculative_config.max_draft_len)
        if tokens and tokens[-1] in set(params.stop_token_ids or ()) and not params.include_stop_str_in_output:
            tokens = tokens[:-1]  # as the LLM API strips a stop word unless include_stop_str_in_output
        metrics = None
        if params.return_perf_metrics:
            if os.environ.get("TRTLLM_STANDIN_SPEC_METRICS") == "zero":
                accepted = drafted = 0
            rate = accepted / drafted if drafted else 0.0
            metrics = RequestPerfMetrics(SpeculativeDecodingMetrics(rate, accepted, drafted))
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return RequestOutput(prompt, ids, [CompletionOutput(0, text, tokens, metrics)], decoding_iter=iterations)

    @staticmethod
    def _speculate(ids: list[int], max_tokens: int, stops: set[int], k: int) -> tuple[list[int], int, int, int]:
        """The prefill's token, then steps of k drafts verified (the accepted ones that fit in
        max_tokens counted), ending at any of ``stops``: (tokens, accepted, drafted, iterations)."""
        out = trtllm_standin.run(trtllm_standin.target_next, ids, min(1, max_tokens), -1)
        accepted, drafted, iterations = 0, 0, 1
        while len(out) < max_tokens and out[-1] not in stops:
            draft = trtllm_standin.run(trtllm_standin.draft_next, ids + out, k, -1)
            step, _ = trtllm_standin.verify(ids + out, draft, len(draft) + 1, -1)
            step = _cut(step[: max_tokens - len(out)], stops)
            out += step
            accepted, drafted, iterations = accepted + len(step) - 1, drafted + k, iterations + 1
        return out, accepted, drafted, iterations

    def shutdown(self):
        pass
