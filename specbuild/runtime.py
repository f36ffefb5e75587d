"""ReferenceEngine: greedy or sampled decoding with draft-then-verify speculation, batched in flight.

The engine loads the target (transformers' own model) and the method's extra weights once; every
request becomes a :class:`~specbuild.engine.worker.InflightRequest` (validated fields, a per-request
:class:`~specbuild.engine.drafters.Drafter` from the method's ``make_drafter``, a seeded sampler) that a
:class:`~specbuild.engine.worker.Worker` advances together with the other requests in flight: one
target forward per iteration over every row's block (:func:`~specbuild.engine.forward.forward_blocks`),
each row with its own KV slot (:mod:`~specbuild.engine.kv_pool`). :meth:`ReferenceEngine.generate_stream`
runs one request in a worker of its own; :class:`~specbuild.engine.scheduler.Scheduler` shares one
worker among all requests (in-flight batching).

Each decoding iteration of one row (Leviathan et al. 2023, §2.3; SpecInfer tree attention, Miao et
al. 2024, §4 for trees)::

    context      = prompt + emitted            KV slot holds context[:-1]
    block        = drafter.draft(context)      [root = context[-1], drafts..., extra rows]
    target       = one pass over the block     (batched with the other rows)
    accepted     = longest path of the verification tree the target agrees with (greedy), or
                   speculative sampling along a chain (sampled); bonus = target's next token
    KV slot      = keep root + accepted path   (a chain: roll back the rejected drafts)
    emit accepted + [bonus]  (clipped at max_tokens and after end_id); drafter.update(...)

    positions:   | context[:-1] | last | d0 d1 d2 |      k = 3, 2 accepted
    slot after verify:  len(context) + 3   ->  keep len(context) + 2
    emitted: d0 d1 t2 (t2 = bonus, not yet in the cache: it is the next step's root)

The blocks by method (each method's drafter, ``specbuild/methods/<m>/engine.py``): plain decoding and
``num_draft_tokens=0`` a one-token block; n-gram, SA and draft-target a chain of ``k`` drafts; EAGLE-3
(Li et al. 2025) a chain from fused target layers; Medusa (Cai et al. 2024) and EAGLE-1/2 (Li et al.
2024) a token tree cut to ``k`` nodes; lookahead (Fu et al. 2024) its n-gram candidates plus the Jacobi
window as extra rows. The engine names no method: it finds the one ``speculative_config`` names in the
registry (:func:`specbuild.methods.method_for`) and asks it for drafters.

Sampled requests (``temperature > 0``) verify chains with speculative sampling
(:func:`~specbuild.engine.acceptance.accept_speculative`): the output is distributed exactly as plain
sampling from the target. Methods marked ``greedy_only`` (Medusa, EAGLE, EAGLE-3, Lookahead) refuse
sampled requests.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbuild.methods import method_for

from specbuild.engine import rowgemm
from specbuild.engine import target as target_model
from specbuild.engine.draft_linear import draft_weight_dtype
from specbuild.engine.drafters import Drafter, EngineMethod, MethodContext, PlainDrafter
from specbuild.engine.forward import RowBlock, check_mask_attention, forward_blocks
from specbuild.engine.guarantee import plan_kernels
from specbuild.engine.kernels import pack_linears
from specbuild.engine.kv_pool import KVPool, KVShape
from specbuild.engine.native import BITWISE, KernelChoice
from specbuild.engine.sampling import Sampler
from specbuild.engine.spec_controls import CONTROL_KEYS, RuntimeControls, SpeculationGate
from specbuild.engine.stream import Steps, collect
from specbuild.engine.threads import on_fresh_thread
from specbuild.engine.types import GenerationRequest, GenerationResult, InvalidRequestError
from specbuild.engine.validation import ResolvedRequest, validate_request
from specbuild.engine.worker import InflightRequest, run_alone


@dataclass(frozen=True)
class EngineLimits:
    """Build-time limits (TensorRT-LLM ``build_config`` names); all counts in tokens except batch size."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_draft_len: int
    max_num_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_input_len", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineLimits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_draft_len < 0:
            raise ValueError(f"EngineLimits.max_draft_len must be >= 0, got {self.max_draft_len}")
        if self.max_num_tokens is not None and self.max_num_tokens < self.max_block:
            raise ValueError(
                f"EngineLimits.max_num_tokens={self.max_num_tokens} is below one step of one request "
                f"(1 + max_draft_len = {self.max_block}); raise it or leave it unset"
            )

    @property
    def max_block(self) -> int:
        """The widest block one request brings to an iteration: the root plus ``max_draft_len`` drafts."""
        return 1 + self.max_draft_len

    @property
    def tokens_per_iteration(self) -> int:
        """TensorRT-LLM's ``max_num_tokens``: tokens one iteration may run over all requests; unset ->
        every request's widest step at once, or the longest prompt (a prefill), whichever is more."""
        if self.max_num_tokens is not None:
            return self.max_num_tokens
        return max(self.max_batch_size * self.max_block, self.max_input_len)


