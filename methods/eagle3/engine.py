"""EAGLE-3 draft heads (Li et al. 2025): the on-disk format, the head forward and chain drafting.

EAGLE-3 drafts from a FUSION of three target layers instead of the last feature, and its head feeds its
own output back after the first draft step (training-time test, §3)::

    g_j   = [h^(a)_j ; h^(b)_j ; h^(c)_j]                     [3 Ht]  target decoder-layer OUTPUTS at j
    x_j   = fc(g_j)              (true positions)              [3 Ht] -> [H]
          = o_{j-1}              (draft positions: the head's own previous output, no fc)
    o_j   = x_j + Attn([input_layernorm(embed(c_{j+1})) ; hidden_norm(x_j)])       attention input [2H]
    o_j  += MLP(post_attention_layernorm(o_j))                 ``midlayer``: ONE decoder layer
    p     = softmax(lm_head(norm(o_j)))                        over the draft vocabulary
    token = d + d2t[d]           for draft id d                (draft -> target id offset)

Sources: SafeAILab/EAGLE ``eagle/model/cnets.py`` (``LlamaDecoderLayeremb``: residual = the fused
hidden, ``hidden_norm`` on it, ``input_layernorm`` on the embedding, q/k/v over the 2H concat;
``topK_genrate``: ``lm_head(norm(out_hidden))`` and ``d2t`` added to the draft ids), vLLM
``llama_eagle3.py`` (``midlayer.`` -> ``layers.0.``, ``draft_id_to_target_id``) and TensorRT-LLM
``_torch/speculative`` (``Eagle3SpecMetadata``): the captured layers are ``(1, L // 2 - 1, L - 4)`` of an
``L``-layer target, refused for ``L <= 5`` ("Not enough hidden layers for default EAGLE3 capture"). A
captured layer ``i`` is its output, i.e. ``hidden_states[i + 1]`` in transformers (``[0]`` is the
embedding). Head configs may name their own layers (``eagle_config.eagle_aux_hidden_state_layer_ids``,
as NVIDIA's EAGLE-3 checkpoints do).

Alignment (as EAGLE-1, :mod:`specbuild.methods.eagle.engine`): head position ``j`` reads ``g_j`` and token
``c_{j+1}`` and predicts ``c_{j+2}``; context ``c_0 .. c_{N-1}`` -> the head holds ``N - 1`` true
positions and its last output predicts ``c_N``. Drafting is a CHAIN of ``max_draft_len`` tokens, as
TensorRT-LLM's PyTorch backend drafts EAGLE-3 (a linear tree); draft positions are dropped after each
step and the target's captured features of the accepted tokens replace them.

On disk (a directory; ``speculative_model_dir``, architecture ``LlamaForCausalLMEagle3``)::

    config.json        LlamaConfig-style: hidden_size, intermediate_size, num_attention_heads,
                       num_key_value_heads, rms_norm_eps, max_position_embeddings (num_hidden_layers 1;
                       optional: rope_theta, rope_scaling, head_dim, hidden_act="silu", vocab_size,
                       draft_vocab_size, target_hidden_size, eagle_config.eagle_aux_hidden_state_layer_ids)
    model.safetensors  fc.weight [H, 3 Ht]; midlayer.self_attn.{q,k,v}_proj.weight [*, 2H],
                       midlayer.self_attn.o_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight,
                       midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight [H];
                       norm.weight [H]; lm_head.weight [Vd, H] (absent: the target's lm_head, Vd = V);
                       d2t [Vd] int64 (needed when Vd != V). t2d and embed_tokens.weight are accepted
                       and ignored: the embeddings are the target's.
    (or pytorch_model.bin / model.pt, read only with torch.load(weights_only=True))
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from specbuild.util.atomic import save_safetensors
from specbuild.engine.block import Block
from specbuild.engine.draft_linear import DraftProjection, pack_draft_linears
from specbuild.engine.drafters import EngineMethod, GroupedByProposer, MethodContext, PlainDrafter

from ..eagle.engine import (
    MLP, PT_NAMES, SAFETENSORS_NAME, Attention, CacheView, EagleConfig, HeadCache, LayerKV, RMSNorm, Segment, feed_pending,
)
from ..head_files import HeadFiles, LoadedHead, check_state, known_keys, read_config_json
from ..heads import refuse_unreadable, target_config, torch_dtype
from . import Eagle3Speculation

if TYPE_CHECKING:
    from specbuild.builder.recipe import LoadedRecipe
    from specbuild.engine.sampling import Sampler
    from specbuild.engine.validation import ResolvedRequest

EAGLE3_FILES = HeadFiles(SAFETENSORS_NAME, PT_NAMES)
IGNORED_TENSORS = ("embed_tokens.weight", "t2d")


# --- format --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Eagle3Config:
    """The head's config.json (LlamaConfig names); other keys in the file are ignored.

    Attributes:
        draft_vocab_size: rows of ``lm_head``; None -> ``vocab_size`` (or the target's vocabulary).
        target_hidden_size: width of each captured target layer; None -> ``hidden_size``.
        aux_layer_ids: target layers to capture; None -> TensorRT-LLM's ``(1, L // 2 - 1, L - 4)``.

    Raises (on construction):
        ValueError: as :class:`EagleConfig`; ``num_hidden_layers`` other than 1; not three layer ids.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float
    max_position_embeddings: int
    num_hidden_layers: int = 1
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    vocab_size: int | None = None
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    aux_layer_ids: tuple[int, ...] | None = None

    REQUIRED = (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
        "max_position_embeddings",
    )

    def __post_init__(self) -> None:
        self.layer_config()  # EagleConfig's size checks
        for name in ("draft_vocab_size", "target_hidden_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"EAGLE-3 config {name} must be an integer >= 1, got {value!r}")
        if self.num_hidden_layers != 1:
            raise ValueError(f"EAGLE-3 config num_hidden_layers={self.num_hidden_layers}: the format has one midlayer")
        if self.aux_layer_ids is not None:
            object.__setattr__(self, "aux_layer_ids", tuple(self.aux_layer_ids))
            if len(self.aux_layer_ids) != 3:
                raise ValueError(f"EAGLE-3 fuses three target layers, eagle_aux_hidden_state_layer_ids is {list(self.aux_layer_ids)}")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "config.json") -> Eagle3Config:
        """Pick the known keys of ``raw`` (and ``eagle_config.eagle_aux_hidden_state_layer_ids``).

        Raises:
            ValueError: a required key missing (the message lists them) or a value invalid.
        """
        known = known_keys(cls, raw, where)
        layer_ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if layer_ids is not None:
            known["aux_layer_ids"] = tuple(layer_ids)
        try:
            return cls(**known)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        raw = {k: v for k, v in asdict(self).items() if v is not None and k != "aux_layer_ids"}
        if self.aux_layer_ids is not None:
            raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)}
        return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **raw}

    def layer_config(self) -> EagleConfig:
        """The midlayer's sizes as an :class:`EagleConfig` (one layer), for the shared attention/MLP/rotary."""
        return EagleConfig(
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            num_hidden_layers=1, rms_norm_eps=self.rms_norm_eps, max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta, rope_scaling=self.rope_scaling, head_dim=self.head_dim, hidden_act=self.hidden_act,
        )

    def expected_shapes(self, *, lm_head: bool) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape (``lm_head.weight`` only with ``lm_head``; ``d2t`` is checked apart)."""
        hidden, inter = self.hidden_size, self.intermediate_size
        d = self.layer_config().attention_head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        shapes: dict[str, tuple[int, ...]] = {
            "fc.weight": (hidden, 3 * (self.target_hidden_size or hidden)),
            "midlayer.self_attn.q_proj.weight": (q, 2 * hidden),
            "midlayer.self_attn.k_proj.weight": (kv, 2 * hidden),
            "midlayer.self_attn.v_proj.weight": (kv, 2 * hidden),
            "midlayer.self_attn.o_proj.weight": (hidden, q),
            "midlayer.mlp.gate_proj.weight": (inter, hidden),
            "midlayer.mlp.up_proj.weight": (inter, hidden),
            "midlayer.mlp.down_proj.weight": (hidden, inter),
            "midlayer.input_layernorm.weight": (hidden,),
            "midlayer.hidden_norm.weight": (hidden,),
            "midlayer.post_attention_layernorm.weight": (hidden,),
            "norm.weight": (hidden,),
        }
        if lm_head:
            shapes["lm_head.weight"] = (self.draft_vocab_size or self.vocab_size or -1, hidden)
        return shapes


def load_eagle3_head(head_dir: str | Path, *, dtype: torch.dtype = torch.float32) -> Eagle3Head:
    """Load an EAGLE-3 head from ``head_dir`` (config.json + model.safetensors, or a weights-only .bin/.pt).

    Raises:
        FileNotFoundError: no config.json, or no weight file.
        ValueError: a config key missing or invalid; a tensor missing, unexpected or of the wrong shape;
            ``d2t`` missing for a draft vocabulary, of the wrong length, or mapping outside the vocabulary.
        pickle.UnpicklingError: a .pt/.bin holding anything but tensors (``weights_only=True`` refuses it).
    """
    head_dir = Path(head_dir)
    raw = read_config_json(head_dir, not_a="an EAGLE-3 head directory")
    config = Eagle3Config.from_dict(raw, str(head_dir / "config.json"))
    state = {k: v for k, v in EAGLE3_FILES.read(head_dir).items() if k not in IGNORED_TENSORS}
    config = _with_draft_vocab(config, state)
    _check_state(state, config, head_dir)
    head = Eagle3Head(config, lm_head="lm_head.weight" in state, d2t="d2t" in state)
    head.load_state_dict(state)
    return head.to(dtype=dtype)


def save_eagle3_head(head_dir: str | Path, state: Mapping[str, torch.Tensor], config: Eagle3Config) -> Path:
    """Write ``state`` (e.g. ``Eagle3Head.state_dict()``) and ``config`` as an EAGLE-3 head directory.

    With ``d2t`` and ``config.vocab_size``, ``t2d`` (bool ``[vocab_size]``, :func:`vocab_mapping`) is written
    beside it, as public EAGLE-3 heads store it; a ``t2d`` or ``embed_tokens.weight`` in ``state`` is dropped.

    Raises:
        ValueError: ``state`` does not match ``config`` (as :func:`load_eagle3_head`).
    """
    head_dir = Path(head_dir)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items() if k not in IGNORED_TENSORS}
    config = _with_draft_vocab(config, tensors)
    _check_state(tensors, config, head_dir)
    if "d2t" in tensors and config.vocab_size is not None:  # beside d2t, as public heads store it (every engine skips it)
        tensors["t2d"] = vocab_mapping(torch.arange(len(tensors["d2t"])) + tensors["d2t"], config.vocab_size)[1]
    head_dir.mkdir(parents=True, exist_ok=True)
    save_safetensors(tensors, head_dir / SAFETENSORS_NAME)
    (head_dir / "config.json").write_text(json.dumps(config.to_json(), indent=2) + "\n")
    return head_dir


def vocab_mapping(target_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A draft vocabulary's ``d2t`` and ``t2d`` as public EAGLE-3 heads store them.

    Draft id ``d`` is target id ``d + d2t[d]``; ``t2d[t]`` is True for the target ids the draft vocabulary
    holds. Sources (what each loader reads): SafeAILab/EAGLE ``eagle/traineagle3/cnets.py`` (builds them from
    the sorted used tokens: ``d2t = used - arange``, ``t2d = isin(arange(V), used)``); vLLM@00bd149
    ``vllm/model_executor/models/llama_eagle3.py`` (``d2t`` -> ``draft_id_to_target_id``, target ids
    ``arange(Vd) + d2t``; ``t2d`` skipped); SGLang@03d5a77 ``python/sglang/srt/models/llama_eagle3.py``
    (``hot_token_id = d2t + arange``; ``t2d`` skipped); TensorRT-LLM@00679c6
    ``tensorrt_llm/_torch/models/modeling_speculative.py`` (``Eagle3ForCausalLM``: ``d2t`` of length
    ``draft_vocab_size`` when it differs from ``vocab_size``).

    Args:
        target_ids: ``[Vd]`` distinct target ids in ``[0, vocab_size)``, the draft vocabulary in draft-id
            order (ascending, as EAGLE-3's trainer writes it: offsets are then >= 0).
        vocab_size: the target's vocabulary ``V``.

    Returns:
        ``(d2t [Vd] int64, t2d [V] bool)``. Example: target ids ``[2, 5, 6]``, V = 8 -> d2t ``[2, 4, 4]``,
        t2d ``[F, F, T, F, F, T, T, F]``.

    Raises:
        ValueError: an id outside ``[0, vocab_size)`` or repeated.
    """
    ids = torch.as_tensor(target_ids, dtype=torch.long).flatten()
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size or ids.unique().numel() != ids.numel():
        raise ValueError(f"a draft vocabulary must list distinct target ids in [0, {vocab_size}); got {ids.numel()} id(s)"
                         + (f" in [{int(ids.min())}, {int(ids.max())}]" if ids.numel() else ""))
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(len(ids)), t2d


