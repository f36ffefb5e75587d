"""What a speculation method is: one :class:`SpeculationMethod` holding everything specbuild knows about it.

Every part of specbuild reads the method through this object, never through ``if method == ...``::

    SpeculationMethod                      read by
      name, title                          recipe ``method:``, messages
      params      (pydantic model)         the recipe's ``speculation:`` AND the reference engine's
                                           ``speculative_config`` (builder/recipe.py, specbuild/runtime.py)
      trtllm      (TrtllmMapping)          decoding_type, speculative_decoding_mode, decoding_mode,
                                           conversion, build flags, checks (builder/trtllm_plan.py,
                                           builder/trtllm_version.py, triton_repo/tensorrtllm.py)
      weights     (Weights)                the draft / head files: located and checked once, copied
                                           into the engine directory (builder/reference.py)
      engine      (Entry)                  the reference engine's side: "specbuild.methods.<m>.engine:ENGINE",
                                           an :class:`~specbuild.engine.drafters.EngineMethod` imported on first use
      training    (Training)               ``train-draft``: the trainer (an Entry) and the held-out measurement

Torch-free at import: the recipe validator imports every method. The torch side of a method is named by
:class:`Entry` strings (the ``module:attribute`` syntax of Python entry points), so nothing forwards to
it by hand and nothing imports it before it runs.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, ValidationInfo

from specbuild.util.strict import FieldProblem, StrictModel

if TYPE_CHECKING:
    from specbuild.util.checkpoints import CheckpointSource
    from specbuild.builder.recipe import LoadedRecipe
    from specbuild.engine.drafters import EngineMethod

TOKEN_MAP = "speculative_token_map"  # the setting that names a hot-token map (methods/token_map.py)
BuildPath = Literal["tensorrt", "pytorch"]
DType = Literal["float32", "float16", "bfloat16"]
Choices = list[list[Annotated[int, Field(ge=0)]]]

# TensorRT-LLM's default Medusa tree (examples/medusa/README.md ``--medusa_choices``; also EAGLE's
# default static tree), identical to FasterDecoding/Medusa ``medusa/model/medusa_choices.py``
# ``mc_sim_7b_63``: 63 nodes, depth 4, top-10.
MC_SIM_7B_63: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,),
    (9,), (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0),
    (0, 1, 1), (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0),
    (1, 4), (7, 0), (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1),
    (9, 0), (0, 6, 0), (0, 0, 0, 1), (1, 6), (0, 7, 0),
)


class MethodParams(StrictModel):
    """A method's settings: the recipe's ``speculation:`` section, and (the same model) the reference
    engine's ``speculative_config`` once :meth:`SpeculationMethod.parse_speculative_config` has renamed
    TensorRT-LLM's keys. Subclasses narrow ``method`` to their name (the union's discriminator) and give
    ``max_draft_len`` (a field, or a property where TensorRT-LLM derives it)."""

    method: str
    """The speculation method: this section's settings are chosen by it."""

    @property
    def definition(self) -> SpeculationMethod:
        """The registered method these settings belong to."""
        from specbuild.methods import method_named

        return method_named(self.method)

    @property
    def decoding_type(self) -> str | None:
        """TensorRT-LLM's LLM-API ``decoding_type`` (None: no speculation)."""
        return self.definition.trtllm.decoding_type

    @property
    def speculative_decoding_mode(self) -> str:
        """TensorRT-LLM's ``trtllm-build --speculative_decoding_mode`` (``none``: none)."""
        return self.definition.trtllm.speculative_decoding_mode

    @property
    def weights_path(self) -> str | None:
        """The draft's / heads' path as the recipe gives it (None: the method has no files of its own)."""
        weights = self.definition.weights
        return None if weights is None else getattr(self, weights.field)

    @property
    def draft_tokens_per_step(self) -> int:
        """Draft tokens one verify step holds at most (the reference engine's block is one more): ``max_draft_len``,
        unless the method counts its tree's nodes apart from its depth (EAGLE-3's ``max_total_draft_tokens``)."""
        return self.max_draft_len

    def to_llm_api(self) -> dict[str, Any] | None:
        """TensorRT-LLM LLM-API ``speculative_config`` (``None``: no speculation)."""
        return None

    def llm_api_fields(self, *keys: str) -> dict[str, Any]:
        """``{"decoding_type": ..., key: value, ...}`` in ``keys``' order, for :meth:`to_llm_api`: a key
        ``"name"`` takes the setting of that name, ``"name=setting"`` the setting under another name
        (``"speculative_model_dir=eagle_model"``). Raises ``AttributeError`` for a setting that does not exist."""
        config: dict[str, Any] = {"decoding_type": self.decoding_type}
        for key in keys:
            name, _, setting = key.partition("=")
            config[name] = getattr(self, setting or name)
        return config