class ReferenceEngine:
    """A readable PyTorch speculative-decoding engine (transformers model, engine-owned KV cache)."""

    def __init__(
        self,
        model: Any,
        *,
        limits: EngineLimits,
        end_id: int,
        speculative_config: dict | None = None,
        base_dir: str | Path | None = None,
        trust_remote_code: bool = False,
        draft_weights: str = "auto",
        kernels: KernelChoice | None = None,
    ) -> None:
        """Set up the engine around a loaded target; loads the method's extra models (a draft) if any.

        Args:
            speculative_config: TensorRT-LLM LLM-API keys, validated by the method's recipe settings model
                (:meth:`specbuild.methods.SpeculationMethod.parse_speculative_config`); None for none. Its
                runtime controls (``draft_len_schedule``, ``max_concurrency``, ``acceptance_window``,
                ``acceptance_length_threshold``; :mod:`~specbuild.engine.spec_controls`) set each
                iteration's draft length as TensorRT-LLM's PyTorch executor does.
            base_dir: where relative paths of ``speculative_config`` resolve (the engine directory).
            draft_weights: what the draft side's packed weights hold where the engine's float32 kernel
                runs them: ``"float32"``, ``"bfloat16"`` or ``"auto"`` (:func:`~specbuild.engine.draft_linear.draft_weight_dtype`).
            kernels: the kernels ``model`` was packed for (:func:`~specbuild.engine.guarantee.plan_kernels`; None:
                not known, a model packed by the caller).

        Raises:
            ValueError: an unknown ``draft_weights``; bad speculative_config (a ``draft_len_schedule``
                TensorRT-LLM refuses, with the rule it breaks), settings the reference engine does not implement
                (``posterior_threshold``), ``max_draft_len`` past the build (for Medusa: more tree
                nodes than the build's max_draft_len), or a draft / Medusa heads that do not fit the
                target (e.g. a different vocab_size or hidden_size).
        """
        self._model = model
        self._kernels = kernels
        self._limits = limits
        self._end_id = end_id
        self._speculative_config = dict(speculative_config) if speculative_config else None
        self._decoding_type: str | None = None
        self._method: EngineMethod | None = None
        self._method_state: Any = None
        self._controls: RuntimeControls | None = None
        self._gate: SpeculationGate | None = None
        weight_dtype = draft_weight_dtype(draft_weights, model)  # raises on an unknown setting, with or without a method
        if self._speculative_config is not None:
            method = method_for(self._speculative_config)
            method_config = {k: v for k, v in self._speculative_config.items() if k not in CONTROL_KEYS}
            params = method.parse_speculative_config(method_config, base_dir=None if base_dir is None else Path(base_dir))
            refusal = method.reference_check(params) if method.reference_check is not None else None
            if refusal is not None:
                raise ValueError(f"speculative_config.{refusal[0]}: {refusal[1]}")
            _check_draft_len(params.max_draft_len, limits.max_draft_len)
            self._decoding_type = method.decoding_type
            self._method = method.engine_method()
            self._method_state = self._method.load(
                params, MethodContext(model, trust_remote_code, limits.max_batch_size, limits.max_seq_len,
                                      weight_dtype)
            )
            if any(self._speculative_config.get(k) is not None for k in CONTROL_KEYS):
                method_draft_len = getattr(params, "max_draft_len", None)
                self._controls = RuntimeControls.from_config(
                    self._speculative_config, limits.max_draft_len if method_draft_len is None else method_draft_len)
                self._gate = self._controls.new_gate()
        self._vocab_size = int(model.config.get_text_config().vocab_size)
        check_mask_attention(model)

    @classmethod
    def from_pretrained(
        cls,
        checkpoint_dir: str | Path,
        *,
        speculative_config: dict | None,
        limits: EngineLimits,
        dtype: str = "float32",
        device: str = "cpu",
        end_id: int | None = None,
        trust_remote_code: bool = False,
        base_dir: str | Path | None = None,
        kernels: str = "auto",
        draft_weights: str = "auto",
    ) -> ReferenceEngine:
        """Load a local Hugging Face checkpoint as the target (and a draft checkpoint for DraftTarget).

        Args:
            checkpoint_dir: directory with config.json and weights (no hub download).
            speculative_config: TensorRT-LLM LLM-API keys, e.g. ``{"decoding_type": "NGram",
                "max_draft_len": 4, "max_matching_ngram_size": 3, "is_use_oldest": True}``; None for none.
            limits: build limits; ``speculative_config["max_draft_len"]`` must not exceed ``limits.max_draft_len``.
            end_id: default end token; None -> the checkpoint's eos id (the first if several; -1 if none).
            base_dir: where relative paths in ``speculative_config`` resolve (DraftTarget's
                ``speculative_model_dir``; None -> the working directory).
            kernels: the target's linear-layer kernels (:mod:`~specbuild.engine.kernels`): ``"eager"``,
                ``"onednn"`` (prepacked weights, CPU), ``"rowgemm"`` (the engine's float32 CPU kernels,
                :mod:`~specbuild.engine.rowgemm`, required: it fails where they cannot run) or ``"auto"``
                (rowgemm, else onednn, where they apply). :attr:`kernels` says what runs and the greedy
                equality it gives (logged at load).
            draft_weights: as for the constructor.

        Loading and packing run on a short-lived thread (:func:`~specbuild.engine.threads.on_fresh_thread`),
        so that they leave no OpenMP pool on the caller's thread to slow the scheduler's.

        Raises:
            FileNotFoundError: no checkpoint at ``checkpoint_dir`` (or at the draft's directory).
            ValueError: unsupported dtype or decoding_type, bad speculative_config keys or values, a draft
                whose vocab_size differs from the target's; ``kernels="rowgemm"`` where the engine's kernels
                cannot run (no C compiler: the message says how to fix it).
        """

        def load() -> ReferenceEngine:
            model = target_model.load_target(
                checkpoint_dir, dtype=dtype, device=device, trust_remote_code=trust_remote_code
            )
            choice = plan_kernels(model, kernels)
            pack_linears(model, choice.linear)
            log = logging.getLogger(__name__)
            (log.info if choice.greedy_equality == BITWISE else log.warning)("%s", choice.describe())
            return cls(
                model,
                limits=limits,
                end_id=_default_end_id(model) if end_id is None else end_id,
                speculative_config=speculative_config,
                base_dir=base_dir,
                trust_remote_code=trust_remote_code,
                draft_weights=draft_weights,
                kernels=choice,
            )

        # Loading runs OpenMP regions; on a short-lived thread they leave no thread pool behind to slow
        # the scheduler's thread (engine/threads.py).
        return on_fresh_thread(load)

    @classmethod
    def from_engine_dir(cls, engine_dir: str | Path, *, device: str = "cpu") -> ReferenceEngine:
        """Load an engine directory written by the builder (``config.json`` + ``target/``, ``draft/`` for
        DraftTarget, ``medusa/`` for Medusa).

        ``speculative_model_dir`` resolves against ``engine_dir``; without one the draft is
        ``engine_dir/draft`` (DraftTarget) and the heads ``engine_dir/medusa`` (Medusa).

        The target runs the linear kernels the build recorded (``specbuild.kernel_guarantee`` in config.json:
        what ``build.kernels`` resolved to on the building machine), so what config.json says is what runs;
        an engine directory written before that record resolves ``specbuild.kernels`` here.

        Raises:
            FileNotFoundError: ``engine_dir/config.json``, ``engine_dir/target`` (or the draft) missing.
            ValueError: a required key of config.json is missing (the message names it); a draft whose
                vocab_size differs from the target's; the build recorded the engine's bitwise kernels and
                they cannot be built here (the message says how to fix it, or to rebuild the engine).
        """
        engine_dir = Path(engine_dir)
        config_path = engine_dir / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"{config_path} not found: not an engine directory")
        config = json.loads(config_path.read_text())
        build = _require(config, "build_config", config_path)
        required = ("max_batch_size", "max_input_len", "max_seq_len", "max_draft_len")
        limits = EngineLimits(**{k: _require(build, k, config_path) for k in required}, max_num_tokens=build.get("max_num_tokens"))
        extra = config.get("specbuild") or {}
        kernels = _recorded_kernels(extra, config_path)
        engine = cls.from_pretrained(
            engine_dir / "target",
            speculative_config=config.get("speculative_config"),
            limits=limits,
            dtype=(config.get("pretrained_config") or {}).get("dtype", "float32"),
            device=device,
            end_id=extra.get("end_id"),
            trust_remote_code=bool(extra.get("trust_remote_code", False)),
            base_dir=engine_dir,
            kernels=kernels,
            draft_weights=extra.get("draft_weights", "auto"),
        )
        recorded = extra.get("kernel_guarantee")
        if recorded:
            recorded = KernelChoice.from_json(recorded)
            if (recorded.linear, recorded.attention) == (engine.kernels.linear, engine.kernels.attention):
                engine._kernels = recorded  # with the build's reason for a fallback
            else:
                logging.getLogger(__name__).warning("%s records %s, but the engine runs %s", config_path,
                                                    recorded.describe(), engine.kernels.describe())
        return engine

    @property
    def limits(self) -> EngineLimits:
        return self._limits

    @property
    def kernels(self) -> KernelChoice | None:
        """The target's kernels and the greedy equality they give (bitwise or up to logit near-ties); None
        when the engine was handed a model packed by the caller."""
        return self._kernels

    @property
    def end_id(self) -> int:
        """Default end token id (-1: never stop on a token)."""
        return self._end_id

    @property
    def speculative_config(self) -> dict | None:
        return None if self._speculative_config is None else dict(self._speculative_config)

    @property
    def max_draft_len(self) -> int:
        """Draft tokens per step a request may ask for: ``limits.max_draft_len``, or 0 without speculation."""
        return self._limits.max_draft_len if self._method is not None else 0

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def runtime_controls(self) -> RuntimeControls | None:
        """The runtime controls of ``speculative_config`` (None: none set; every step drafts the request's
        ``num_draft_tokens``)."""
        return self._controls

    @property
    def speculation_gate(self) -> SpeculationGate | None:
        """The engine's acceptance gate (``acceptance_window`` / ``acceptance_length_threshold``), shared
        by every request it serves; None without one."""
        return self._gate

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate for one request: greedy, or sampled when ``temperature > 0``; speculative when
        ``num_draft_tokens > 0``. The same steps as :meth:`generate_stream`, collected.

        Greedy output equals plain greedy decoding of the target token for token (up to floating-point
        differences between a multi-token and a one-token forward pass); sampled output is distributed
        as plain sampling from the target, and the same ``seed`` gives the same output.

        On a tree method (Medusa) ``num_draft_tokens = k`` caps the tree verified per step: ``k`` below
        the tree's node count keeps its first ``k`` nodes in node order (by depth, then path: the
        shallow, most likely candidates), e.g. ``k = 1`` verifies only the top-1 token of head 0;
        ``0`` decodes plainly. EAGLE's static tree is cut the same way; its dynamic tree keeps the
        ``k`` best nodes. On Lookahead ``num_draft_tokens > 0`` switches lookahead on; the request's
        ``lookahead_config`` ``(w, n, g)`` shapes it.

        Raises:
            InvalidRequestError: as :meth:`generate_stream`.
        """
        return collect(self.generate_stream(request))

    def generate_stream(self, request: GenerationRequest) -> Steps:
        """The request's decoding steps, one :class:`~specbuild.engine.stream.StepOutput` per target pass:
        first the prefill's token, then per verification step the tokens it emitted (accepted drafts +
        bonus, clipped at ``max_tokens`` / after the end token) with the running counters; the last
        step has ``finish_reason`` set. Concatenating ``token_ids`` gives :meth:`generate`'s output.

        The request is validated now (errors raise here, before any step); it then runs alone in a
        worker of its own (a batch of one), each step when the iterator is advanced. To batch requests,
        submit them to a :class:`~specbuild.engine.scheduler.Scheduler`.

        Example: ``[s.token_ids for s in engine.generate_stream(GenerationRequest(ids, 8))]`` ->
        ``[[412], [9, 77, 5], [31], [8, 8, 2]]`` (1 + 3 + 1 + 3 = 8 tokens, 3 verification steps).

        Raises:
            InvalidRequestError: as :meth:`prepare`.
        """
        seq = self.prepare(request)
        return run_alone(self._model, seq, max_block=self._limits.max_block, controls=self._controls, gate=self._gate,
                         max_num_tokens=self._limits.tokens_per_iteration)

    def prepare(self, request: GenerationRequest) -> InflightRequest:
        """Validate ``request`` and make its :class:`~specbuild.engine.worker.InflightRequest` (drafter, sampler),
        ready for a :class:`~specbuild.engine.worker.Worker`.

        Raises:
            InvalidRequestError: a field is out of range (see :func:`validate_request`), the method
                cannot serve the prompt (e.g. longer than the draft model's context), a sampled
                request (``temperature > 0``) on a greedy-only method (Medusa, EAGLE, Lookahead), or a
                ``lookahead_config`` outside the built ``(W, N, G)`` or sent to another engine.
        """
        resolved = validate_request(
            request,
            max_input_len=self._limits.max_input_len,
            max_seq_len=self._limits.max_seq_len,
            max_draft_len=self.max_draft_len,
            vocab_size=self._vocab_size,
            default_end_id=self._end_id,
        )
        if resolved.sampling is not None and self._method is not None and self._method.greedy_only:
            raise InvalidRequestError(
                f"temperature={request.temperature!r}: {self._decoding_type} is greedy-only, as in "
                "TensorRT-LLM; send temperature 0 (or None) to this engine"
            )
        self._check_lookahead_config(resolved.lookahead_config)
        if resolved.num_draft_tokens > 0:
            assert self._method is not None
            self._method.check_prompt(self._method_state, resolved.input_ids)
        sampler = None if resolved.sampling is None else Sampler(resolved.sampling, device=self._model.device)
        return InflightRequest(resolved.input_ids, resolved.max_tokens, resolved.end_id, self._drafter(resolved), sampler)

    @property
    def model(self) -> Any:
        """The target model (transformers); the engine's forward passes run through it."""
        return self._model

    def logit_margins(self, prompt_ids: list[int], output_ids: list[int]) -> tuple[list[float], list[int]]:
        """The target's top-two logit margin and runner-up token at each position of ``output_ids``.

        One causal pass over ``prompt + output[:-1]`` through :func:`~specbuild.engine.forward.forward_blocks`
        (the engine's own forward, on a one-slot :class:`~specbuild.engine.kv_pool.KVPool` of exactly that
        many positions, freed on return; fp32 logits); row ``i`` scores the position that produced
        ``output_ids[i]``. Used to tell a numerical near-tie from a bug at a divergence.

        Returns:
            ``(margins, runner_up_ids)``, each ``[len(output_ids)]``: ``top1 - top2`` logits and the
            second most likely token.

        Raises:
            ValueError: ``prompt_ids`` or ``output_ids`` is empty.
        """
        if not prompt_ids or not output_ids:
            raise ValueError("logit_margins needs at least one prompt token and one output token")
        tokens = [*prompt_ids, *output_ids[:-1]]
        model = self._model
        pool = KVPool(KVShape.of(model), num_slots=1, capacity=len(tokens), dtype=model.dtype, device=model.device)
        with torch.inference_mode():
            out = forward_blocks(model, pool, [RowBlock(pool.allocate(), tokens, logits_from=len(prompt_ids) - 1)])
            logits = out.logits[0].float()  # [len(output_ids), vocab]
            top = logits.topk(2, dim=-1)
        return (top.values[:, 0] - top.values[:, 1]).tolist(), top.indices[:, 1].tolist()

    def _check_lookahead_config(self, window: tuple[int, int, int] | None) -> None:
        """Refuse a ``lookahead_config`` outside the built ``(W, N, G)``, or on an engine without Lookahead."""
        if window is None:
            return
        if self._method is None or self._method.resolve_window is None:
            running = "no speculation" if self._method is None else self._decoding_type
            raise InvalidRequestError(
                f"lookahead_config={window!r}: this engine runs {running}, not Lookahead; send lookahead_config=None"
            )
        try:
            self._method.resolve_window(self._method_state, window)
        except ValueError as exc:
            raise InvalidRequestError(f"lookahead_config={window!r} is out of range: {exc}") from None

    def _drafter(self, request: ResolvedRequest) -> Drafter:
        """The request's drafter: plain for ``num_draft_tokens == 0``, else the method's
        (:attr:`EngineMethod.make_drafter`, which caps it at ``num_draft_tokens``)."""
        if request.num_draft_tokens == 0:
            return PlainDrafter()
        assert self._method is not None
        return self._method.make_drafter(self._method_state, request)


def _check_draft_len(method_draft_len: int, built_draft_len: int) -> None:
    if method_draft_len > built_draft_len:
        raise ValueError(
            f"speculative_config.max_draft_len={method_draft_len} exceeds the built max_draft_len="
            f"{built_draft_len} (EngineLimits.max_draft_len)"
        )


def _default_end_id(model: Any) -> int:
    """The checkpoint's eos id (generation_config first, then config); -1 when it has none."""
    generation_config = getattr(model, "generation_config", None)
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config.get_text_config(), "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return -1 if eos is None else int(eos)


def _recorded_kernels(extra: dict, config_path: Path) -> str:
    """The linear kernels an engine directory's config.json says the target runs (``kernel_guarantee.linear``,
    else the recipe's ``kernels``).

    Raises:
        ValueError: the record names the engine's bitwise kernels (``rowgemm``) and they cannot be built here.
    """
    record = extra.get("kernel_guarantee")
    if not record:
        return extra.get("kernels", "auto")
    choice = KernelChoice.from_json(record)
    if choice.linear != "rowgemm":
        return choice.linear
    if rowgemm.library() is None:
        raise ValueError(
            f"{config_path} records the engine's own kernels (rowgemm, greedy equality {choice.greedy_equality}), "
            f"which cannot be built here: {rowgemm.unavailable_reason()}. Fix that, or rebuild the engine here "
            "(`specbuild build --rebuild`) to record the oneDNN fallback (greedy equality up to logit near-ties)"
        )
    return extra.get("kernels", "auto")  # "auto" or "rowgemm": either resolves to rowgemm now


def _require(mapping: dict, key: str, path: Path) -> Any:
    if key not in mapping:
        raise ValueError(f"{path}: missing key {key!r}")
    return mapping[key]
