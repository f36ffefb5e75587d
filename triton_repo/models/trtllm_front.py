"""Triton Python-backend ``ensemble`` for TensorRT-LLM repositories: the reference interface
(``num_draft_tokens`` included) in front of the ``tensorrtllm`` engine models.

The C++ ``tensorrtllm`` backend has no ``num_draft_tokens`` input, so a static ensemble cannot give
the client its per-request baseline. This model (Triton BLS: it calls the engine models with
``pb_utils.InferenceRequest``) routes each request (:func:`route`):

==================  =============================  ==========================================
method              num_draft_tokens = 0           otherwise (None: the engine's budget)
==================  =============================  ==========================================
draft_target        tensorrt_llm, no drafts        draft -> target loop (:func:`draft_loop_generate`)
ngram               tensorrt_llm, no drafts        the same loop, prompt-lookup drafts
lookahead           tensorrt_llm, (w, n, g)=(1,1,0) tensorrt_llm, the request's or the engine's (W, N, G)
medusa / eagle      tensorrt_llm_baseline          tensorrt_llm
none                tensorrt_llm                   tensorrt_llm
==================  =============================  ==========================================

Medusa / EAGLE without ``build.baseline_engine`` have no per-request off switch: ``0`` is refused
with a message saying so. The draft -> target loop follows upstream's tensorrt_llm_bls
(lib/decode.py ``_spec_generate``): draft k = min(num_draft_tokens, remaining - 1) tokens with
``tensorrt_llm_draft``, then one ``tensorrt_llm`` call with ``draft_input_ids`` and
``request_output_len`` = k + 1, which returns the accepted draft prefix plus one target token; stop
at the length limit, at the end id, or when a step adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specbuild.interface import ENGINE, ENSEMBLE, TRTLLM, acceptance_rate
from specbuild.methods import SpeculationMethod, method_named
from specbuild.triton_repo.models.common import model_parameters, optional_input, per_row, required_input, run_each

# (new tokens) = generate(model, ids, max_new_tokens, draft_ids, extra inputs)
Generate = Callable[[str, Sequence[int], int, Sequence[int] | None, dict], "EngineResult"]


@dataclass(frozen=True)
class EngineResult:
    """One engine call: the tokens it added after ``ids``; perf metrics when it reported them."""

    tokens: list[int]
    accepted_draft_tokens: int | None = None
    draft_tokens: int | None = None


@dataclass(frozen=True)
class Route:
    """Where one request goes: ``engine`` model, whether to run the draft loop, extra inputs, and whether
    those inputs turn the engine's speculation off (the method's ``off_switch``)."""

    engine: str
    draft_loop: bool = False
    draft_len: int = 0
    extra: dict = field(default_factory=dict)
    speculation_off: bool = False


@dataclass(frozen=True)
class FrontConfig:
    """The model's parameters (config.pbtxt): method, engine budget, model names, lookahead (W, N, G)."""

    method: str
    max_draft_len: int
    target_model: str = "tensorrt_llm"
    draft_model: str | None = None
    baseline_model: str | None = None
    lookahead: tuple[int, int, int] | None = None
    decoupled: bool = False  # the engine models stream (model_transaction_policy decoupled)
    max_matching_ngram_size: int = 3  # ngram: longest context suffix looked up
    is_use_oldest: bool = True  # ngram: copy after the earliest match (else the latest)
    end_ids: tuple[int, ...] = ()  # every end id the checkpoint declares (generation_config eos_token_id), end_id first

    @property
    def spec(self) -> SpeculationMethod:
        """The registered method (:mod:`specbuild.methods`): how TensorRT-LLM runs it decides the routes."""
        return method_named(self.method)

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> FrontConfig:
        lookahead = params.get("lookahead_wng")
        return cls(
            method=params["method"], max_draft_len=int(params["max_draft_len"]),
            target_model=params.get("tensorrt_llm_model_name", "tensorrt_llm"),
            draft_model=params.get("tensorrt_llm_draft_model_name") or None,
            baseline_model=params.get("tensorrt_llm_baseline_model_name") or None,
            lookahead=tuple(int(v) for v in lookahead.split(",")) if lookahead else None,
            decoupled=params.get("decoupled", "false") == "true",
            max_matching_ngram_size=int(params.get("max_matching_ngram_size", "3")),
            is_use_oldest=params.get("is_use_oldest", "true") == "true",
            end_ids=tuple(int(v) for v in params["end_ids"].split(",")) if params.get("end_ids") else (),
        )


