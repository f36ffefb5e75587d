"""ReferenceEngine: greedy or sampled decoding with a KV cache and draft-then-verify speculation.

Every decoding path is a step generator (:meth:`ReferenceEngine.generate_stream`, one
:class:`~specbuild.engine.stream.StepOutput` per target pass); :meth:`ReferenceEngine.generate`
collects it, so a streamed request's tokens concatenate to the non-streamed output by construction,
and :class:`~specbuild.engine.scheduler.Scheduler` interleaves several requests' steps (in-flight
batching by time-slicing: each step is one sequence's own forward pass).

Each decoding iteration (Leviathan et al. 2023, §2.3, greedy case)::

    context      = prompt + emitted            cache holds context[:-1]
    draft        = proposer.propose(context, k)                       k tokens
    target       = verify([context[-1], *draft])                      k + 1 tokens, one forward pass
    accepted     = longest draft prefix == target;  bonus = target[len(accepted)]
    cache        = rollback(cache, len(context) + len(accepted))      drop rejected drafts
    emit accepted + [bonus]  (clipped at max_tokens and after end_id)

    positions:   | context[:-1] | last | d0 d1 d2 |      k = 3, 2 accepted
    cache after verify:  len(context) + 3   ->  rollback to len(context) + 2
    emitted: d0 d1 t2 (t2 = bonus, not yet in the cache: it is the next step's ``last``)

Tree methods (Medusa, Cai et al. 2024) verify a token tree instead of a chain; greedy only::

    prefill      = prompt -> first token + the target's final-norm hidden state h that produced it
    tree         = proposer's tree cut to num_draft_tokens nodes (first k in node order) and to the
                   depth max_tokens still allows (remaining - 1)
    tree tokens  = proposer.propose_tree(context, h, tree)               1 + n tokens, root = context[-1]
    target       = tree_forward(tree tokens)          one pass, tree attention mask (tree_verify)
    accepted     = longest root-to-node path matching the target (accept_tree_greedy); bonus after it
    cache        = compact(prefix + root + accepted path);  h = hidden state at the path's last node
    emit accepted + [bonus]  (clipped at max_tokens and after end_id)

EAGLE (Li et al. 2024; ``"feature_tree"``) verifies a tree the same way, but its head reads the
target's features of EVERY accepted position, so the proposer is fed after each step; greedy only::

    prefill      = prompt -> first token + features [T, H];  head state += (features, prompt[1:] + first)
    tree         = static (first num_draft_tokens nodes) or EAGLE-2 dynamic (num_draft_tokens best nodes),
                   at most remaining - 1 deep
    step         = eagle_step: propose, tree_forward, accept_tree_greedy, compact the target cache
    head state  += (features at [root, *accepted path], accepted + [bonus])

EAGLE-3 (Li et al. 2025; ``"feature_chain"``) drafts a chain from the fusion of three target layers;
its module has the step loop (:func:`~specbuild.engine.methods.eagle3.feature_chain_steps`):
a chain verification whose target pass also returns the captured layers, fed to the head after each
step; ``num_draft_tokens`` caps the chain.

Lookahead (Fu et al. 2024; ``"lookahead"``) has no proposer: greedy requests with ``num_draft_tokens >
0`` run :func:`~specbuild.engine.lookahead_decode.lookahead_steps` with the request's
``lookahead_config`` ``(w, n, g)`` (default: the built ``(W, N, G)``; ``(1, 1, 0)``: plain decoding).

Sampled requests (``temperature > 0``) run the same loop with the target's ``[k + 1, vocab]``
distributions instead of its argmax, and speculative sampling instead of token matching
(:func:`~specbuild.engine.acceptance.accept_speculative`): the output is distributed exactly as
plain sampling from the target. Methods marked ``greedy_only`` (Medusa, EAGLE, EAGLE-3, Lookahead) refuse
sampled requests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import target as target_model
from .acceptance import Acceptance, accept_greedy, accept_speculative
from .eagle_decode import feature_tree_steps
from .kv_cache import rollback
from .lookahead_decode import lookahead_steps
from .medusa_decode import tree_steps
from .methods import SpeculativeMethod, get_method
from .methods.base import Draft, MethodContext, Proposer, as_draft
from .methods.eagle3 import feature_chain_steps
from .sampling import Sampler
from .stream import DecodeState, StepOutput, Steps, collect
from .types import GenerationRequest, GenerationResult, InvalidRequestError
from .validation import ResolvedRequest, validate_request


@dataclass(frozen=True)
class EngineLimits:
    """Build-time limits (TensorRT-LLM ``build_config`` names); all counts in tokens except batch size."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_draft_len: int

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_input_len", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineLimits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_draft_len < 0:
            raise ValueError(f"EngineLimits.max_draft_len must be >= 0, got {self.max_draft_len}")


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
    ) -> None:
        """Set up the engine around a loaded target; loads the method's extra models (a draft) if any.

        Args:
            base_dir: where relative paths of ``speculative_config`` resolve (the engine directory).

        Raises:
            ValueError: bad speculative_config, ``max_draft_len`` past the build (for Medusa: more tree
                nodes than the build's max_draft_len), or a draft / Medusa heads that do not fit the
                target (e.g. a different vocab_size or hidden_size).
        """
        self._model = model
        self._limits = limits
        self._end_id = end_id
        self._speculative_config = dict(speculative_config) if speculative_config else None
        self._method: SpeculativeMethod | None = None
        self._method_state: Any = None
        if self._speculative_config is not None:
            self._method = get_method(self._speculative_config)
            config = self._method.parse_config(self._speculative_config)
            _check_draft_len(config.max_draft_len, limits.max_draft_len)
            context = MethodContext(model, None if base_dir is None else Path(base_dir), trust_remote_code)
            self._method_state = self._method.load(config, context)
        self._vocab_size = int(model.config.get_text_config().vocab_size)

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

        Raises:
            FileNotFoundError: no checkpoint at ``checkpoint_dir`` (or at the draft's directory).
            ValueError: unsupported dtype or decoding_type, bad speculative_config keys or values, a draft
                whose vocab_size differs from the target's.
        """
        model = target_model.load_target(
            checkpoint_dir, dtype=dtype, device=device, trust_remote_code=trust_remote_code
        )
        if end_id is None:
            end_id = _default_end_id(model)
        return cls(
            model,
            limits=limits,
            end_id=end_id,
            speculative_config=speculative_config,
            base_dir=base_dir,
            trust_remote_code=trust_remote_code,
        )

    @classmethod
    def from_engine_dir(cls, engine_dir: str | Path, *, device: str = "cpu") -> ReferenceEngine:
        """Load an engine directory written by the builder (``config.json`` + ``target/``, ``draft/`` for
        DraftTarget, ``medusa/`` for Medusa).

        ``speculative_model_dir`` resolves against ``engine_dir``; without one the draft is
        ``engine_dir/draft`` (DraftTarget) and the heads ``engine_dir/medusa`` (Medusa).

        Raises:
            FileNotFoundError: ``engine_dir/config.json``, ``engine_dir/target`` (or the draft) missing.
            ValueError: a required key of config.json is missing (the message names it); a draft whose
                vocab_size differs from the target's.
        """
        engine_dir = Path(engine_dir)
        config_path = engine_dir / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"{config_path} not found: not an engine directory")
        config = json.loads(config_path.read_text())
        build = _require(config, "build_config", config_path)
        limits = EngineLimits(**{k: _require(build, k, config_path) for k in EngineLimits.__dataclass_fields__})
        extra = config.get("specbuild") or {}
        return cls.from_pretrained(
            engine_dir / "target",
            speculative_config=config.get("speculative_config"),
            limits=limits,
            dtype=(config.get("pretrained_config") or {}).get("dtype", "float32"),
            device=device,
            end_id=extra.get("end_id"),
            trust_remote_code=bool(extra.get("trust_remote_code", False)),
            base_dir=engine_dir,
        )

    @property
    def limits(self) -> EngineLimits:
        return self._limits

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

        The request is validated now (errors raise here, before any step); each step runs when the
        iterator is advanced, under ``torch.inference_mode()``, so steps of several requests may be
        interleaved (:class:`~specbuild.engine.scheduler.Scheduler`). Each request owns its KV cache
        and proposer state; the engine's weights are shared read-only.

        Example: ``[s.token_ids for s in engine.generate_stream(GenerationRequest(ids, 8))]`` ->
        ``[[412], [9, 77, 5], [31], [8, 8, 2]]`` (1 + 3 + 1 + 3 = 8 tokens, 3 verification steps).

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
                f"temperature={request.temperature!r}: {self._method.decoding_type} is greedy-only, as in "
                "TensorRT-LLM; send temperature 0 (or None) to this engine"
            )
        self._check_lookahead_config(resolved.lookahead_config)
        if resolved.num_draft_tokens > 0:
            assert self._method is not None
            self._method.check_prompt(self._method_state, resolved.input_ids)
        return _InferenceSteps(self._steps(resolved))

    def _check_lookahead_config(self, window: tuple[int, int, int] | None) -> None:
        """Refuse a ``lookahead_config`` outside the built ``(W, N, G)``, or on an engine without Lookahead."""
        if window is None:
            return
        if self._method is None or self._method.verification != "lookahead":
            running = "no speculation" if self._method is None else self._method.decoding_type
            raise InvalidRequestError(
                f"lookahead_config={window!r}: this engine runs {running}, not Lookahead; send lookahead_config=None"
            )
        try:
            self._method_state.resolve(window)
        except ValueError as exc:
            raise InvalidRequestError(f"lookahead_config={window!r} is out of range: {exc}") from None

    def _steps(self, request: ResolvedRequest) -> Steps:
        """The step generator of the request's decoding path (``num_draft_tokens == 0``: plain chain)."""
        if request.num_draft_tokens == 0:
            return self._chain_steps(request)
        assert self._method is not None
        verification = self._method.verification
        ids, k, end_id, max_tokens = request.input_ids, request.num_draft_tokens, request.end_id, request.max_tokens
        if verification == "chain":
            return self._chain_steps(request)
        assert request.sampling is None
        proposer = self._method.make_proposer(self._method_state)
        if verification == "tree":  # Medusa: the proposer's tree cut to k nodes
            return tree_steps(self._model, proposer, ids, max_tokens=max_tokens, tree=proposer.tree.first(k), end_id=end_id)
        if verification == "feature_tree":  # EAGLE: trees of at most k nodes
            return feature_tree_steps(self._model, proposer.capped(k), ids, max_tokens=max_tokens, end_id=end_id)
        if verification == "feature_chain":  # EAGLE-3: chains of at most k drafts
            return feature_chain_steps(self._model, proposer, ids, max_tokens=max_tokens, num_draft_tokens=k, end_id=end_id)
        assert verification == "lookahead"  # the request's (w, n, g), None -> the built (W, N, G)
        params = self._method_state.resolve(request.lookahead_config)
        return lookahead_steps(self._model, ids, max_tokens=max_tokens, params=params, end_id=end_id)

    def _chain_steps(self, request: ResolvedRequest) -> Steps:
        """Plain decoding (``num_draft_tokens == 0``) or chain speculation, greedy or sampled."""
        cache = target_model.new_cache(self._model)
        sampler = None if request.sampling is None else Sampler(request.sampling, device=self._model.device)
        state = DecodeState(list(request.input_ids), request.max_tokens, request.end_id)
        yield state.first(self._prefill(request.input_ids, cache, sampler))
        proposer = self._new_proposer() if request.num_draft_tokens > 0 else None
        while not state.done:
            yield self._step(state, cache, proposer, request.num_draft_tokens, sampler)

    def _prefill(self, prompt: list[int], cache: Any, sampler: Sampler | None) -> int:
        """The first token: the target's argmax after the prompt, or a sample from its distribution."""
        if sampler is None:
            return target_model.prefill(self._model, prompt, cache)
        logits = target_model.forward_logits(self._model, prompt, cache, num_logits=1)  # [1, vocab]
        return sampler.sample(sampler.probs(logits)[0])

    def _step(
        self,
        state: DecodeState,
        cache: Any,
        proposer: Proposer | None,
        num_draft_tokens: int,
        sampler: Sampler | None,
    ) -> StepOutput:
        """One decoding iteration: propose, verify in one target pass, accept, roll back, emit."""
        # More than remaining - 1 drafts could never be emitted (the bonus token takes the last slot).
        k = min(num_draft_tokens, state.remaining - 1)
        draft = _propose(proposer, state.context, k, sampler)
        acceptance = self._verify(state.context[-1], draft, cache, sampler)
        rollback(cache, len(state.context) + acceptance.num_accepted)
        out = state.step(acceptance.emitted_tokens, drafted=len(draft.tokens), accepted=acceptance.num_accepted)
        if proposer is not None:
            proposer.update(state.context, acceptance.num_accepted)
        return out

    def _verify(self, last_token: int, draft: Draft, cache: Any, sampler: Sampler | None) -> Acceptance:
        """Score ``[last_token, *draft]`` in one target pass; token matching (greedy) or speculative sampling."""
        if sampler is None:
            return accept_greedy(draft.tokens, target_model.verify(self._model, last_token, draft.tokens, cache))
        logits = target_model.verify_logits(self._model, last_token, draft.tokens, cache)  # [k + 1, vocab]
        return accept_speculative(draft.tokens, draft.probs, sampler.probs(logits), sampler=sampler)

    def _new_proposer(self) -> Proposer:
        assert self._method is not None
        return self._method.make_proposer(self._method_state)


class _InferenceSteps:
    """Advances a step generator under ``torch.inference_mode()``, one step at a time.

    A ``with`` inside the generator would stay entered between steps and interleave wrongly with other
    requests' generators (grad mode is per thread, entered and restored like a stack)."""

    def __init__(self, steps: Steps) -> None:
        self._steps = steps

    def __iter__(self) -> _InferenceSteps:
        return self

    def __next__(self) -> StepOutput:
        with torch.inference_mode():
            return next(self._steps)

    def close(self) -> None:
        """Drop the request (its KV cache and proposer state) before its last step."""
        self._steps.close()


def _propose(proposer: Proposer | None, context: list[int], k: int, sampler: Sampler | None) -> Draft:
    """The proposer's draft; greedy requests call ``propose(context, k)`` without a sampler (see Proposer)."""
    if proposer is None or k <= 0:
        return Draft()
    if sampler is None:
        return as_draft(proposer.propose(context, k))
    return as_draft(proposer.propose(context, k, sampler=sampler))


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


def _require(mapping: dict, key: str, path: Path) -> Any:
    if key not in mapping:
        raise ValueError(f"{path}: missing key {key!r}")
    return mapping[key]
