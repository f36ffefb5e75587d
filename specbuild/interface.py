"""The deployment's interface: every tensor a specbuild deployment declares, in one place.

A deployment is a Triton model repository in TensorRT-LLM's ``inflight_batcher_llm`` layout
(NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/): clients call ``ensemble``;
inside, ``preprocessing`` tokenizes, ``tensorrt_llm`` generates and ``postprocessing`` detokenizes.
This module holds their tensors as typed specs: name, Triton data type, dims (without the batch
dimension; -1 = variable), optionality, and which deployments declare them:

==============  =============================================  ==========================================
deployment      repository                                     ``ensemble``
==============  =============================================  ==========================================
``reference``   ``triton_repo/reference_repository.py``        platform ensemble over the reference engine
``trtllm``      ``triton_repo/tensorrtllm.py`` (engine path)   Python BLS front over ``tensorrtllm`` models
``llmapi``      ``triton_repo/tensorrtllm.py`` (PyTorch path)  Python model over ``tensorrt_llm.LLM``
==============  =============================================  ==========================================

It also holds the speculation metrics vocabulary (:class:`SpecDecodeMetrics`: drafted and accepted
tokens, verification steps, acceptance rate and length, and their keys on the OpenAI side), which
every component computes acceptance from.

Everything that names a tensor derives from here: the repositories' ``config.pbtxt``, the
Python-backend models' request parsing, and the client SDK's requests (:class:`GenerateOptions`).
``tests/test_interface.py`` parses the generated configs of every deployment and fails when one of
them, or the client, drifts from this module; ``docs/interface.md`` carries :func:`markdown_table`
(regenerate it with ``python -m specbuild.interface docs/interface.md``).

Torch-free and numpy-free at import (the client imports it without the server side).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

DataType = Literal["TYPE_BOOL", "TYPE_INT32", "TYPE_INT64", "TYPE_UINT64", "TYPE_FP32", "TYPE_STRING"]
# Triton config data type -> the wire name clients use (tritonclient's InferInput datatype).
WIRE_TYPES: dict[str, str] = {
    "TYPE_BOOL": "BOOL", "TYPE_INT32": "INT32", "TYPE_INT64": "INT64", "TYPE_UINT64": "UINT64",
    "TYPE_FP32": "FP32", "TYPE_STRING": "BYTES",
}
NUMPY_TYPES: dict[str, str] = {
    "TYPE_BOOL": "bool_", "TYPE_INT32": "int32", "TYPE_INT64": "int64", "TYPE_UINT64": "uint64",
    "TYPE_FP32": "float32", "TYPE_STRING": "object_",
}

REFERENCE, TRTLLM, LLMAPI = "reference", "trtllm", "llmapi"
DEPLOYMENTS = (REFERENCE, TRTLLM, LLMAPI)
_ALL = frozenset(DEPLOYMENTS)


@dataclass(frozen=True)
class Tensor:
    """One model input or output, as ``config.pbtxt`` declares it.

    ``dims`` exclude the batch dimension; -1 is variable. ``reshape``: the shape the model sees
    instead of ``dims`` (``()``: a scalar, as TensorRT-LLM's backend declares its per-request
    scalars); ``None``: no reshape. ``allow_ragged_batch``: requests of different lengths batch
    without padding (TensorRT-LLM's ``input_ids``).

    Contract metadata (not rendered): ``served_by``, the deployments whose model declares it;
    ``engine_name``, for an ``ensemble`` tensor the ``tensorrt_llm`` tensor whose value it passes
    unchanged (``None``: it goes through preprocessing / postprocessing, or the front handles it);
    ``asked_by``, for an output the BOOL input that asks for it (``None``: always sent); ``doc``.
    """

    name: str
    data_type: DataType
    dims: tuple[int, ...]
    optional: bool = False
    allow_ragged_batch: bool = False
    reshape: tuple[int, ...] | None = None
    served_by: frozenset[str] = _ALL
    engine_name: str | None = None
    asked_by: str | None = None
    doc: str = ""

    @property
    def wire_type(self) -> str:
        """The client-side datatype name: ``"INT32"``, ``"BYTES"`` for ``TYPE_STRING``, ..."""
        return WIRE_TYPES[self.data_type]

    @property
    def numpy_dtype(self) -> Any:
        """The numpy dtype of its values (``numpy.object_`` for strings); imports numpy."""
        import numpy as np

        return getattr(np, NUMPY_TYPES[self.data_type])


@dataclass(frozen=True)
class ModelInterface:
    """The inputs and outputs of one Triton model of a deployment (``name``: the model's name)."""

    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    def served_by(self, deployment: str) -> ModelInterface:
        """Only the tensors ``deployment`` declares. Raises ``ValueError`` for an unknown deployment."""
        if deployment not in DEPLOYMENTS:
            raise ValueError(f"deployment must be one of {DEPLOYMENTS}, got {deployment!r}")
        keep = lambda tensors: tuple(t for t in tensors if deployment in t.served_by)  # noqa: E731
        return dataclasses.replace(self, inputs=keep(self.inputs), outputs=keep(self.outputs))

    def input(self, name: str) -> Tensor:
        """The input ``name``; ``KeyError`` naming the model when it has none."""
        return _named(self.inputs, name, f"{self.name} input")

    def output(self, name: str) -> Tensor:
        """The output ``name``; ``KeyError`` naming the model when it has none."""
        return _named(self.outputs, name, f"{self.name} output")

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)


def _named(tensors: tuple[Tensor, ...], name: str, what: str) -> Tensor:
    for t in tensors:
        if t.name == name:
            return t
    raise KeyError(f"no {what} {name!r} in specbuild.interface")


def _scalar(name: str, data_type: DataType, doc: str, **kw: Any) -> Tensor:
    """An optional per-request scalar: dims [1]."""
    return Tensor(name, data_type, (1,), optional=True, doc=doc, **kw)


_SPECBUILD = frozenset({REFERENCE})  # specbuild's own additions, served by the reference engine only
_ENGINE_MODEL = frozenset({REFERENCE, TRTLLM})  # the deployments with a tensorrt_llm model (the LLM API path has none)
LOOKAHEAD_INPUTS = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")  # (w, n, g)
PERF_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
MARGIN_OUTPUTS = ("logit_margin", "runner_up_ids")
# Outputs only some deployments declare and a client asks for only after reading the model's
# metadata (asking a model for an output it lacks fails the request).
PROBED_OUTPUTS = ("acceptance_source",)


# --- ensemble: what clients send and receive -----------------------------------------------------

ENSEMBLE = ModelInterface(
    name="ensemble",
    inputs=(
        Tensor("text_input", "TYPE_STRING", (1,), doc="the prompt (UTF-8)"),
        Tensor("max_tokens", "TYPE_INT32", (1,), doc="most tokens to generate"),
        _scalar("end_id", "TYPE_INT32", "stop token; -1 = never stop early; absent: the engine's"),
        _scalar("pad_id", "TYPE_INT32", "padding of output_ids; absent: the engine's"),
        _scalar("num_draft_tokens", "TYPE_INT32", "draft length of this request; 0 = plain decoding (the "
                "non-speculative baseline); absent: the built max_draft_len", engine_name="num_draft_tokens"),
        *(_scalar(name, "TYPE_INT32", f"Lookahead (w, n, g): {part}; all three or none",
                  served_by=_ENGINE_MODEL, engine_name=name)
          for name, part in zip(LOOKAHEAD_INPUTS, ("window size w", "n-gram size n", "verification set size g"))),
        _scalar("return_perf_metrics", "TYPE_BOOL", "ask for the acceptance counters", engine_name="return_perf_metrics"),
        _scalar("exclude_input_in_output", "TYPE_BOOL", "output_ids without the prompt (default true)",
                engine_name="exclude_input_in_output"),
        _scalar("return_logit_margin", "TYPE_BOOL", "specbuild: ask for logit_margin and runner_up_ids",
                served_by=_SPECBUILD, engine_name="return_logit_margin"),
        _scalar("return_generation_logits", "TYPE_BOOL", "TensorRT-LLM's own ensemble (engines built with "
                "--gather_generation_logits); no specbuild repository declares it", served_by=frozenset()),
        _scalar("stream", "TYPE_BOOL", "one response per decoding step (decoupled deployments)",
                served_by=_SPECBUILD, engine_name="streaming"),
        _scalar("temperature", "TYPE_FP32", "sampling temperature; absent or 0: greedy", engine_name="temperature"),
        _scalar("top_k", "TYPE_INT32", "top-k sampling; 0 = off", engine_name="runtime_top_k"),
        _scalar("top_p", "TYPE_FP32", "top-p (nucleus) sampling, in (0, 1]", engine_name="runtime_top_p"),
        _scalar("seed", "TYPE_UINT64", "sampling seed: the same seed, the same tokens", engine_name="seed"),
    ),
    outputs=(
        Tensor("text_output", "TYPE_STRING", (-1,), doc="the generated text"),
        Tensor("output_ids", "TYPE_INT32", (-1, -1), doc="[beam, tokens] generated ids (padded with pad_id)"),
        Tensor("sequence_length", "TYPE_INT32", (-1,), doc="[beam] valid tokens in output_ids"),
        Tensor("acceptance_rate", "TYPE_FP32", (1,), asked_by="return_perf_metrics", engine_name="acceptance_rate",
               doc="accepted draft tokens / draft tokens"),
        Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,), asked_by="return_perf_metrics",
               engine_name="total_accepted_draft_tokens", doc="draft tokens the target accepted"),
        Tensor("total_draft_tokens", "TYPE_INT32", (1,), asked_by="return_perf_metrics",
               engine_name="total_draft_tokens", doc="draft tokens proposed"),
        Tensor("acceptance_source", "TYPE_STRING", (1,), served_by=frozenset({LLMAPI}), asked_by="return_perf_metrics",
               doc="where the three counts came from: perf_metrics, derived (from decoding iterations) or none (counts left out)"),
        Tensor("logit_margin", "TYPE_FP32", (-1,), asked_by="return_logit_margin", served_by=_SPECBUILD,
               engine_name="logit_margin", doc="per generated token: the target's top-1 minus top-2 logit"),
        Tensor("runner_up_ids", "TYPE_INT32", (-1,), asked_by="return_logit_margin", served_by=_SPECBUILD,
               engine_name="runner_up_ids", doc="per generated token: the target's second choice"),
        Tensor("generation_logits", "TYPE_FP32", (-1, -1, -1), asked_by="return_generation_logits",
               served_by=frozenset(), doc="TensorRT-LLM's [beam, tokens, vocab] logits (its own ensemble)"),
    ),
)