def stop_words_list(words: Sequence[int]) -> np.ndarray:
    """TensorRT-LLM's ``stop_words_list`` [1, 2, n] for one-token stop words: row 0 the tokens, row 1
    each word's end offset into row 0 (tensorrt_llm/runtime: ``to_word_list_format``).

    Example: ``[128008, 128009]`` -> ``[[[128008, 128009], [1, 2]]]``.
    """
    return np.array([[list(words), list(range(1, len(words) + 1))]], dtype=np.int32)


def end_inputs(end_ids: Sequence[int], client_end_id: int | None, default_end_id: int) -> tuple[tuple[int, ...], dict]:
    """(the ids that end the request, the engine inputs that stop it there).

    The client's ``end_id`` (-1: never) is the only one when sent. Otherwise every end id the
    checkpoint declares: ``end_id`` the first, the others as one-token ``stop_words_list`` entries,
    so Llama-3.1-Instruct stops on ``<|eot_id|>`` (128009) as on 128001 and 128008.
    """
    if client_end_id is not None:
        return (client_end_id,), {"end_id": client_end_id}
    first, *others = end_ids or (default_end_id,)
    extra: dict = {"end_id": first}
    if others:
        extra["stop_words_list"] = stop_words_list(others)
    return (first, *others), extra


def route(config: FrontConfig, num_draft_tokens: int | None) -> Route:
    """The engine call(s) for a request asking for ``num_draft_tokens`` (None: the engine's budget).

    Raises:
        ValueError: a negative count; a count over the engine's max_draft_len; 0 for a method
            with no per-request off switch and no baseline engine; a count other than 0 or the
            budget for a method whose draft length is fixed at build time.
    """
    k = config.max_draft_len if num_draft_tokens is None else num_draft_tokens
    if k < 0:
        raise ValueError(f"num_draft_tokens must be >= 0, got {k}")
    if k > config.max_draft_len:
        raise ValueError(f"num_draft_tokens {k} exceeds the engine's max_draft_len {config.max_draft_len}")
    trtllm = config.spec.trtllm
    if trtllm.external_drafts:
        return Route(config.target_model, draft_loop=k > 0, draft_len=k)
    if trtllm.decoding_type is None or (k == config.max_draft_len and k > 0):
        return Route(config.target_model)
    if k == 0 and trtllm.off_switch is not None:
        return Route(config.target_model, extra=dict(trtllm.off_switch), speculation_off=True)
    if k == 0 and config.baseline_model is not None:
        return Route(config.baseline_model)
    if k == 0:
        raise ValueError(f"{config.method} has no per-request off switch in TensorRT-LLM: num_draft_tokens=0 needs a "
                         "baseline engine (recipe build.baseline_engine: true)")
    raise ValueError(f"{config.method}'s draft length is fixed when the engine is built: send num_draft_tokens 0 or "
                     f"{config.max_draft_len} (or omit it)")


@dataclass
class Generation:
    """The tokens a request generated and its draft counts (None: the engine reported none)."""

    tokens: list[int]
    accepted_draft_tokens: int | None = None
    draft_tokens: int | None = None


def proposer(generate: Generate, config: FrontConfig, extra: dict) -> Callable[[list[int], int], list[int]]:
    """``propose(ids, n)`` -> up to n draft tokens: the draft engine (draft_target) or, without one, prompt
    lookup over the request's own context (ngram, :func:`specbuild.methods.ngram.find_ngram_draft`)."""
    if config.draft_model is None:
        from specbuild.methods.ngram import find_ngram_draft

        return lambda ids, n: find_ngram_draft(ids, max_ngram_size=config.max_matching_ngram_size, num_draft_tokens=n,
                                               use_oldest=config.is_use_oldest)
    return lambda ids, n: generate(config.draft_model, ids, n, None, extra).tokens[:n]