def _with_draft_vocab(config: Eagle3Config, state: Mapping[str, torch.Tensor]) -> Eagle3Config:
    """``config`` with ``draft_vocab_size`` taken from ``lm_head.weight`` when the config lacks it."""
    if config.draft_vocab_size is None and "lm_head.weight" in state:
        return Eagle3Config(**{**asdict(config), "draft_vocab_size": int(state["lm_head.weight"].shape[0])})
    return config


def _check_state(state: Mapping[str, torch.Tensor], config: Eagle3Config, where: Path) -> None:
    lm_head = "lm_head.weight" in state
    mismatch = "EAGLE-3 weights (fc, midlayer.*, norm, lm_head, d2t) do not match"
    check_state(state, config.expected_shapes(lm_head=lm_head), where, mismatch=mismatch, extra=("d2t",))
    draft_vocab = config.draft_vocab_size
    if "d2t" in state:
        d2t = state["d2t"]
        if not lm_head:
            raise ValueError(f"{where}: d2t without lm_head.weight (d2t maps the head's own draft vocabulary)")
        if d2t.dtype not in (torch.int64, torch.int32) or tuple(d2t.shape) != (draft_vocab,):
            raise ValueError(f"{where}: d2t must be an integer tensor of length draft_vocab_size={draft_vocab}, got {d2t.dtype} {tuple(d2t.shape)}")
        targets = torch.arange(draft_vocab) + d2t.long()
        vocab = config.vocab_size
        if int(targets.min()) < 0 or (vocab is not None and int(targets.max()) >= vocab):
            raise ValueError(f"{where}: d2t maps draft ids outside the target vocabulary [0, {vocab})")
    elif lm_head and config.vocab_size is not None and draft_vocab != config.vocab_size:
        raise ValueError(f"{where}: draft_vocab_size={draft_vocab} != vocab_size={config.vocab_size} needs d2t")