def check_choices(choices: Choices, info: ValidationInfo) -> Choices:
    """A speculation tree as TensorRT-LLM lists it: every node is the path of child indices from the
    root (root excluded), e.g. ``[[0], [0, 0], [1]]``; every node's parent must be listed too."""
    name = info.field_name
    if not choices:
        raise ValueError(f"{name} is empty; list at least one node, e.g. [[0], [0, 0], [1]]")
    seen = {tuple(c) for c in choices}
    for node in choices:
        if not node:
            raise ValueError(f"{name}: empty path []; the root is implicit, list only its descendants")
        if len(node) > 1 and tuple(node[:-1]) not in seen:
            raise ValueError(f"{name}: tree choice {node} has no parent: node {node} is listed without its parent {node[:-1]}")
    if len(seen) != len(choices):
        raise ValueError(f"{name}: a node is listed twice")
    return choices


# A settings field holding a speculation tree (``medusa_choices``, ``eagle_choices``), checked by :func:`check_choices`.
Tree = Annotated[Choices, AfterValidator(check_choices)]


def tree_depth(choices: Choices | tuple[tuple[int, ...], ...]) -> int:
    """Longest path of a tree, e.g. ``[[0], [0, 0], [1]]`` -> 2."""
    return max((len(c) for c in choices), default=0)


# --- entry strings: the torch side, imported on first use ------------------------------------------


@dataclass(frozen=True)
class Entry:
    """An object of a module that may import torch, named ``"package.module:attribute"`` (the syntax of
    Python entry points, ``importlib.metadata``; simonw/llm names its plugins' hooks the same way) and
    imported on first use, so that declaring a method imports nothing heavy.

    Calling an Entry calls the object it names: ``Entry("specbuild.methods.eagle.train:train")(spec, ...)``.

    Raises (on construction):
        ValueError: ``ref`` is not ``module:attribute``.
    """

    ref: str

    def __post_init__(self) -> None:
        module, sep, attribute = self.ref.partition(":")
        if not (sep and module and attribute and all(p.isidentifier() for p in (*module.split("."), *attribute.split(".")))):
            raise ValueError(f"entry {self.ref!r} must be 'package.module:attribute', e.g. 'my_plugin.engine:ENGINE'")

    def load(self) -> Any:
        """The object, its module imported on the first call.

        Raises:
            ImportError: the module does not import (the message names the entry).
            AttributeError: the module has no such attribute.
        """
        return _load_entry(self.ref)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)


@functools.cache
def _load_entry(ref: str) -> Any:
    module_name, _, attribute = ref.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"entry {ref!r}: cannot import {module_name}: {exc}") from exc
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise AttributeError(f"entry {ref!r}: {module_name} has no attribute {attribute!r}")
        found = getattr(found, part)
    return found


def as_entry(value: Entry | str | None) -> Entry | None:
    """``value`` as an :class:`Entry` (a string is parsed; None stays None)."""
    return Entry(value) if isinstance(value, str) else value