def draft_loop_generate(generate: Generate, config: FrontConfig, prompt: Sequence[int], max_tokens: int, k: int,
                        end_id: int | Sequence[int], extra: dict) -> Generation:
    """The draft -> target loop for one request (greedy or sampled as ``extra`` says).

    Example (k = 3): the proposer offers [5, 6, 7] after the context; the target accepts [5, 6] and
    adds its own 9 -> the context grows by [5, 6, 9]: 2 of 3 draft tokens accepted in one target call.
    """
    propose = proposer(generate, config, extra)
    stops = {end_id} if isinstance(end_id, int) else set(end_id)
    ids = list(prompt)
    out: list[int] = []
    accepted = drafted = 0
    while len(out) < max_tokens:
        n = min(k, max_tokens - len(out) - 1)
        draft = propose(ids, n) if n > 0 else []
        result = generate(config.target_model, ids, len(draft) + 1, draft or None, extra)
        step = result.tokens[: max_tokens - len(out)]
        if not step:
            break
        drafted += len(draft)
        if draft:  # the engine's count when it reports one, else the matching prefix
            matched = next((i for i, (d, t) in enumerate(zip(draft, step)) if d != t), min(len(draft), len(step)))
            accepted += result.accepted_draft_tokens if result.accepted_draft_tokens is not None else matched
        ids += step
        out += step
        ended = next((i for i, t in enumerate(out) if t in stops), None)
        if ended is not None:
            out = out[: ended + 1]
            break
    return Generation(out, accepted, drafted)


def generate_request(generate: Generate, config: FrontConfig, prompt: Sequence[int], max_tokens: int,
                     num_draft_tokens: int | None, end_id: int | Sequence[int], extra: dict) -> Generation:
    """One request, routed (:func:`route`); ``extra`` are inputs passed to every engine call.

    Raises:
        ValueError: see :func:`route`; a sampled request (temperature > 0) on a Medusa engine,
            which TensorRT-LLM decodes greedily only.
    """
    r = route(config, num_draft_tokens)
    if config.spec.trtllm.greedy_only and r.engine == config.target_model and (extra.get("temperature") or 0) > 0:
        raise ValueError(f"temperature={extra['temperature']!r}: {config.spec.trtllm.decoding_type} is greedy-only in TensorRT-LLM; send temperature 0 "
                         "(or num_draft_tokens=0 for the baseline engine, which samples)")
    if r.draft_loop:
        return draft_loop_generate(generate, config, prompt, max_tokens, r.draft_len, end_id, extra)
    result = generate(r.engine, prompt, max_tokens, None, {**extra, **r.extra})
    if config.spec.trtllm.external_drafts or r.engine == config.baseline_model or r.speculation_off:
        return Generation(result.tokens, 0, 0)  # plain decoding: nothing drafted
    return Generation(result.tokens, result.accepted_draft_tokens, result.draft_tokens)


# Front inputs passed to the engines under TensorRT-LLM's names (front name -> engine name, the
# contract's engine_name): all but those the front decides itself (it routes num_draft_tokens, and
# always asks the engines for perf metrics and for the output without the input).
FRONT_DECIDES = ("num_draft_tokens", "return_perf_metrics", "exclude_input_in_output")
PASSTHROUGH = {t.name: t.engine_name for t in ENSEMBLE.served_by(TRTLLM).inputs if t.engine_name and t.name not in FRONT_DECIDES}