# --- tensorrt_llm: the engine model, TensorRT-LLM's names -----------------------------------------
# Names, types, dims, reshapes, ragged and optional flags as NVIDIA/TensorRT-LLM
# triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt declares them (the
# ``trtllm`` deployment's C++ ``tensorrtllm`` backend); the reference engine's Python model declares
# the subset it serves plus specbuild's own tensors, without the reshapes (it reads [batch, 1]).


def _engine_scalar(name: str, data_type: DataType, doc: str = "", *, served_by: frozenset[str] = _ENGINE_MODEL,
                   optional: bool = True) -> Tensor:
    """A per-request scalar as upstream declares it: dims [1] reshaped to []."""
    return Tensor(name, data_type, (1,), optional=optional, reshape=(), served_by=served_by, doc=doc)


def _engine_ragged(name: str, data_type: DataType, dims: tuple[int, ...] = (-1,), doc: str = "", *,
                   served_by: frozenset[str] = frozenset({TRTLLM})) -> Tensor:
    return Tensor(name, data_type, dims, optional=True, allow_ragged_batch=True, served_by=served_by, doc=doc)


_UPSTREAM = frozenset({TRTLLM})
ENGINE = ModelInterface(
    name="tensorrt_llm",
    inputs=(
        _engine_ragged("input_ids", "TYPE_INT32", doc="[tokens] the prompt's ids", served_by=_ENGINE_MODEL),
        _engine_scalar("input_lengths", "TYPE_INT32", "valid ids in input_ids", optional=False),
        _engine_scalar("request_output_len", "TYPE_INT32", "most tokens to generate", optional=False),
        _engine_ragged("draft_input_ids", "TYPE_INT32", doc="external draft tokens to verify"),
        _engine_ragged("draft_logits", "TYPE_FP32", (-1, -1)),
        _engine_scalar("draft_acceptance_threshold", "TYPE_FP32", served_by=_UPSTREAM),
        _engine_scalar("end_id", "TYPE_INT32", "stop token"),
        _engine_scalar("pad_id", "TYPE_INT32", "padding of output_ids"),
        _engine_ragged("stop_words_list", "TYPE_INT32", (2, -1)),
        _engine_ragged("bad_words_list", "TYPE_INT32", (2, -1)),
        _engine_scalar("beam_width", "TYPE_INT32", served_by=_UPSTREAM),
        _engine_scalar("temperature", "TYPE_FP32", "sampling temperature"),
        _engine_scalar("runtime_top_k", "TYPE_INT32", "top-k"),
        _engine_scalar("runtime_top_p", "TYPE_FP32", "top-p"),
        _engine_scalar("seed", "TYPE_UINT64", "sampling seed"),
        _engine_scalar("return_log_probs", "TYPE_BOOL", served_by=_UPSTREAM),
        _engine_scalar("return_context_logits", "TYPE_BOOL", served_by=_UPSTREAM),
        _engine_scalar("return_generation_logits", "TYPE_BOOL", served_by=_UPSTREAM),
        _engine_scalar("return_perf_metrics", "TYPE_BOOL", "ask for the acceptance counters"),
        _engine_scalar("exclude_input_in_output", "TYPE_BOOL", "output_ids without the prompt"),
        _engine_scalar("stop", "TYPE_BOOL", served_by=_UPSTREAM),
        _engine_scalar("streaming", "TYPE_BOOL", "one response per decoding step"),
        *(_engine_ragged(name, "TYPE_INT32", (1,), doc="Lookahead (w, n, g) of this request", served_by=_ENGINE_MODEL)
          for name in LOOKAHEAD_INPUTS),
        # specbuild's (the name of upstream's tensorrt_llm_bls input): 0 = plain decoding
        Tensor("num_draft_tokens", "TYPE_INT32", (1,), optional=True, served_by=_SPECBUILD,
               doc="draft length of this request; 0 = plain decoding"),
        Tensor("return_logit_margin", "TYPE_BOOL", (1,), optional=True, served_by=_SPECBUILD,
               doc="ask for logit_margin and runner_up_ids"),
    ),
    outputs=(
        Tensor("output_ids", "TYPE_INT32", (-1, -1), served_by=_ENGINE_MODEL, doc="[beam, tokens]"),
        Tensor("sequence_length", "TYPE_INT32", (-1,), served_by=_ENGINE_MODEL, doc="[beam]"),
        *(Tensor(name, data_type, dims, served_by=_UPSTREAM) for name, data_type, dims in (
            ("cum_log_probs", "TYPE_FP32", (-1,)), ("output_log_probs", "TYPE_FP32", (-1, -1)),
            ("context_logits", "TYPE_FP32", (-1, -1)), ("generation_logits", "TYPE_FP32", (-1, -1, -1)),
            ("batch_index", "TYPE_INT32", (1,)), ("sequence_index", "TYPE_INT32", (1,)),
            # filled with return_perf_metrics (model_instance_state.cc fillTritonResponse)
            ("kv_cache_alloc_new_blocks", "TYPE_INT32", (1,)), ("kv_cache_reused_blocks", "TYPE_INT32", (1,)),
            ("kv_cache_alloc_total_blocks", "TYPE_INT32", (1,)), ("arrival_time_ns", "TYPE_INT64", (1,)),
            ("first_scheduled_time_ns", "TYPE_INT64", (1,)), ("first_token_time_ns", "TYPE_INT64", (1,)),
            ("last_token_time_ns", "TYPE_INT64", (1,)),
        )),
        *(dataclasses.replace(ENSEMBLE.output(name), served_by=_ENGINE_MODEL, engine_name=None) for name in PERF_OUTPUTS),
        *(dataclasses.replace(ENSEMBLE.output(name), engine_name=None) for name in MARGIN_OUTPUTS),
        # A streamed step carries only its tokens; postprocessing also needs the ids sent before (a
        # token may complete a character begun earlier) and whether this is the last response.
        Tensor("stream_prefix_ids", "TYPE_INT32", (-1,), served_by=_SPECBUILD, doc="streaming: ids sent before"),
        Tensor("stream_final", "TYPE_BOOL", (1,), served_by=_SPECBUILD, doc="streaming: the last response"),
    ),
)


