"""Triton Python-backend ``ensemble`` for the PyTorch path: the reference interface over
TensorRT-LLM's LLM API, so ``specbuild verify`` compares token ids there as on every other path.

TensorRT-LLM's own ``llmapi`` Triton model returns text only. This model loads ``tensorrt_llm.LLM``
from the plan's ``model.yaml`` (the same arguments, turned into LLM arguments with
``tensorrt_llm.llmapi.llm_utils.update_llm_args_with_extra_dict`` as that model does) and answers
with the ensemble's tensors:

- ``output_ids`` [1, 1, n]: ``RequestOutput.outputs[0].token_ids`` (with
  ``RequestOutput.prompt_token_ids`` in front when ``exclude_input_in_output`` is false);
- ``acceptance_rate``, ``total_accepted_draft_tokens``, ``total_draft_tokens`` and
  ``acceptance_source`` (:func:`acceptance`): the request's perf metrics,
  ``outputs[0].request_perf_metrics.speculative_decoding`` (``SamplingParams(return_perf_metrics=True)``),
  when they report drafts (``perf_metrics``); else derived from the iteration count
  (``derived``); else the three counts are left out (``none``), never sent as 0.

On 1.2.1's PyTorch backend the perf metrics' ``speculative_decoding`` stays zero with the default
``TorchSampler`` (NVIDIA/TensorRT-LLM PR #17082 fills it, on main after 1.2.1), so there the counts
are derived: every iteration emits its target token plus the drafts it accepted, the first (the
prefill) none, so ``accepted = tokens - decoding_iter`` and ``drafts = (decoding_iter - 1) *
max_draft_len`` (``GenerationResultBase.decoding_iter``, tensorrt_llm/executor/result.py, counted per
iteration by the samplers in tensorrt_llm/_torch/pyexecutor/sampler.py; or ``tokens /
avg_decoded_tokens_per_iter`` where a version reports that instead). The draft count assumes every
generation step drafted ``max_draft_len`` tokens, so a drafter that proposes fewer (n-gram without a
match) reads as a lower derived rate than its perf metrics would give.

``num_draft_tokens``: the LLM API fixes the draft length when the LLM is built, so a request gets
the speculative LLM (omitted, or the recipe's ``max_draft_len``) or, for ``0``, a second LLM built
from the same arguments without ``speculative_config``: the non-speculative baseline, loaded only
with ``build.baseline_engine: true`` (parameter ``baseline``). Other values are refused.

Requests are grouped by LLM and each group goes to ``LLM.generate`` as one list, which TensorRT-LLM
schedules with in-flight batching.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from specbuild.interface import acceptance_rate
from specbuild.triton_repo.models.common import as_bool, error_response, model_parameters, optional_input, per_row, required_input

SPECULATIVE, BASELINE = "speculative", "baseline"
AcceptanceSource = Literal["perf_metrics", "derived", "none"]
MODEL_YAML = "model.yaml"


@dataclass(frozen=True)
class LlmApiFrontConfig:
    """The model's parameters: the speculative LLM's ``max_draft_len`` (0: no speculation) and
    whether to load the baseline LLM."""

    max_draft_len: int
    baseline: bool = False
    end_ids: tuple[int, ...] = ()  # every end id the checkpoint declares, end_id first

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> LlmApiFrontConfig:
        end_ids = tuple(int(v) for v in params["end_ids"].split(",")) if params.get("end_ids") else ()
        return cls(max_draft_len=int(params["max_draft_len"]), baseline=as_bool(params.get("baseline", "false")), end_ids=end_ids)


def choose_llm(config: LlmApiFrontConfig, num_draft_tokens: int | None) -> str:
    """``SPECULATIVE`` or ``BASELINE`` for a request asking for ``num_draft_tokens`` (None: the
    deployment's own draft length).

    Raises:
        ValueError: 0 without a baseline LLM; any other value than 0 or ``max_draft_len``.
    """
    if num_draft_tokens is None or num_draft_tokens == config.max_draft_len:
        return SPECULATIVE
    if num_draft_tokens == 0:
        if not config.baseline:
            raise ValueError("num_draft_tokens=0 needs the non-speculative baseline LLM, which this deployment does not load "
                             "(recipe build.baseline_engine: true)")
        return BASELINE
    raise ValueError(f"the LLM API fixes the draft length when the LLM is built: send num_draft_tokens 0 or "
                     f"{config.max_draft_len} (or omit it), got {num_draft_tokens}")


def llm_arguments(model_yaml: dict[str, Any], which: str, *, baseline_loaded: bool) -> dict[str, Any]:
    """The ``model.yaml`` keys that are LLM arguments (``triton_config`` dropped) for ``which`` LLM.

    The baseline drops ``speculative_config``. With both LLMs on the same GPUs, each takes half the
    KV-cache fraction: ``kv_cache_config.free_gpu_memory_fraction`` is of the memory free when that
    LLM allocates its cache, so the first one loaded would otherwise leave no room for the second's
    weights. Example: 0.9 -> 0.45 for each (speculative loaded first).
    """
    args = copy.deepcopy({k: v for k, v in model_yaml.items() if k != "triton_config"})
    if which == BASELINE:
        args.pop("speculative_config", None)
    if baseline_loaded:
        kv = args.setdefault("kv_cache_config", {})
        kv["free_gpu_memory_fraction"] = round(kv.get("free_gpu_memory_fraction", 0.9) / 2, 4)
    return args


@dataclass(frozen=True)
class Request:
    """One client request, read from its tensors."""

    prompt: str
    max_tokens: int
    llm: str
    sampling: dict[str, Any]  # SamplingParams keyword arguments
    exclude_input_in_output: bool = True


def sampling_arguments(max_tokens: int, *, end_id: int | None = None, pad_id: int | None = None, temperature: float | None = None,
                       top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                       end_ids: tuple[int, ...] = ()) -> dict[str, Any]:
    """``tensorrt_llm.SamplingParams`` keyword arguments for a request; perf metrics always on
    (the acceptance counts come from them). ``end_id`` -1 (the client's "never stop early") is
    ``ignore_eos=True``; no temperature (or 0) is greedy. Without a client ``end_id``, every end id
    the checkpoint declares (``end_ids``): the first as ``end_id``, the others as ``stop_token_ids``
    kept in the output (``include_stop_str_in_output``) as the engine path keeps its stop words, so
    both paths stop at the same token.

    Example: ``(16, end_id=-1)`` -> ``{"max_tokens": 16, "return_perf_metrics": True, "ignore_eos": True}``;
    ``(16, end_ids=(128001, 128008, 128009))`` -> ``end_id`` 128001, ``stop_token_ids`` [128008, 128009].
    """
    kwargs: dict[str, Any] = {"max_tokens": max_tokens, "return_perf_metrics": True}
    if end_id == -1:
        kwargs["ignore_eos"] = True
    elif end_id is not None:
        kwargs["end_id"] = end_id
    elif end_ids:
        kwargs["end_id"] = end_ids[0]
        if len(end_ids) > 1:
            kwargs |= {"stop_token_ids": list(end_ids[1:]), "include_stop_str_in_output": True}
    optional = {"pad_id": pad_id, "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    return kwargs


@dataclass(frozen=True)
class Generation:
    """What one request produced: ``output_ids`` as returned (prompt included or not), the text, and
    the draft counts with where they came from (``source`` ``none``: not known, counts 0 unused)."""

    output_ids: list[int]
    text: str
    accepted_draft_tokens: int
    draft_tokens: int
    acceptance_rate: float
    source: AcceptanceSource = "perf_metrics"


@dataclass(frozen=True)
class Acceptance:
    """Draft counts of one request (tokens) and their source."""

    accepted: int
    drafted: int
    source: AcceptanceSource

    @property
    def rate(self) -> float:
        """accepted / drafted (:func:`specbuild.interface.acceptance_rate`); 0.0 without drafts, the tensor's value."""
        return acceptance_rate(self.accepted, self.drafted) or 0.0


NOT_REPORTED = Acceptance(0, 0, "none")


def _iterations(request_output: Any, num_tokens: int) -> int | None:
    """Decoding iterations of the request (the prefill's included), or ``None`` when not reported."""
    iterations = getattr(request_output, "decoding_iter", None)
    if isinstance(iterations, int) and iterations > 0:
        return iterations
    per_iter = getattr(request_output, "avg_decoded_tokens_per_iter", None)
    if isinstance(per_iter, (int, float)) and per_iter > 0:
        return round(num_tokens / per_iter)
    return None


def acceptance(request_output: Any, max_draft_len: int) -> Acceptance:
    """The speculative request's draft counts: its perf metrics when they report drafts, else
    derived from its decoding iterations (see the module docstring), else :data:`NOT_REPORTED`.

    Example: 20 tokens in 8 iterations at max_draft_len 3 -> 12 accepted of 21 drafted, ``derived``.
    """
    out = request_output.outputs[0]
    metrics = getattr(out, "request_perf_metrics", None)
    spec = getattr(metrics, "speculative_decoding", None)
    if spec is not None and int(spec.total_draft_tokens) > 0:
        return Acceptance(int(spec.total_accepted_draft_tokens), int(spec.total_draft_tokens), "perf_metrics")
    num_tokens = len(out.token_ids)
    iterations = _iterations(request_output, num_tokens)
    if iterations is None or max_draft_len <= 0 or iterations > num_tokens:
        return NOT_REPORTED
    return Acceptance(num_tokens - iterations, (iterations - 1) * max_draft_len, "derived")


def generation(request_output: Any, *, exclude_input_in_output: bool, speculative: bool, max_draft_len: int = 0) -> Generation:
    """A :class:`Generation` from a ``tensorrt_llm`` ``RequestOutput`` (first sequence); the
    baseline's counts are 0 of 0 from ``perf_metrics`` (it drafts nothing)."""
    out = request_output.outputs[0]
    tokens = list(out.token_ids)
    ids = tokens if exclude_input_in_output else list(request_output.prompt_token_ids) + tokens
    counts = acceptance(request_output, max_draft_len) if speculative else Acceptance(0, 0, "perf_metrics")
    return Generation(ids, out.text, counts.accepted, counts.drafted, counts.rate, counts.source)


def run_requests(llms: dict[str, Any], sampling_params_cls: Any, requests: Sequence[Request], max_draft_len: int = 0) -> list[Generation]:
    """Each request through its LLM; requests for the same LLM go to one ``LLM.generate`` call.
    Results in request order. ``max_draft_len``: the speculative LLM's (for derived counts)."""
    results: list[Generation | None] = [None] * len(requests)
    for which, llm in llms.items():
        index = [i for i, r in enumerate(requests) if r.llm == which]
        if not index:
            continue
        outputs = llm.generate([requests[i].prompt for i in index], [sampling_params_cls(**requests[i].sampling) for i in index])
        for i, output in zip(index, outputs):
            results[i] = generation(output, exclude_input_in_output=requests[i].exclude_input_in_output, speculative=which == SPECULATIVE,
                                    max_draft_len=max_draft_len)
    return results  # type: ignore[return-value]


class TritonPythonModel:
    """Inputs: text_input, max_tokens, end_id, pad_id, num_draft_tokens, return_perf_metrics,
    exclude_input_in_output, temperature, top_k, top_p, seed; outputs: text_output, output_ids
    [1, 1, n], sequence_length [1, 1], acceptance_rate, total_accepted_draft_tokens,
    total_draft_tokens (left out when not known), acceptance_source (see the module docstring)."""

    def initialize(self, args):
        import triton_python_backend_utils as pb_utils
        import yaml
        from tensorrt_llm import LLM, SamplingParams
        from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict

        self.pb_utils = pb_utils
        self.SamplingParams = SamplingParams
        self.config = LlmApiFrontConfig.from_parameters(model_parameters(args))
        model_yaml = yaml.safe_load((Path(args["model_repository"]) / args["model_version"] / MODEL_YAML).read_text())
        which = (SPECULATIVE, BASELINE) if self.config.baseline else (SPECULATIVE,)
        self.llms = {w: LLM(**update_llm_args_with_extra_dict({}, llm_arguments(model_yaml, w, baseline_loaded=self.config.baseline)))
                     for w in which}

    def execute(self, requests):
        pb = self.pb_utils
        parsed, responses = [], [None] * len(requests)
        for i, request in enumerate(requests):
            try:
                parsed.append((i, self._parse(request)))
            except ValueError as exc:
                responses[i] = error_response(pb, f"{type(exc).__name__}: {exc}", invalid_argument=True)
        try:
            results = run_requests(self.llms, self.SamplingParams, [r for _, r in parsed], self.config.max_draft_len)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error response
            results = [exc] * len(parsed)
        for (i, _), result in zip(parsed, results):
            responses[i] = error_response(pb, f"{type(result).__name__}: {result}") if isinstance(result, Exception) else self._response(result)
        return responses

    def finalize(self):
        for llm in getattr(self, "llms", {}).values():
            llm.shutdown()

    def _scalar(self, request, name):
        value = per_row(optional_input(self.pb_utils, request, name), 1, name)
        return None if value is None else value[0]

    def _parse(self, request) -> Request:
        from specbuild.triton_repo.models.tokenization import decode_queries

        query = required_input(self.pb_utils, request, "text_input")
        if query.shape[0] != 1:
            raise ValueError("send one prompt per request (batch 1)")
        max_tokens = int(per_row(required_input(self.pb_utils, request, "max_tokens"), 1, "max_tokens")[0])
        k = self._scalar(request, "num_draft_tokens")
        llm = choose_llm(self.config, None if k is None else int(k))
        get = {name: self._scalar(request, name) for name in ("end_id", "pad_id", "temperature", "top_k", "top_p", "seed")}
        sampling = sampling_arguments(max_tokens, **{n: v for n, v in get.items() if v is not None}, end_ids=self.config.end_ids)
        exclude = self._scalar(request, "exclude_input_in_output")
        return Request(decode_queries(query)[0], max_tokens, llm, sampling, True if exclude is None else bool(exclude))

    def _response(self, gen: Generation):
        pb = self.pb_utils
        tensors = [
            pb.Tensor("text_output", np.array([[gen.text.encode("utf-8")]], dtype=object)),
            pb.Tensor("output_ids", np.array(gen.output_ids, dtype=np.int32).reshape(1, 1, -1)),
            pb.Tensor("sequence_length", np.array([[len(gen.output_ids)]], dtype=np.int32)),
            pb.Tensor("acceptance_source", np.array([[gen.source.encode()]], dtype=object)),
        ]
        if gen.source != "none":
            tensors += [
                pb.Tensor("acceptance_rate", np.array([[gen.acceptance_rate]], dtype=np.float32)),
                pb.Tensor("total_accepted_draft_tokens", np.array([[gen.accepted_draft_tokens]], dtype=np.int32)),
                pb.Tensor("total_draft_tokens", np.array([[gen.draft_tokens]], dtype=np.int32)),
            ]
        return pb.InferenceResponse(output_tensors=tensors)