# --- TensorRT-LLM ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conversion:
    """The engine path converts the target checkpoint together with the method's weights into one
    TensorRT-LLM checkpoint (``examples/<script> --model_dir T <weights_flag> W <flags>``).

    Attributes:
        script: the converter under TensorRT-LLM's ``examples/``, e.g. ``"medusa/convert_checkpoint.py"``.
        weights_flag: its flag for the weights directory, e.g. ``"--medusa_model_dir"``.
        flags: the method's other flags, from its settings.
        pp_flag: the script takes ``--pp_size`` (ReDrafter's does not).
        quantization: the ``build.quantization`` values it takes besides ``none`` (weight-only flags).
    """

    script: str
    weights_flag: str
    flags: Callable[[Any], tuple[str, ...]]
    pp_flag: bool = True
    quantization: tuple[str, ...] = ("int8_wo", "int4_wo")


@dataclass(frozen=True)
class DraftEngine:
    """A second engine built from a separate draft model (draft-target on the engine path)."""

    checkpoint: str
    dtype: str | None  # None: the target's
    gather_generation_logits: bool = False


def _two_models(params: Any) -> bool:
    """A method whose drafter is its own object (n-gram, draft-target): TensorRT-LLM 1.2.x runs its controls."""
    del params
    return False


def _no_parameters(params: Any) -> dict[str, Any]:
    del params
    return {}


@dataclass(frozen=True)
class TrtllmMapping:
    """How TensorRT-LLM names and builds the method.

    Attributes:
        decoding_type: LLM-API ``speculative_config.decoding_type`` (``tensorrt_llm/llmapi/llm_args.py``);
            None for plain decoding. ReDrafter has no LLM-API config; its name is only TensorRT-LLM's class name.
        speculative_decoding_mode: ``trtllm-build --speculative_decoding_mode`` (``none``: not on the engine path).
        decoding_mode: the ``tensorrtllm`` Triton backend's ``decoding_mode`` parameter.
        unavailable: build path -> why TensorRT-LLM cannot run the method there.
        renamed: ``(first TensorRT-LLM version, decoding_type)`` pairs for LLM-API lines that spell
            the name differently, oldest first, e.g. ``(("1.0", "Eagle"), ("1.3", "Eagle3"))``.
        paged_context_fmha: ``trtllm-build --use_paged_context_fmha enable`` on the target.
        conversion: the target's conversion with the method's weights (None: the model family's
            plain ``convert_checkpoint.py``).
        draft_engine: a separate draft engine to build, from the method's settings.
        no_pipeline_parallel: why ``build.pp_size`` must be 1 (None: it may be more).
        check: refusals of the method's settings on a path (raises RecipeError), besides the schema's.
        engine_model: the ``tensorrt_llm`` model's fields (:class:`~specbuild.triton_repo.tensorrtllm.EngineModel`)
            from the settings, e.g. ``{"medusa_choices": [[0], [1]]}``.
        front_parameters: config.pbtxt parameters of specbuild's ensemble front for the method.
        off_switch: ``tensorrt_llm`` inputs that turn speculation off for one request on the method's own
            engine (lookahead: ``(W, N, G) = (1, 1, 0)``); None: ``num_draft_tokens=0`` needs a baseline
            engine (or, with external drafts, sends none).
        greedy_only: TensorRT-LLM decodes the method greedily only; the front refuses sampled requests
            on its engine (Medusa).
        one_model: whether the settings run TensorRT-LLM's one-model path (the drafter inside the target's
            model: EAGLE-3 one-model, MTP), where 1.2.x has no drafter object and so ignores the runtime
            controls (``draft_len_schedule``, ``max_concurrency``; ``_torch/speculative/utils.py`` ``get_spec_drafter``).
    """

    decoding_type: str | None
    speculative_decoding_mode: str = "none"
    decoding_mode: str = "top_k_top_p"
    unavailable: Mapping[str, str] = field(default_factory=dict)
    renamed: tuple[tuple[str, str], ...] = ()
    paged_context_fmha: bool = False
    conversion: Conversion | None = None
    draft_engine: Callable[[Any], DraftEngine] | None = None
    no_pipeline_parallel: str | None = None
    check: Callable[[LoadedRecipe, BuildPath], None] | None = None
    engine_model: Callable[[Any], dict[str, Any]] = _no_parameters
    front_parameters: Callable[[Any], dict[str, str]] = _no_parameters
    off_switch: Mapping[str, Any] | None = None
    greedy_only: bool = False
    one_model: Callable[[Any], bool] = _two_models

    @property
    def external_drafts(self) -> bool:
        """The engine verifies drafts it is handed (``draft_tokens_external``): specbuild's front proposes
        them per step, so the engine needs KV-cache reuse (tensorrtllm_backend docs/model_config.md)."""
        return self.speculative_decoding_mode == "draft_tokens_external"