# --- preprocessing / postprocessing: upstream's step models, upper-case names ----------------------

PREPROCESSING = ModelInterface(
    name="preprocessing",
    inputs=(
        Tensor("QUERY", "TYPE_STRING", (1,)),
        Tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", (1,)),
        Tensor("END_ID", "TYPE_INT32", (1,), optional=True),
        Tensor("PAD_ID", "TYPE_INT32", (1,), optional=True),
    ),
    outputs=(
        Tensor("INPUT_ID", "TYPE_INT32", (-1,)),
        Tensor("REQUEST_INPUT_LEN", "TYPE_INT32", (1,)),
        Tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", (1,)),
        Tensor("OUT_END_ID", "TYPE_INT32", (1,)),
        Tensor("OUT_PAD_ID", "TYPE_INT32", (1,)),
    ),
)
POSTPROCESSING = ModelInterface(
    name="postprocessing",
    inputs=(
        Tensor("TOKENS_BATCH", "TYPE_INT32", (-1, -1)),
        Tensor("SEQUENCE_LENGTH", "TYPE_INT32", (-1,)),
        Tensor("STREAM_PREFIX_IDS", "TYPE_INT32", (-1,), optional=True),
        Tensor("STREAM_FINAL", "TYPE_BOOL", (1,), optional=True),
    ),
    outputs=(
        Tensor("OUTPUT", "TYPE_STRING", (-1,)),
        Tensor("OUT_OUTPUT_IDS", "TYPE_INT32", (-1, -1)),
        Tensor("OUT_SEQUENCE_LENGTH", "TYPE_INT32", (-1,)),
    ),
)
MODELS = (ENSEMBLE, PREPROCESSING, ENGINE, POSTPROCESSING)