# --- the head ------------------------------------------------------------------------------------


class WideAttention(Attention):
    """Llama attention whose q/k/v read the ``[2H]`` concat ``[embedding ; hidden]``; o_proj writes ``[H]``."""

    def __init__(self, config: EagleConfig) -> None:
        super().__init__(config)
        wide, d = 2 * config.hidden_size, self.head_dim
        self.q_proj = nn.Linear(wide, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(wide, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(wide, self.num_kv_heads * d, bias=False)


class MidLayer(nn.Module):
    """EAGLE-3's one decoder layer (cnets.py ``LlamaDecoderLayeremb``)."""

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        self.self_attn = WideAttention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor, past: CacheView | LayerKV | None,
    ) -> tuple[torch.Tensor, LayerKV]:
        """``embeds, hidden [S, H]`` -> pre-norm output ``[S, H]``, the ``S`` new positions' KV."""
        out, (new,) = self.forward_segments(embeds, hidden, rotary, [Segment(0, embeds.shape[0], mask, past)])
        return out, new

    def forward_segments(
        self, embeds: torch.Tensor, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
        segments: Sequence[Segment],
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        """Several requests' rows (``[S, H]`` each input), attention per :class:`Segment` (``past``: its
        :class:`CacheView`) -> ``[S, H]``, each segment's new KV."""
        wide = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # [S, 2H]
        attended, new = self.self_attn(wide, rotary, segments)
        x = hidden + attended  # residual: the un-normed hidden input
        return x + self.mlp(self.post_attention_layernorm(x)), new


class Eagle3Head(nn.Module):
    """fc + midlayer + norm (+ lm_head, d2t); ``state_dict()`` keys are the on-disk names. KV passed in and out."""

    def __init__(self, config: Eagle3Config, *, lm_head: bool = True, d2t: bool = False) -> None:
        """Raises: ValueError if ``lm_head`` without a ``draft_vocab_size`` / ``vocab_size`` in ``config``."""
        super().__init__()
        layer = config.layer_config()
        self.config = config
        self.fc = nn.Linear(3 * (config.target_hidden_size or config.hidden_size), config.hidden_size, bias=False)
        self.midlayer = MidLayer(layer)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(layer.rotary_config())
        draft_vocab = config.draft_vocab_size or config.vocab_size
        if lm_head:
            if draft_vocab is None:
                raise ValueError("an EAGLE-3 lm_head needs draft_vocab_size (or vocab_size) in the config")
            self.lm_head = nn.Linear(config.hidden_size, draft_vocab, bias=False)
        if d2t:
            self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        past: CacheView | LayerKV | None = None,
    ) -> tuple[torch.Tensor, LayerKV]:
        """Pre-norm outputs for ``S`` new positions.

        Args:
            embeds: ``[S, H]`` target token embeddings of ``c_{j+1}``.
            hidden: ``[S, H]`` ``fc(fused target features)`` (true positions) or the head's own previous
                outputs (draft positions).
            positions: ``[S]`` long, rotary positions ``j``.
            mask: ``[S, P + S]`` bool, True where new position ``s`` may attend.
        """
        out, (new,) = self.forward_segments(embeds, hidden, positions, [Segment(0, embeds.shape[0], mask, past)])
        return out, new

    def forward_segments(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, segments: Sequence[Segment]
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        """:meth:`forward` for several requests at once: their rows concatenated (``[S, H]``, ``[S]``),
        each request a :class:`Segment` whose ``past`` is its :class:`CacheView` (or None). The linear layers
        run once over all rows, attention per segment, so a request's outputs do not depend on the
        others' (on CPU, with packed linears: the same bits as alone).

        Returns:
            ``([S, H]`` pre-norm outputs, per segment the new positions' KV``)``.
        """
        cos, sin = self.rotary(hidden, positions[None])  # [1, S, d] each
        return self.midlayer.forward_segments(embeds, hidden, (cos[0].to(hidden.dtype), sin[0].to(hidden.dtype)), segments)


# --- drafting ------------------------------------------------------------------------------------


def default_capture_layers(num_layers: int) -> tuple[int, int, int]:
    """TensorRT-LLM's default EAGLE-3 capture: ``(1, L // 2 - 1, L - 4)``, e.g. 8 layers -> (1, 3, 4).

    Raises:
        ValueError: ``num_layers <= 5`` (TensorRT-LLM refuses it the same way).
    """
    if num_layers <= 5:
        raise ValueError(f"Not enough hidden layers for default EAGLE3 capture: the target has {num_layers} (needs > 5)")
    return (1, num_layers // 2 - 1, num_layers - 4)


def capture_layers_for(config: Eagle3Config, num_layers: int) -> tuple[int, ...]:
    """The target layers the head fuses: its ``aux_layer_ids`` or :func:`default_capture_layers`.

    Raises:
        ValueError: a target too shallow for the default, or a layer id outside ``[0, num_layers)``.
    """
    layers = config.aux_layer_ids or default_capture_layers(num_layers)
    if not all(0 <= i < num_layers for i in layers):
        raise ValueError(f"EAGLE-3 capture layers {list(layers)} are not layers of a {num_layers}-layer target")
    return tuple(layers)


def check_vocab_fits(head: Eagle3Head, vocab_size: int) -> None:
    """Refuse a head whose drafts cannot be target ids: a draft vocabulary of another size without
    ``d2t``, or ``d2t`` mapping past the target vocabulary.

    Raises:
        ValueError: naming both sizes.
    """
    if head.config.vocab_size not in (None, vocab_size):
        raise ValueError(f"EAGLE-3 head vocab_size {head.config.vocab_size} != target vocabulary {vocab_size}")
    lm_head, d2t = getattr(head, "lm_head", None), getattr(head, "d2t", None)
    if lm_head is not None and d2t is None and lm_head.out_features != vocab_size:
        raise ValueError(f"EAGLE-3 head drafts over {lm_head.out_features} tokens, the target has {vocab_size}: it needs d2t")
    if d2t is not None and int((torch.arange(len(d2t), device=d2t.device) + d2t).max()) >= vocab_size:
        raise ValueError(f"EAGLE-3 head d2t maps draft ids outside the target vocabulary of {vocab_size}")


@dataclass
class Eagle3State:
    """One request's head state: KV of every true position (``P`` = context length - 1, in a
    :class:`~specbuild.methods.eagle.engine.HeadCache` made at the first update) and the last output."""

    cache: HeadCache | None = None
    last_output: torch.Tensor | None = None  # [H] pre-norm, predicts the root's successor

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self.cache.length

    @property
    def kv(self) -> LayerKV | None:
        """The committed keys and values (views of :attr:`cache`), or None before the first update."""
        return None if self.cache is None else self.cache.layer(0)


class Eagle3Proposer:
    """Drafts chains for requests of one target (stateless itself; per-request :class:`Eagle3State`).

    Use: ``state = proposer.new_state()``; ``proposer.update(state, tokens, proposer.capture(hidden_states))``
    with the prefill's hidden states; then per step ``draft = proposer.propose(state, k)``, verify, and
    ``update`` with the captured features of the root and the accepted tokens.
    """

    def __init__(self, target: PreTrainedModel, head: Eagle3Head, *, max_draft_len: int, weight_dtype: torch.dtype | None = None) -> None:
        """``weight_dtype``: what the draft's vocabulary projection (the head's own lm_head, else the target's)
        packs its weight as (:class:`~specbuild.engine.draft_linear.DraftProjection`, a copy of its own, as
        EAGLE's: one more ``[Vd, H]`` weight in memory); None: its own dtype.

        Raises: ValueError if the head does not fit the target (hidden size, vocabulary, captured layers)."""
        text = target.config.get_text_config()
        embedding = target.get_input_embeddings()
        vocab, hidden = embedding.weight.shape
        c = head.config
        if c.hidden_size != hidden or (c.target_hidden_size or c.hidden_size) != text.hidden_size:
            raise ValueError(
                f"EAGLE-3 head hidden_size {c.hidden_size} (target_hidden_size {c.target_hidden_size}) != target hidden_size {hidden}"
            )
        check_vocab_fits(head, vocab)
        self.capture_layers = capture_layers_for(c, text.num_hidden_layers)
        if max_draft_len < 1:
            raise ValueError(f"max_draft_len must be >= 1, got {max_draft_len}")
        self.embedding, self.head, self.max_draft_len = embedding, head, max_draft_len
        self.lm_head = head.lm_head if hasattr(head, "lm_head") else target.get_output_embeddings()
        # the draft's logits only (the target's come from its forward): a packed copy, as EAGLE's and Medusa's
        self._project = DraftProjection(self.lm_head, None, weight_dtype)
        self._dtype = head.fc.weight.dtype  # kept: the engine then prepacks the head's linears (no .weight)

    @property
    def batch_key(self) -> Eagle3Head:
        """Proposers of one head draft their requests together (:func:`update_batch`, :func:`propose_batch`)."""
        return self.head

    @staticmethod
    def new_state() -> Eagle3State:
        return Eagle3State()

    def capture(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        """transformers' ``hidden_states`` (``L + 1`` of ``[1, S, Ht]``) -> fused features ``[S, 3 Ht]``."""
        return torch.cat([hidden_states[i + 1][0] for i in self.capture_layers], dim=-1)

    def update(self, state: Eagle3State, next_tokens: Sequence[int], features: torch.Tensor) -> None:
        """Append ``m`` true positions: ``features [m, 3 Ht]`` paired with the tokens they produced
        (:func:`update_batch` for one request).

        Raises:
            ValueError: ``features`` has not ``m`` rows.
        """
        update_batch(self, [state], [next_tokens], [features])

    def propose(self, state: Eagle3State, num_draft_tokens: int) -> list[int]:
        """A greedy chain of ``min(num_draft_tokens, max_draft_len)`` target token ids; ``state`` is unchanged
        (:func:`propose_batch` for one request).

        Depth 1 reads the cached last output; each further depth runs the head on ``[embed(previous
        draft) ; previous output]`` at the next position, attending to the true cache and the chain.

        Raises:
            ValueError: ``state`` was never updated (no prefill features).
        """
        return propose_batch(self, [state], [num_draft_tokens])[0]

    def _greedy_tokens(self, outputs: torch.Tensor) -> list[int]:
        """``[B, H]`` pre-norm head outputs -> each row's argmax draft id as a target id (``d2t``)."""
        logits = self._project(self.head.norm(outputs))  # [B, Vd]
        draft_ids = logits.argmax(dim=-1)
        if hasattr(self.head, "d2t"):
            draft_ids = draft_ids + self.head.d2t[draft_ids]
        return draft_ids.tolist()

    def _sampled_tokens(self, outputs: torch.Tensor, samplers: Sequence[Sampler]) -> tuple[list[int], list[torch.Tensor]]:
        """``[B, H]`` pre-norm head outputs -> per row a target id drawn from the head's distribution ``q``
        under the row's sampling parameters (temperature, top-k, top-p, as the target's ``p``), and that
        ``q`` over the target vocabulary (``[V]``, zero outside the draft vocabulary): what speculative
        sampling needs to accept the draft with probability ``min(1, p / q)``."""
        logits = self._project(self.head.norm(outputs)).float()  # [B, Vd]
        vocab = self.embedding.weight.shape[0]
        d2t = getattr(self.head, "d2t", None)
        tokens, probs = [], []
        for row, sampler in zip(logits, samplers):
            q_draft = sampler.probs(row[None])[0]  # [Vd]
            draft_id = sampler.sample(q_draft)
            if d2t is None:
                tokens.append(draft_id)
                probs.append(q_draft)
                continue
            q = q_draft.new_zeros(vocab)  # [V]
            q[torch.arange(len(d2t), device=d2t.device) + d2t] = q_draft
            tokens.append(draft_id + int(d2t[draft_id]))
            probs.append(q)
        return tokens, probs


def update_batch(
    proposer: Eagle3Proposer, states: Sequence[Eagle3State], tokens: Sequence[Sequence[int]], features: Sequence[torch.Tensor]
) -> None:
    """:meth:`Eagle3Proposer.update` for several requests of one head in one head call: request ``r``
    appends ``len(tokens[r])`` true positions from ``features[r] [m_r, 3 Ht]``; each attends to its own
    cache only, so every state ends as :meth:`~Eagle3Proposer.update` alone leaves it.

    Raises:
        ValueError: a request whose tokens and features differ in length.
    """
    device = proposer.embedding.weight.device
    segments, positions, start = [], [], 0
    for state, toks, feats in zip(states, tokens, features, strict=True):
        m, past = len(toks), state.length
        if feats.shape[0] != m:
            raise ValueError(f"EAGLE-3 update: {m} tokens but {feats.shape[0]} feature rows")
        mask = torch.ones(m, past + m, dtype=torch.bool, device=device).tril(diagonal=past)  # causal
        if state.cache is None:
            state.cache = HeadCache.of([proposer.head.midlayer.self_attn], dtype=proposer._dtype, device=device)
        segments.append(Segment(start, start + m, mask, state.cache.view(past, m)))
        positions.append(torch.arange(past, past + m, device=device))
        start += m
    ids = torch.tensor([t for toks in tokens for t in toks], dtype=torch.long, device=device)
    fused = proposer.head.fc(torch.cat([f.to(proposer._dtype) for f in features]))  # [S, 3 Ht] -> [S, H]
    out, _ = proposer.head.forward_segments(proposer.embedding(ids), fused, torch.cat(positions), segments)
    for state, seg in zip(states, segments):
        state.cache.commit(seg.stop - seg.start)
        state.last_output = out[seg.stop - 1]


def propose_batch(proposer: Eagle3Proposer, states: Sequence[Eagle3State], num_draft_tokens: Sequence[int],
                  samplers: Sequence[Sampler | None] | None = None, probs: list[list[torch.Tensor]] | None = None) -> list[list[int]]:
    """:meth:`Eagle3Proposer.propose` for several requests of one head: per chain depth, one draft
    projection over every request still drafting and one head call (a :class:`Segment` per request,
    attending to its own cache and chain). Request ``r`` gets ``min(num_draft_tokens[r], max_draft_len)``
    tokens, the chain it gets alone; states are unchanged.

    ``samplers[r]`` (sampled requests, ``use_rejection_sampling``): request ``r``'s drafts are drawn from
    the head's distribution under its sampling parameters, each depth's ``q`` (``[V]``) appended to
    ``probs[r]``; other rows draft greedily (argmax).

    Raises:
        ValueError: a state never updated (no prefill features).
    """
    if any(s.last_output is None for s in states):
        raise ValueError("Eagle3State has no features yet: call update() with the prefill's features first")
    ks = [min(k, proposer.max_draft_len) for k in num_draft_tokens]
    samplers = list(samplers) if samplers is not None else [None] * len(states)
    chains: list[list[int]] = [[] for _ in states]
    outputs = {r: s.last_output for r, s in enumerate(states) if ks[r] > 0}
    depth = 1
    while outputs:
        rows = list(outputs)
        stacked = torch.stack([outputs[r] for r in rows])  # [b, H]
        sampled = [i for i, r in enumerate(rows) if samplers[r] is not None]
        tokens = proposer._greedy_tokens(stacked) if len(sampled) < len(rows) else [0] * len(rows)
        if sampled:
            drawn, qs = proposer._sampled_tokens(stacked[sampled], [samplers[rows[i]] for i in sampled])
            for i, token, q in zip(sampled, drawn, qs):
                tokens[i] = token
                probs[rows[i]].append(q)
        for r, token in zip(rows, tokens):
            chains[r].append(token)
        rows = [r for r in rows if ks[r] > depth]
        if not rows:
            break
        device = outputs[rows[0]].device
        # chain node `depth` goes after the true positions and the depth - 1 nodes before it (uncommitted)
        segments = [Segment(i, i + 1, torch.ones(1, states[r].length + depth, dtype=torch.bool, device=device),
                            states[r].cache.view(states[r].length + depth - 1, 1)) for i, r in enumerate(rows)]
        positions = torch.tensor([states[r].length + depth - 1 for r in rows], device=device)
        ids = torch.tensor([chains[r][-1] for r in rows], dtype=torch.long, device=device)
        out, _ = proposer.head.forward_segments(
            proposer.embedding(ids), torch.stack([outputs[r] for r in rows]), positions, segments
        )
        outputs = {r: out[i] for i, r in enumerate(rows)}
        depth += 1
    return chains


# --- the reference engine's side of "eagle3": settings -> head loaded once -> proposer ----------------

@dataclass(frozen=True)
class LoadedEagle3(LoadedHead[Eagle3Speculation, Any]):
    """The engine state of "Eagle3": an :class:`Eagle3Proposer` or (dynamic tree) ``Eagle3TreeProposer``,
    and with ``sa_config`` the suffix automata of the SA enhancer (an :class:`~specbuild.methods.sa.engine.SAPool`)."""

    sa_pool: Any = None


class SAOverride:
    """TensorRT-LLM's SA draft enhancer (``sa_config``; ``tensorrt_llm/_torch/speculative/sa_enhancer.py``,
    ``SADraftEnhancer``) for one request: after the head has drafted its chain, the whole chain is replaced
    by the suffix automaton's continuation when the context's longest earlier-matched suffix is at least
    ``threshold`` tokens long (per request, per step, all positions or none; the head never sees SA
    tokens). The automaton follows the request's context, as :class:`~specbuild.methods.sa.engine.SAProposer`."""

    def __init__(self, pool: Any, threshold: int) -> None:
        from ..sa.engine import SAProposer

        self.proposer, self.threshold = SAProposer(pool), threshold
        self.overrides = 0  # steps whose chain was the automaton's
        self.generating = False  # TensorRT-LLM overrides generation requests only: not the drafts made with the prefill

    def apply(self, context: Sequence[int], chain: list[int]) -> list[int] | None:
        """The automaton's chain of at most ``len(chain)`` tokens if its match is long enough, else None
        (always None for the first draft, made with the prefill, before any :meth:`follow`)."""
        length, draft = self.proposer.match(context, len(chain))
        if not self.generating or not chain or length < self.threshold or not draft:
            return None
        self.overrides += 1
        return draft

    def follow(self, context: Sequence[int]) -> None:
        """After a verified step: the automaton takes the emitted tokens (the global pool sees them at once)."""
        self.proposer.update(context, 0)
        self.generating = True


def load_eagle3(config: Eagle3Speculation, context: MethodContext) -> LoadedEagle3:
    """Load the head from ``config.eagle_model`` in the target's dtype and device; it drafts chains of
    ``config.max_draft_len``, or with ``use_dynamic_tree`` EAGLE-2's dynamic trees
    (:class:`~specbuild.methods.eagle3.tree.Eagle3TreeProposer`); ``eagle3_one_model`` changes nothing in
    one process. With ``sa_config`` the engine keeps the SA enhancer's suffix automata (:class:`SAOverride`).

    Raises:
        FileNotFoundError / ValueError: as :func:`load_eagle3_head`; a head that does not fit the target;
            for a tree, a target attention that cannot take a tree mask or ``dynamic_tree_max_topK`` above
            the draft vocabulary.
    """
    target = context.target
    path = Path(config.eagle_model)
    head = load_eagle3_head(path, dtype=target.dtype).to(target.device)
    proposer = Eagle3Proposer(target, head, max_draft_len=config.max_draft_len, weight_dtype=context.draft_weight_dtype)
    if config.use_dynamic_tree:
        from ..head_files import check_tree_attention
        from .tree import Eagle3TreeProposer, eagle3_tree_config

        check_tree_attention(target, "EAGLE-3")
        proposer = Eagle3TreeProposer(proposer, eagle3_tree_config(config))
    own = getattr(head, "lm_head", None)  # projected by the proposer's packed copy: not packed twice
    if own is not None:
        del head.lm_head
    pack_draft_linears(head, context.draft_weight_dtype)
    if own is not None:
        head.lm_head = own
    sa_pool = None
    if config.sa_config is not None:  # chains only: the recipe refuses sa_config with use_dynamic_tree
        from ..sa import SASpeculation
        from ..sa.engine import SAPool

        sa_pool = SAPool(SASpeculation(method="sa", max_draft_len=config.max_draft_len,
                                       enable_global_pool=config.sa_config.enable_global_pool), context.max_batch_size)
    return LoadedEagle3(config, proposer, path, sa_pool)


# --- drafting: a request's chains from the fusion of captured target layers ---------------------------


class FeatureChainDrafter(PlainDrafter):
    """An EAGLE-3 proposer's chains (:class:`Eagle3Proposer`, or one with its ``capture`` / ``new_state`` /
    ``update`` / ``propose``), fed the fusion of captured target layers after every step; drafts alone.

    A step's captured features wait in :attr:`pending` until the next draft, so that the requests of
    one head feed them and draft their chains in shared head calls (:class:`Eagle3Drafter`).
    """

    wants_hidden = True
    rejection_sampling = False  # sampled requests draw their drafts from the head's q (use_rejection_sampling)

    def __init__(self, proposer: Any, num_draft_tokens: int, sa: SAOverride | None = None) -> None:
        self.proposer, self.k, self.sa = proposer, num_draft_tokens, sa
        self.state = proposer.new_state()
        self.pending: tuple[list[int], torch.Tensor] | None = None  # (tokens, fused features [m, 3 Ht]) not yet fed

    def _block(self, context, chain: list[int], probs: list[torch.Tensor] | None) -> Block:
        """The step's block: the head's chain (with its ``q`` rows when drawn from it), or the SA enhancer's
        (deterministic: one-hot ``q``, exact-match verification)."""
        if self.sa is not None:
            override = self.sa.apply(context, chain)
            if override is not None:
                return Block.chain(context[-1], override)
        return Block.chain(context[-1], chain, torch.stack(probs) if probs else None)

    def _features(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.proposer.capture([h[None] for h in hidden_states])  # [T, 3 Ht]

    def start(self, prompt, first_token, hidden_states) -> None:
        self.pending = ([*prompt[1:], first_token], self._features(hidden_states))

    def draft(self, context, *, max_accept, sampler) -> Block:
        if self.pending is not None:
            self.proposer.update(self.state, *self.pending)
            self.pending = None
        if sampler is not None and self.rejection_sampling:
            probs: list[list[torch.Tensor]] = [[]]
            (chain,) = propose_batch(self.proposer, [self.state], [min(self.k, max_accept)], [sampler], probs)
            return self._block(context, chain, probs[0])
        return self._block(context, self.proposer.propose(self.state, min(self.k, max_accept)), None)

    def update(self, context, step) -> None:
        self.pending = (step.emitted, self._features(step.hidden_states)[step.keep])
        if self.sa is not None:
            self.sa.follow(context)


class Eagle3Drafter(GroupedByProposer, FeatureChainDrafter):
    """The engine's head (an :class:`Eagle3Proposer`): the requests of one head feed their features and
    draft their chains in shared head calls (a :class:`~specbuild.engine.drafters.BatchDrafter`)."""

    proposer: Eagle3Proposer

    @classmethod
    def draft_batch(cls, drafters: Sequence[Eagle3Drafter], contexts, *, max_accepts, samplers) -> list[Block]:
        """:meth:`draft` for requests of one head: one head call feeds every pending feature, then one
        draft projection and one head call per chain depth for all of them."""
        feed_pending(drafters, update_batch)
        samplers = [s if d.rejection_sampling else None for d, s in zip(drafters, samplers)]
        probs: list[list[torch.Tensor]] = [[] for _ in drafters]
        chains = propose_batch(drafters[0].proposer, [d.state for d in drafters],
                               [min(d.k, m) for d, m in zip(drafters, max_accepts)], samplers, probs)
        return [d._block(c, chain, q) for d, c, chain, q in zip(drafters, contexts, chains, probs)]


def make_drafter(loaded: LoadedEagle3, request: ResolvedRequest) -> Eagle3Drafter:
    """A request's drafter: the engine's head drafting chains of at most ``num_draft_tokens``, or (dynamic
    tree) trees of at most ``num_draft_tokens`` nodes, EAGLE-2's reranking keeping the best.

    Sampled requests (``temperature > 0``) draft chains (speculative sampling verifies chains; a
    tree engine's sampled requests use its head's chain, of at most ``max_draft_len`` tokens) and are
    verified by :func:`~specbuild.engine.acceptance.accept_speculative`, so their tokens are distributed
    exactly as the target's (Leviathan et al. 2023, §2.3). With ``sa_config`` (chains only) a request's
    chain is the suffix automaton's when its match reaches the threshold (:class:`SAOverride`). With
    ``use_rejection_sampling`` (TensorRT-LLM's ``DecodingBaseConfig`` field) the drafts are drawn from
    the head's distribution ``q`` and accepted with probability ``min(1, p / q)``; without it they are
    the head's argmax, accepted when the target's sample matches (one-hot ``q``: TensorRT-LLM's
    exact-match verification of non-greedy requests; also an SA chain's)."""
    from .tree import Eagle3TreeDrafter, Eagle3TreeProposer

    sampled = request.sampling is not None  # None: greedy (validation maps temperature 0 / top_k 1 to None)
    proposer = loaded.proposer
    if isinstance(proposer, Eagle3TreeProposer):
        if not sampled:
            return Eagle3TreeDrafter(proposer.capped(request.num_draft_tokens))
        proposer = proposer.chain
    sa = None if loaded.sa_pool is None else SAOverride(loaded.sa_pool, loaded.config.sa_config.threshold)
    drafter = Eagle3Drafter(proposer, request.num_draft_tokens, sa)
    drafter.rejection_sampling = sampled and loaded.config.use_rejection_sampling
    return drafter


ENGINE = EngineMethod(make_drafter=make_drafter, load=load_eagle3)
"""The head loaded once per engine; chains (or dynamic trees) of at most ``num_draft_tokens`` drafts per request."""


# --- the builder: the head checked and written into the engine directory -----------------------------


def read_for_build(loaded: LoadedRecipe, head_dir: Path, target_dir: Path):
    """:attr:`~specbuild.methods.ReferenceWeights.load`: the ``Eagle3Head`` in the target's dtype, its draft vocabulary's ``d2t`` checked against the target's.

    Raises:
        RecipeError: a malformed head directory or a ``d2t`` outside the target's vocabulary.
    """
    vocab = target_config(target_dir).get("vocab_size")

    def read():
        head = load_eagle3_head(head_dir, dtype=torch_dtype(loaded.recipe.target.dtype))
        if vocab is not None:
            check_vocab_fits(head, vocab)
        return head

    return refuse_unreadable(loaded, "eagle_model", read)


def write_for_build(loaded: LoadedRecipe, head, out: Path, *, log) -> None:
    """:attr:`~specbuild.methods.ReferenceWeights.write`: the head into the engine directory."""
    del loaded
    c = head.config
    log(f"writing the EAGLE-3 head (midlayer, hidden_size={c.hidden_size}, draft vocabulary {c.draft_vocab_size or c.vocab_size})")
    save_eagle3_head(out, head.state_dict(), c)