# --- weights -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReferenceWeights:
    """How the reference builder checks the weights and copies them into the engine directory.

    Attributes:
        subdir: their directory inside an engine directory, e.g. ``"medusa"`` (the engine's default
            when ``speculative_config`` has no ``speculative_model_dir``).
        locate: find them without loading (milliseconds): exists, holds the files it must; raises
            RecipeError at the weights field.
        load: ``(loaded, weights_dir, target_dir)``: read and check every tensor (seconds; torch), before
            the target is written; returns what ``write`` takes. Raises RecipeError. An :class:`Entry`
            (a ``"module:attribute"`` string is taken as one).
        write: ``(loaded, what load returned, out_dir, *, log)``: write them into ``engine_dir / subdir``;
            an :class:`Entry` too.
        fingerprint_key: their entry in the engine fingerprint.
    """

    subdir: str
    locate: Callable[[LoadedRecipe], CheckpointSource]
    load: Entry
    write: Entry
    fingerprint_key: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "load", as_entry(self.load))
        object.__setattr__(self, "write", as_entry(self.write))


@dataclass(frozen=True)
class Weights:
    """The files a method needs besides the target: a draft model or a draft-head directory.

    Attributes:
        field: the settings field naming them (TensorRT-LLM's ``speculative_model_dir``), e.g. ``"medusa_model"``.
        what: how messages name them, e.g. ``"the Medusa head directory"``.
        role: their directory ``hf/<role>`` when the TensorRT-LLM path downloads them.
        draft_model: a whole Hugging Face model that must share the target's vocabulary (not a head).
        check_fit: ``(loaded, target_dir, weights_dir)``: their config.json (and tokenizer) against the
            target's, milliseconds, no torch; raises RecipeError at the weights field.
        check_files: a check of a local directory before TensorRT-LLM converts it (raises RecipeError).
        reference: the reference builder's handling (None: the reference engine does not run the method).
    """

    field: str
    what: str
    role: str
    draft_model: bool = False
    check_fit: Callable[[LoadedRecipe, Path, Path], None] | None = None
    check_files: Callable[[LoadedRecipe, Path], None] | None = None
    reference: ReferenceWeights | None = None


# --- training ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Training:
    """How ``specbuild train-draft`` makes the method's weights (self-distillation from the target).

    Attributes:
        train: ``train(params, target, tokenizer, data, config, out, ckpt_dir, **common)`` writes the
            weights to ``out`` and returns the loop's ``TrainResult`` (:mod:`specbuild.train.loop`): an
            :class:`Entry` (``"specbuild.methods.<m>.train:train"``; a string is taken as one).
        held_out_config: ``(params, artefact, k)`` -> the reference engine's speculative_config that
            measures ``artefact`` as a chain of ``k`` draft tokens.
        draft_vocabulary: the method trains over a reduced draft vocabulary when ``train.draft_vocab_size``
            is set (EAGLE-3's ``d2t``); a recipe setting it for another method is refused.
        soft_labels: the method trains on the target's distribution when ``train.soft_labels`` is set
            (EAGLE-3); a recipe setting it for another method is refused.
        capture_layers: ``(params, target_config)`` -> the target's decoder layers whose outputs the
            method trains on besides the final hidden state (EAGLE-3's low / mid / high features), an
            :class:`Entry` or None; the data's one teacher-forced target pass captures them too.
    """

    train: Entry
    held_out_config: Callable[[Any, Path, int], dict[str, Any]]
    draft_vocabulary: bool = False
    soft_labels: bool = False
    capture_layers: Entry | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "train", as_entry(self.train))
        if self.capture_layers is not None:
            object.__setattr__(self, "capture_layers", as_entry(self.capture_layers))