# --- the client's request options ----------------------------------------------------------------


@dataclass(frozen=True)
class GenerateOptions:
    """One request's options: what :meth:`SpecClient.generate <specbuild.client.sdk.SpecClient.generate>`
    takes, as an ``options`` object or as keywords.

    ``max_tokens``: most tokens to generate (>= 1). ``num_draft_tokens``: 0 = plain decoding on the
    same deployment, ``None`` = the engine's built max_draft_len. ``end_id``: ``None`` = engine
    default, -1 = never stop on a token. Sampling (TensorRT-LLM semantics): ``temperature`` (``None``
    or 0: greedy), ``top_k`` (0 = off), ``top_p`` in (0, 1], ``seed`` (uint64; the same seed on the
    same deployment gives the same tokens). ``lookahead_config``: a Lookahead deployment's per-request
    ``(w, n, g)`` within its built ``(W, N, G)`` (``(1, 1, 0)`` = plain decoding); ``None`` = the
    built values. ``return_logit_margin``: also fetch the target's top-two logit margin per generated
    token (specbuild reference deployments; one extra target pass on the server).
    ``return_generation_logits``: TensorRT-LLM's way to the same margin (its own ensemble's
    ``generation_logits``; the engine must be built with ``--gather_generation_logits``).

    Raises ``ValueError`` (naming the field) for ``max_tokens < 1``, ``num_draft_tokens < 0``, a
    ``lookahead_config`` that is not three numbers, or a value its tensor cannot carry: an integer field
    that is not an integer or lies outside its tensor's type (INT32; ``seed`` UINT64), a float that is
    not finite or outside float32 (numpy would wrap or round it silently).

    Example::

        greedy = GenerateOptions(max_tokens=64)
        baseline = greedy.replace(num_draft_tokens=0)
        baseline.tensor_values("hi")["num_draft_tokens"] == 0
    """

    max_tokens: int
    num_draft_tokens: int | None = None
    end_id: int | None = None
    return_perf_metrics: bool = True
    exclude_input_in_output: bool = True
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    lookahead_config: tuple[int, int, int] | None = None
    return_logit_margin: bool = False
    return_generation_logits: bool = False

    def __post_init__(self) -> None:
        for name in ("max_tokens", "num_draft_tokens"):  # integers before they are compared
            if getattr(self, name) is not None:
                _check_fits(ENSEMBLE.input(name), getattr(self, name))
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.num_draft_tokens is not None and self.num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be >= 0 or None, got {self.num_draft_tokens}")
        if self.lookahead_config is not None:
            window = tuple(self.lookahead_config)
            if len(window) != 3:
                raise ValueError(f"lookahead_config must be (w, n, g) or None, got {self.lookahead_config!r}")
            object.__setattr__(self, "lookahead_config", window)
        for name, value in self.tensor_values("").items():
            _check_fits(ENSEMBLE.input(name), value)

    @classmethod
    def of(cls, options: GenerateOptions | None = None, **fields: Any) -> GenerateOptions:
        """``options`` with ``fields`` changed, or new options from ``fields`` alone.

        Raises ``TypeError`` naming an unknown field (or a missing ``max_tokens``), ``ValueError`` as
        the constructor does."""
        if options is None:
            return cls(**fields)
        return options.replace(**fields) if fields else options

    def replace(self, **changes: Any) -> GenerateOptions:
        """A copy with ``changes`` (checked like the constructor)."""
        return dataclasses.replace(self, **changes)

    def tensor_values(self, prompt: str) -> dict[str, Any]:
        """The ``ensemble`` inputs of this request by name (only those sent): ``text_input`` (the UTF-8
        bytes of ``prompt``), ``max_tokens``, ``return_perf_metrics``, ``exclude_input_in_output``,
        and the optional ones that are set. ``return_logit_margin`` / ``return_generation_logits`` are
        sent only when true, since other deployments do not declare them.
        Raises ``ValueError`` when ``prompt`` is not a ``str``."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
        values: dict[str, Any] = {
            "text_input": prompt.encode("utf-8"),
            "max_tokens": self.max_tokens,
            "return_perf_metrics": self.return_perf_metrics,
            "exclude_input_in_output": self.exclude_input_in_output,
            "num_draft_tokens": self.num_draft_tokens,
            "end_id": self.end_id,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "seed": self.seed,
            "return_logit_margin": self.return_logit_margin or None,
            "return_generation_logits": self.return_generation_logits or None,
            **dict(zip(LOOKAHEAD_INPUTS, self.lookahead_config or (None, None, None))),
        }
        return {name: value for name, value in values.items() if value is not None}

    def output_names(self) -> tuple[str, ...]:
        """The ``ensemble`` outputs this request asks for: those always sent, and those whose
        ``asked_by`` input it sets."""
        asked = {name for name in ("return_perf_metrics", "return_logit_margin", "return_generation_logits") if getattr(self, name)}
        return tuple(t.name for t in ENSEMBLE.outputs if (t.asked_by is None or t.asked_by in asked) and t.name not in PROBED_OUTPUTS)


def _check_fits(tensor: Tensor, value: Any) -> None:
    """Raises ``ValueError`` naming ``tensor`` when ``value`` cannot be sent as its type unchanged."""
    import math

    import numpy as np

    dtype = np.dtype(tensor.numpy_dtype)
    if dtype.kind in "iu":
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{tensor.name} must be an integer, got {value!r}")
        info = np.iinfo(dtype)
        if not info.min <= int(value) <= info.max:
            raise ValueError(f"{tensor.name}={value} does not fit its {tensor.wire_type} tensor ({info.min} .. {info.max})")
    elif dtype.kind == "f":
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ValueError(f"{tensor.name} must be a number, got {value!r}")
        limit = float(np.finfo(dtype).max)
        if not math.isfinite(float(value)) or abs(float(value)) > limit:
            raise ValueError(f"{tensor.name}={value} is not a finite {tensor.wire_type} value (|x| <= {limit:.4g})")
    elif dtype.kind == "b" and not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{tensor.name} must be true or false, got {value!r}")


# --- speculation metrics: one vocabulary ----------------------------------------------------------
# Every figure about acceptance is computed here and nowhere else: the engine's GenerationResult, the
# SDK's GenerateResult, the OpenAI front's ``spec_decode`` object, bench's records and points, tune
# (which reads bench's points), verify's and the soak's reports.
#
# Counters keep TensorRT-LLM's names (the Triton outputs above): ``total_draft_tokens``,
# ``total_accepted_draft_tokens``, ``acceptance_rate``. The derived figures take the names of NVIDIA
# AIPerf's engine-neutral per-request record (``SpecDecodeAcceptanceRecord``,
# ai-dynamo/aiperf src/aiperf/common/models/spec_decode_models.py; docs/reference/spec-decode-acceptance.md):
# ``num_spec_steps`` and ``mean_acceptance_length``. Definitions, as AIPerf's:
#
#   drafted   total_draft_tokens           draft tokens actually proposed and verified (a step
#                                          that proposes nothing adds 0; a tree counts its nodes)
#   accepted  total_accepted_draft_tokens  drafts the target accepted and that were emitted; the
#                                          bonus (target) token is never counted
#   steps     num_spec_steps               target verification passes after the prefill; each
#                                          emits its accepted drafts + exactly one target token
#   rate      acceptance_rate              accepted / drafted (AIPerf: draft_acceptance_rate)
#   length    mean_acceptance_length       1 + accepted / steps = (accepted + steps) / steps:
#                                          tokens per verification step, bonus included
#
# Per request, ``completion_tokens = 1 + steps + accepted`` (the prefill emits the first token), so
# a client that sees only the Triton outputs derives ``steps = completion_tokens - 1 - accepted``
# (:func:`spec_steps`); the engine counts so that this identity holds exactly (engine/stream.py).
# Where others differ: vLLM (vllm/v1/spec_decode/metrics.py, ``SpecDecodingStats.observe_draft``)
# and AIPerf's vLLM adapter count a step only when it drafted at least one token (``num_drafts``),
# so for a drafter that sometimes proposes nothing (n-gram without a match) their length is above
# ours, which counts every target pass after the prefill: ours is the tokens-per-pass that bounds the
# speed-up. With drafts on every step (draft model, EAGLE, Medusa) the two are the same number.

SPEC_DECODE_KEY = "spec_decode"  # the OpenAI responses' extension object (specbuild's front)
# Where a request's counts came from (the ``acceptance_source`` output): the engine's own counters,
# derived from its decoding iterations (TensorRT-LLM's PyTorch path on 1.2.1), or not reported.
ACCEPTANCE_SOURCES = ("perf_metrics", "derived", "none")
SPEC_DECODE_FIELDS = ("total_draft_tokens", "total_accepted_draft_tokens", "acceptance_rate", "num_spec_steps",
                      "mean_acceptance_length")
# Keys of specbuild 0.1's ``spec_decode`` object and bench's requests.jsonl, still written (with the
# new keys' values) and read for one release; removed in 0.2.
DEPRECATED_SPEC_DECODE_FIELDS = {
    "draft_tokens": "total_draft_tokens",
    "accepted_draft_tokens": "total_accepted_draft_tokens",
    "decode_steps": "num_spec_steps",
    "acceptance_length": "mean_acceptance_length",
}
METRIC_DOCS = {
    "total_draft_tokens": "draft tokens actually proposed and verified (Triton output; AIPerf num_draft_tokens)",
    "total_accepted_draft_tokens": "draft tokens accepted and emitted, bonus token excluded (Triton output; AIPerf "
                                   "num_accepted_draft_tokens)",
    "acceptance_rate": "accepted / drafted; null when nothing was drafted (Triton output: 0.0 then; AIPerf "
                       "draft_acceptance_rate)",
    "num_spec_steps": "target verification passes after the prefill: completion tokens - 1 - accepted (AIPerf "
                      "num_spec_steps)",
    "mean_acceptance_length": "1 + accepted / steps: tokens per verification step, bonus included; null without "
                              "a step (AIPerf mean_acceptance_length)",
    "acceptance_source": "where the counts came from: perf_metrics, derived (from decoding iterations) or none "
                         "(not reported: every figure null); null when the deployment does not say",
}


def _count(name: str, value: Any) -> int:
    """``value`` as an int (numpy integers too); ``ValueError`` naming ``name`` otherwise or when negative."""
    import operator

    try:
        count = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        count = None
    if count is None:
        raise ValueError(f"{name} must be an integer count, got {value!r}")
    if count < 0:
        raise ValueError(f"{name} must be >= 0, got {count}")
    return count


def acceptance_rate(accepted: float, drafted: float) -> float | None:
    """Accepted / drafted draft tokens (AIPerf's ``draft_acceptance_rate``); ``None`` when nothing
    was drafted. Example: 6 of 8 -> 0.75."""
    return accepted / drafted if drafted else None


def mean_acceptance_length(accepted: float, steps: float) -> float | None:
    """Tokens per verification step, bonus token included: ``1 + accepted / steps`` (AIPerf's and
    vLLM's ``mean_acceptance_length``); ``None`` without a step. Example: 6 accepted in 3 steps -> 3.0.

    Pooled over requests, pass the sums (a ratio of sums, as vLLM's and AIPerf's aggregates)."""
    return 1.0 + accepted / steps if steps else None


def spec_steps(completion_tokens: int, accepted: int) -> int:
    """Verification steps after the prefill, from what a Triton response carries:
    ``completion_tokens - 1 - accepted`` (each step emits its accepted drafts + one target token, the
    prefill the first token); 0 for a response without tokens, or counts that cannot be a whole
    generation (accepted >= tokens). Example: 10 tokens, 6 accepted -> 3 steps."""
    return max(0, completion_tokens - 1 - accepted)


def avg_decoded_tokens_per_iter(completion_tokens: int, steps: int) -> float:
    """TensorRT-LLM's ``avg_decoded_tokens_per_iter`` (``LlmRequest::getAvgDecodedTokensPerIter``,
    trtllm-serve's per-choice figure, what ``acceptance_length_threshold`` compares against): tokens
    per iteration with the prefill counted as one, ``completion_tokens / (steps + 1)``. Not
    :func:`mean_acceptance_length`: 10 tokens in 3 steps -> 2.5 here, 3.0 there."""
    return completion_tokens / (steps + 1)


def steps_from_avg_decoded_tokens_per_iter(completion_tokens: int, per_iter: float) -> int:
    """The inverse of :func:`avg_decoded_tokens_per_iter`: ``round(tokens / per_iter) - 1`` steps
    (at least 0). Raises ``ValueError`` for ``per_iter <= 0``."""
    if not per_iter > 0:
        raise ValueError(f"avg_decoded_tokens_per_iter must be > 0, got {per_iter!r}")
    return max(0, round(completion_tokens / per_iter) - 1)


@dataclass(frozen=True)
class SpecDecodeMetrics:
    """One request's speculation figures (or several requests' pooled, :meth:`pooled`), by the
    vocabulary above. Counts are non-negative integers.

    ``completion_tokens``: generated tokens, the prefill's included. ``total_draft_tokens``: ``None``
    when the server did not say (trtllm-serve's per-choice ``avg_decoded_tokens_per_iter`` gives
    steps, not drafts). ``num_spec_steps``: ``None`` = derived by :func:`spec_steps` (what a client
    does); the engine passes its own count.

    ``acceptance_source``: one of :data:`ACCEPTANCE_SOURCES` or ``None`` (not said).

    Raises ``ValueError`` naming the field for a count that is negative or not an integer, or an
    unknown ``acceptance_source``.

    Example: 10 tokens, 6 of 8 drafts accepted -> 3 steps, acceptance_rate 0.75, mean_acceptance_length 3.0.
    """

    completion_tokens: int
    total_draft_tokens: int | None
    total_accepted_draft_tokens: int
    num_spec_steps: int | None = None
    acceptance_source: str | None = None

    def __post_init__(self) -> None:
        for name in ("completion_tokens", "total_draft_tokens", "total_accepted_draft_tokens", "num_spec_steps"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _count(name, value))
        if self.acceptance_source not in (None, *ACCEPTANCE_SOURCES):
            raise ValueError(f"acceptance_source must be one of {ACCEPTANCE_SOURCES} or None, got {self.acceptance_source!r}")
        if self.num_spec_steps is None:
            object.__setattr__(self, "num_spec_steps", spec_steps(self.completion_tokens, self.total_accepted_draft_tokens))

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted; ``None`` when nothing was drafted or drafts are unknown."""
        return None if self.total_draft_tokens is None else acceptance_rate(self.total_accepted_draft_tokens, self.total_draft_tokens)

    @property
    def mean_acceptance_length(self) -> float | None:
        """``1 + accepted / steps``; ``None`` without a verification step."""
        return mean_acceptance_length(self.total_accepted_draft_tokens, self.num_spec_steps)

    @classmethod
    def pooled(cls, items: Any) -> SpecDecodeMetrics | None:
        """The sums of several requests' counts (``None`` for none; drafts unknown if any is)."""
        items = list(items)
        if not items:
            return None
        drafts = [m.total_draft_tokens for m in items]
        return cls(sum(m.completion_tokens for m in items), None if None in drafts else sum(drafts),
                   sum(m.total_accepted_draft_tokens for m in items), sum(m.num_spec_steps for m in items))

    def fields(self, *, deprecated: bool = True) -> dict[str, Any]:
        """The JSON object of :data:`SPEC_DECODE_FIELDS` (OpenAI ``spec_decode``, bench's records),
        with the :data:`DEPRECATED_SPEC_DECODE_FIELDS` aliases unless ``deprecated=False``. Undefined
        figures are ``None`` (JSON null), never NaN."""
        out = {name: getattr(self, name) for name in SPEC_DECODE_FIELDS}
        if deprecated:
            out |= {old: out[new] for old, new in DEPRECATED_SPEC_DECODE_FIELDS.items()}
        return out | {"acceptance_source": self.acceptance_source}

    @staticmethod
    def unreported_fields(acceptance_source: str | None = "none", *, deprecated: bool = True) -> dict[str, Any]:
        """The :meth:`fields` of a request whose counts were not reported: every figure ``None``
        (never 0, which would read as nothing drafted)."""
        names = SPEC_DECODE_FIELDS + (tuple(DEPRECATED_SPEC_DECODE_FIELDS) if deprecated else ())
        return dict.fromkeys(names) | {"acceptance_source": acceptance_source}

    @classmethod
    def from_fields(cls, fields: Any, completion_tokens: int) -> SpecDecodeMetrics | None:
        """Read a ``spec_decode`` object (its keys or the deprecated ones); ``None`` when it carries no
        accepted count. ``completion_tokens``: the tokens of the response it came with.
        Raises ``ValueError`` as the constructor does."""
        if not fields:
            return None

        def get(name: str) -> Any:
            if fields.get(name) is not None:
                return fields[name]
            old = next((o for o, n in DEPRECATED_SPEC_DECODE_FIELDS.items() if n == name), None)
            return fields.get(old) if old else None

        accepted = get("total_accepted_draft_tokens")
        if accepted is None:
            return None
        return cls(completion_tokens, get("total_draft_tokens"), accepted, get("num_spec_steps"), fields.get("acceptance_source"))


METRICS_BEGIN = "<!-- metrics table: generated by `python -m specbuild.interface docs/interface.md` -->"
METRICS_END = "<!-- end of metrics table -->"


def metrics_markdown_table() -> str:
    """The speculation figures as a Markdown table: name, meaning, deprecated alias."""
    aliases = {new: old for old, new in DEPRECATED_SPEC_DECODE_FIELDS.items()}
    rows = ["| figure | meaning | deprecated alias (OpenAI `spec_decode`, bench requests.jsonl) |", "|---|---|---|"]
    rows += [f"| `{name}` | {METRIC_DOCS[name]} | " + (f"`{aliases[name]}`" if name in aliases else "") + " |"
             for name in (*SPEC_DECODE_FIELDS, "acceptance_source")]
    return "\n".join(rows) + "\n"


# --- docs/interface.md -----------------------------------------------------------------------------

TABLE_BEGIN = "<!-- tensor table: generated by `python -m specbuild.interface docs/interface.md` -->"
TABLE_END = "<!-- end of tensor table -->"


def markdown_table() -> str:
    """The ``ensemble`` tensors as a Markdown table (dims with the batch dimension left out)."""
    rows = ["| tensor | in/out | type | dims | optional | reference | trtllm | llmapi | meaning |",
            "|---|---|---|---|---|---|---|---|---|"]
    for direction, tensors in (("in", ENSEMBLE.inputs), ("out", ENSEMBLE.outputs)):
        for t in tensors:
            optional = "yes" if t.optional else ("with `" + t.asked_by + "`" if t.asked_by else "")
            served = " | ".join("x" if d in t.served_by else "" for d in DEPLOYMENTS)
            rows.append(f"| `{t.name}` | {direction} | {t.wire_type} | {list(t.dims)} | {optional} | {served} | {t.doc} |")
    return "\n".join(rows) + "\n"


def with_table(text: str) -> str:
    """``text`` (a Markdown document) with the part between :data:`TABLE_BEGIN` and :data:`TABLE_END`
    replaced by :func:`markdown_table`, and the part between :data:`METRICS_BEGIN` and
    :data:`METRICS_END` by :func:`metrics_markdown_table`. Raises ``ValueError`` when the markers of
    either are missing."""
    for begin_marker, end_marker, table in ((TABLE_BEGIN, TABLE_END, markdown_table),
                                            (METRICS_BEGIN, METRICS_END, metrics_markdown_table)):
        head, begin, rest = text.partition(begin_marker)
        _, end, tail = rest.partition(end_marker)
        if not begin or not end:
            raise ValueError(f"the document has no {begin_marker!r} ... {end_marker!r} section")
        text = f"{head}{begin_marker}\n{table()}{end_marker}{tail}"
    return text


def main(argv: list[str] | None = None) -> int:
    """``python -m specbuild.interface DOC.md``: rewrite the tensor and metrics tables in DOC.md."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("doc", type=Path)
    path = parser.parse_args(argv).doc
    path.write_text(with_table(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