class TritonPythonModel:
    """Inputs: the reference ensemble's (text_input, max_tokens, end_id, pad_id, num_draft_tokens,
    lookahead_*, return_perf_metrics, exclude_input_in_output, temperature, top_k, top_p, seed);
    outputs: text_output, output_ids [1, n], sequence_length [1], acceptance_rate,
    total_accepted_draft_tokens, total_draft_tokens (see the module docstring)."""

    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        from specbuild.triton_repo.models.tokenization import load_tokenizer

        self.pb_utils = pb_utils
        params = model_parameters(args)
        self.config = FrontConfig.from_parameters(params)
        self.tokenizer = load_tokenizer(params["tokenizer_dir"])
        self.end_id = int(params["end_id"])
        self.pad_id = int(params["pad_id"])

    def execute(self, requests):
        return run_each(self.pb_utils, requests, self._one)

    def _scalar(self, request, name):
        value = per_row(optional_input(self.pb_utils, request, name), 1, name)
        return None if value is None else value[0]

    def _one(self, request):
        from specbuild.triton_repo.models.tokenization import decode_queries

        pb = self.pb_utils
        query = required_input(pb, request, "text_input")
        if query.shape[0] != 1:
            raise ValueError("send one prompt per request (batch 1); the draft loop runs per request")
        max_tokens = int(per_row(required_input(pb, request, "max_tokens"), 1, "max_tokens")[0])
        end_id = self._scalar(request, "end_id")
        end_id, extra = end_inputs(self.config.end_ids, None if end_id is None else int(end_id), self.end_id)
        pad_id = self._scalar(request, "pad_id")
        extra["pad_id"] = self.pad_id if pad_id is None else int(pad_id)
        for name, engine_name in PASSTHROUGH.items():
            value = self._scalar(request, name)
            if value is not None:
                extra[engine_name] = value
        num_draft_tokens = self._scalar(request, "num_draft_tokens")
        prompt = self.tokenizer(decode_queries(query)[0])["input_ids"]
        gen = generate_request(self._generate, self.config, prompt, max_tokens,
                               None if num_draft_tokens is None else int(num_draft_tokens), end_id, extra)
        exclude = self._scalar(request, "exclude_input_in_output")
        ids = gen.tokens if exclude is None or exclude else list(prompt) + gen.tokens
        text = self.tokenizer.decode(gen.tokens, skip_special_tokens=True)
        outputs = [
            pb.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=object)),
            pb.Tensor("output_ids", np.array([[ids]], dtype=np.int32).reshape(1, 1, -1)),
            pb.Tensor("sequence_length", np.array([[len(ids)]], dtype=np.int32)),
        ]
        if self._scalar(request, "return_perf_metrics") and gen.draft_tokens is not None:
            rate = acceptance_rate(gen.accepted_draft_tokens, gen.draft_tokens) or 0.0  # the tensor's 0.0: nothing drafted
            outputs += [
                pb.Tensor("acceptance_rate", np.array([[rate]], dtype=np.float32)),
                pb.Tensor("total_accepted_draft_tokens", np.array([[gen.accepted_draft_tokens]], dtype=np.int32)),
                pb.Tensor("total_draft_tokens", np.array([[gen.draft_tokens]], dtype=np.int32)),
            ]
        return pb.InferenceResponse(output_tensors=outputs)

    def _generate(self, model: str, ids: Sequence[int], max_new: int, draft: Sequence[int] | None, extra: dict) -> EngineResult:
        """One ``tensorrtllm`` call: output_ids with the input excluded, perf metrics on."""
        pb = self.pb_utils
        column = lambda v, dt=np.int32: np.array([[v]], dtype=dt)  # noqa: E731
        tensors = [
            pb.Tensor("input_ids", np.array([list(ids)], dtype=np.int32)),
            pb.Tensor("input_lengths", column(len(ids))),
            pb.Tensor("request_output_len", column(max_new)),
            pb.Tensor("exclude_input_in_output", column(True, bool)),
            pb.Tensor("return_perf_metrics", column(True, bool)),
        ]
        if draft:
            tensors.append(pb.Tensor("draft_input_ids", np.array([list(draft)], dtype=np.int32)))
        tensors += [pb.Tensor(name, value if isinstance(value, np.ndarray) else column(value, ENGINE.input(name).numpy_dtype))
                    for name, value in extra.items()]
        request = pb.InferenceRequest(
            model_name=model, inputs=tensors,
            requested_output_names=["output_ids", "sequence_length", "total_accepted_draft_tokens", "total_draft_tokens"],
        )
        # Decoupled engine models answer through a stream: without streaming, one response with the
        # tokens, then an empty one flagged final.
        responses = list(request.exec(decoupled=True)) if self.config.decoupled else [request.exec()]
        for response in responses:
            if response.has_error():
                raise RuntimeError(f"{model}: {response.error().message()}")
        response = [r for r in responses if r.output_tensors()][-1]
        get = lambda name: pb.get_output_tensor_by_name(response, name)  # noqa: E731
        length = int(get("sequence_length").as_numpy().reshape(-1)[0])
        tokens = get("output_ids").as_numpy().reshape(-1)[:length].tolist()
        accepted, total = get("total_accepted_draft_tokens"), get("total_draft_tokens")
        return EngineResult(tokens, None if accepted is None else int(accepted.as_numpy().reshape(-1)[0]),
                            None if total is None else int(total.as_numpy().reshape(-1)[0]))