def chain(draft_len: int) -> list[list[int]]:
    """The linear tree ``[[0], [0, 0], ...]`` of ``draft_len`` nodes."""
    return [[0] * d for d in range(1, draft_len + 1)]


def chain_of(spec: MethodParams, artefact: Path, draft_len: int) -> dict[str, Any]:
    """A :attr:`Training.held_out_config` for a method that drafts chains: its ``decoding_type``,
    ``max_draft_len = draft_len`` and the artefact as ``speculative_model_dir`` (a tree method adds
    its tree as :func:`chain` ``(draft_len)``)."""
    return {"decoding_type": spec.decoding_type, "max_draft_len": draft_len, "speculative_model_dir": str(artefact)}


# --- the method ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeculationMethod:
    """One speculation method, as registered (see :mod:`specbuild.methods`).

    Attributes:
        name: the recipe's ``method:`` value, e.g. ``"ngram"``.
        title: the method in messages, e.g. ``"EAGLE-3"``.
        params: its settings model (the recipe section and the engine's speculative_config).
        trtllm: how TensorRT-LLM names and builds it.
        weights: its draft / head files (None: none).
        engine: the reference engine's side, an :class:`Entry` naming an
            :class:`~specbuild.engine.drafters.EngineMethod` (``"specbuild.methods.<m>.engine:ENGINE"``; a
            string is taken as one) that :meth:`engine_method` imports; None: not in the reference engine.
        training: how ``train-draft`` makes its weights (None: nothing to train).
        ignored_config_keys: TensorRT-LLM speculative_config keys the reference engine accepts and
            ignores (they change nothing in a greedy, single-process engine), e.g. ``greedy_sampling``.
        reference_check: settings the reference engine does not implement: ``(field, message)`` or None.
        unknown_keys_hint: appended to the engine's message on unknown speculative_config keys.
    """

    name: str
    title: str
    params: type[MethodParams]
    trtllm: TrtllmMapping
    weights: Weights | None = None
    engine: Entry | None = None
    training: Training | None = None
    ignored_config_keys: tuple[str, ...] = ()
    reference_check: Callable[[Any], tuple[str, str] | None] | None = None
    unknown_keys_hint: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine", as_entry(self.engine))
        annotation = self.params.model_fields["method"].annotation
        if getattr(annotation, "__args__", None) != (self.name,):
            raise ValueError(f"method {self.name!r}: {self.params.__name__}.method must be Literal[{self.name!r}]")
        if self.engine is not None and not self.speculates:
            raise ValueError(f"method {self.name!r}: the engine's speculative_config names it by decoding_type; give one")

    def engine_method(self) -> EngineMethod:
        """The reference engine's side, imported now (torch).

        Raises:
            ValueError: the method has no engine side.
            TypeError: its entry names something other than an ``EngineMethod``.
        """
        from specbuild.engine.drafters import EngineMethod  # torch: only when an engine loads the method

        if self.engine is None:
            raise ValueError(f"method {self.name!r} does not run in the reference engine")
        found = self.engine.load()
        if not isinstance(found, EngineMethod):
            raise TypeError(f"method {self.name!r}: engine entry {self.engine.ref!r} names a {type(found).__name__}, not an EngineMethod")
        return found

    @property
    def decoding_type(self) -> str | None:
        """TensorRT-LLM's name, which the engine's speculative_config uses too; None only for plain decoding."""
        return self.trtllm.decoding_type

    @property
    def speculates(self) -> bool:
        """False for plain decoding (``method: none``)."""
        return self.decoding_type is not None

    @property
    def runs_on_reference(self) -> bool:
        """The reference engine runs it (plain decoding needs no engine side)."""
        return self.engine is not None or not self.speculates

    def parse_speculative_config(self, config: Mapping[str, Any], *, base_dir: Path | None = None) -> MethodParams:
        """The reference engine's ``speculative_config`` (TensorRT-LLM LLM-API keys) validated by
        :attr:`params`, the recipe's own model.

        ``decoding_type`` names the method; ``speculative_model_dir`` is the weights field, relative
        paths taken against ``base_dir`` (the engine directory), omitted -> ``base_dir/<subdir>``; a
        relative ``speculative_token_map`` is taken against ``base_dir`` too; :attr:`ignored_config_keys`
        are dropped.

        Example: ``{"decoding_type": "Medusa", "num_medusa_heads": 3}`` with ``base_dir=/e`` ->
        ``MedusaSpeculation(method="medusa", medusa_model="/e/medusa", num_medusa_heads=3, ...)``.

        Raises:
            ValueError: every problem in one message, in the engine's terms (unknown keys with the
                allowed ones, ``speculative_config.<key> must be ...``, a missing speculative_model_dir).
        """
        data = {k: v for k, v in config.items() if k != "decoding_type" and k not in self.ignored_config_keys}
        if self.weights is not None:
            names = [n for n in (self.weights.field, *path_field_aliases(self.weights.field)) if n in data]
            if len(names) > 1:
                raise ValueError(f"speculative_config gives {names}: TensorRT-LLM's names for one directory; keep one")
            weights_dir = self._weights_dir(data.pop(names[0]) if names else None, base_dir)
            if weights_dir is not None:
                data[self.weights.field] = str(weights_dir)
        if data.get(TOKEN_MAP) is not None and base_dir is not None:  # a file in the engine directory
            token_map = Path(str(data[TOKEN_MAP]))
            data[TOKEN_MAP] = str(token_map if token_map.is_absolute() else base_dir / token_map)
        try:
            return self.params.model_validate({"method": self.name, **data})
        except ValidationError as exc:
            raise ValueError(self._config_errors(exc)) from None

    def _weights_dir(self, given: Any, base_dir: Path | None) -> Path | None:
        if given is None:
            reference = self.weights.reference if self.weights is not None else None
            return None if base_dir is None or reference is None else base_dir / reference.subdir
        path = Path(str(given))
        return path if path.is_absolute() or base_dir is None else base_dir / path

    def config_keys(self) -> list[str]:
        """The speculative_config keys the reference engine takes for the method, sorted."""
        names = {"decoding_type", *self.ignored_config_keys, *self.params.model_fields} - {"method"}
        if self.weights is not None:
            names = (names - {self.weights.field}) | {"speculative_model_dir"}
        return sorted(names)

    def _config_errors(self, exc: ValidationError) -> str:
        errors = exc.errors(include_url=False)
        unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
        messages = [f"unknown {self.decoding_type} speculative_config keys {unknown}; allowed: {self.config_keys()}{self.unknown_keys_hint}"] if unknown else []
        for err in errors:
            if err["type"] != "extra_forbidden":
                messages.append(self._config_error(err))
        return "; ".join(messages)

    def _config_error(self, err: dict[str, Any]) -> str:
        cause = (err.get("ctx") or {}).get("error")
        loc = tuple(str(p) for p in err["loc"]) + (cause.loc if isinstance(cause, FieldProblem) else ())
        if self.weights is not None and loc[:1] == (self.weights.field,):
            if err["type"] == "missing":
                return f"speculative_config needs speculative_model_dir ({self.weights.what})"
            loc = ("speculative_model_dir", *loc[1:])
        name = ".".join(loc)
        if err["type"] in _BOUNDS:  # e.g. "speculative_config.max_draft_len must be an integer >= 1, got 0"
            symbol, key = _BOUNDS[err["type"]]
            value = err.get("input")
            kind = "an integer " if isinstance(value, int) else ""
            return f"speculative_config.{name} must be {kind}{symbol} {err['ctx'][key]}, got {value!r}"
        return f"speculative_config.{name}: {err['msg'].removeprefix('Value error, ')}"


# pydantic's bound errors: type -> (symbol, context key)
_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}


def path_field_aliases(field_name: str) -> tuple[str, ...]:
    """TensorRT-LLM's spellings of a weights field: the LLM API's ``speculative_model_dir`` (newer lines:
    ``speculative_model``) and the converters' ``--<field>_dir``."""
    return ("speculative_model_dir", "speculative_model", f"{field_name}_dir")
