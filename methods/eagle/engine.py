"""EAGLE-1/2 draft heads (Li et al. 2024): the on-disk format, the head forward, and tree drafting.

EAGLE (§3) drafts at the *feature* level: the head reads the target's feature at position ``j`` together
with the embedding of the token at ``j + 1`` and predicts the feature at ``j + 1``; the target's own LM
head turns a predicted feature into a token distribution::

    x_j   = fc([embed(c_{j+1}) ; f_j])                    [2H] -> [H]
    f'_j  = DecoderLayers(x_0 .. x_j)                      causal, rotary position j, the head's own KV cache
    p     = softmax(lm_head(f'_j))                         distribution of c_{j+2} (no final norm)

The feature ``f_j`` is the target's last hidden state AFTER its final norm, i.e. the LM head's input:
SafeAILab/EAGLE ``ea_model.py`` takes ``outputs[0]`` of ``base_model.model`` (LlamaModel, which ends with
``self.norm``) and ``cnets1.py`` applies ``lm_head`` to the head's output directly. That is
``TreeForward.hidden`` / ``hidden_states[-1]`` in transformers, so verification needs no extra pass.

Worked alignment, context ``c_0 .. c_{N-1}`` with root ``c_{N-1}`` (the last emitted token, not yet in the
target's cache)::

    head position  | 0          1          ...  N-2
    token input    | c_1        c_2        ...  c_{N-1} (the root)
    feature input  | f_0        f_1        ...  f_{N-2}
    output         | f'_0 ...                   f'_{N-2} -> lm_head -> depth-1 candidates (c_N)

A depth-``d`` draft node with token ``t`` sits at head position ``N - 2 + d``, reads ``[embed(t) ;
output of its parent]`` and attends to the cache and its own draft ancestors; its output gives its
children's candidates. Draft positions are dropped after each step; the target's true features of the
accepted tokens replace them (:meth:`EagleProposer.update`).

Trees:
- static (``eagle_choices``, TensorRT-LLM; depth must equal ``num_eagle_layers``, TensorRT-LLM#2588):
  child index ``c`` of a node holds the ``c``-th most likely token of that node's head distribution.
- dynamic (EAGLE-2, Li et al. 2024b, §4; ``use_dynamic_tree`` + ``dynamic_tree_max_topK`` = K): expand the
  root's top-K children, then at every further depth the K nodes with the highest cumulative draft
  log-probability each get their top-K children; finally keep the ``max_draft_len`` best nodes of all
  generated (reranking), which is a connected tree because a child never scores above its parent.

In an engine, the requests of one head draft together (:class:`EagleDrafter`; :func:`update_batch`,
:func:`propose_batch`): per tree depth one head call over every request's frontier, each request
attending to its own cache (:class:`Segment`), and one draft projection; each request gets the tree it
gets alone. One step of a request::

    slot holds context[:-1]; head state holds (f_j, c_{j+1}) for j < len(context) - 1
    draft      = proposer.propose(state, root=context[-1])        static or EAGLE-2 dynamic tree, 1 + n tokens
    target     = one pass over the tree (ancestor mask)
    accepted   = longest root-to-node path matching the target's argmax; bonus = argmax at its end
    slot       = keep prefix + root + accepted path
    head state += (features at [root, *accepted], [*accepted tokens, bonus])

On disk (a directory; TensorRT-LLM ``examples/eagle/convert_checkpoint.py --eagle_model_dir``)::

    config.json        LlamaConfig-style: hidden_size, intermediate_size, num_attention_heads,
                       num_key_value_heads, num_hidden_layers, rms_norm_eps, max_position_embeddings
                       (optional: rope_theta, rope_scaling, head_dim, hidden_act="silu", vocab_size)
    model.safetensors  fc.weight [H, 2H] (+ fc.bias [H], EAGLE-1's default), and per layer N
                       layers.N.self_attn.{q,k,v,o}_proj.weight, layers.N.mlp.{gate,up,down}_proj.weight,
                       layers.N.post_attention_layernorm.weight, layers.N.input_layernorm.weight (N > 0
                       only: the first layer has none, its input is fc's output); no final norm.
                       embed_tokens.weight (EAGLE's checkpoints carry a frozen copy) is accepted and
                       ignored: embeddings and lm_head are the target's.
    (or pytorch_model.bin / model.pt, read only with torch.load(weights_only=True))
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import (
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from specbuild.util.atomic import save_safetensors
from specbuild.engine.block import Block
from specbuild.engine.draft_linear import DraftProjection, pack_draft_linears
from specbuild.engine.drafters import EngineMethod, GroupedByProposer, MethodContext, PlainDrafter
from specbuild.engine.kv_pool import KVCache, KVPool, KVShape
from specbuild.engine.tree import SpecTree
from specbuild.methods.base import MC_SIM_7B_63

from ..head_files import HeadFiles, LoadedHead, check_state, check_tree_attention, known_keys, read_config_json
from ..heads import refuse_unreadable, torch_dtype
from ..token_map import load_token_ids
from . import WEIGHT_FILES, EagleSpeculation

if TYPE_CHECKING:
    from specbuild.builder.recipe import LoadedRecipe
    from specbuild.engine.validation import ResolvedRequest

SAFETENSORS_NAME, PT_NAMES = WEIGHT_FILES[0], WEIGHT_FILES[1:]
EAGLE_FILES = HeadFiles(SAFETENSORS_NAME, PT_NAMES)
IGNORED_TENSORS = ("embed_tokens.weight",)


# --- format --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EagleConfig:
    """The head's config.json (LlamaConfig names); other keys in the file are ignored.

    Raises (on construction):
        ValueError: a size not a positive integer, heads not dividing the hidden size, or an activation
            other than ``silu``.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    vocab_size: int | None = None

    REQUIRED = (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
        "rms_norm_eps", "max_position_embeddings",
    )

    def __post_init__(self) -> None:
        sizes = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "num_hidden_layers", "max_position_embeddings"]
        for name in sizes + [n for n in ("head_dim", "vocab_size") if getattr(self, n) is not None]:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EAGLE config {name} must be an integer >= 1, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"EAGLE config num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"EAGLE config hidden_size={self.hidden_size} is not divisible by num_attention_heads")
        if self.hidden_act != "silu":
            raise ValueError(f"EAGLE config hidden_act {self.hidden_act!r} is not supported; the Llama head uses 'silu'")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "config.json") -> EagleConfig:
        """Pick the known keys of ``raw``; ``where`` names the file in errors.

        Raises:
            ValueError: a required key missing (the message lists them) or a value invalid.
        """
        return cls(**known_keys(cls, raw, where))

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def expected_shapes(self, *, fc_bias: bool) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape of every weight the format holds (``fc.bias`` only with ``fc_bias``)."""
        hidden, inter, d = self.hidden_size, self.intermediate_size, self.attention_head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        shapes: dict[str, tuple[int, ...]] = {"fc.weight": (hidden, 2 * hidden)}
        if fc_bias:
            shapes["fc.bias"] = (hidden,)
        for n in range(self.num_hidden_layers):
            layer = {
                "self_attn.q_proj.weight": (q, hidden), "self_attn.k_proj.weight": (kv, hidden),
                "self_attn.v_proj.weight": (kv, hidden), "self_attn.o_proj.weight": (hidden, q),
                "mlp.gate_proj.weight": (inter, hidden), "mlp.up_proj.weight": (inter, hidden),
                "mlp.down_proj.weight": (hidden, inter), "post_attention_layernorm.weight": (hidden,),
            }
            if n > 0:
                layer["input_layernorm.weight"] = (hidden,)
            shapes |= {f"layers.{n}.{k}": v for k, v in layer.items()}
        return shapes

    def rotary_config(self) -> LlamaConfig:
        """A LlamaConfig carrying only what :class:`LlamaRotaryEmbedding` reads (theta, scaling, head dim)."""
        return LlamaConfig(
            hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.attention_head_dim,
            max_position_embeddings=self.max_position_embeddings, rope_theta=self.rope_theta,
            rope_scaling=self.rope_scaling,
        )


def load_eagle_head(head_dir: str | Path, *, dtype: torch.dtype = torch.float32) -> EagleHead:
    """Load an EAGLE-1/2 head from ``head_dir`` (config.json + model.safetensors, or a weights-only .bin/.pt).

    Raises:
        FileNotFoundError: no config.json, or no weight file.
        ValueError: a config key missing or invalid; a tensor missing, unexpected or of the wrong shape
            (the message names it).
        pickle.UnpicklingError: a .pt/.bin holding anything but tensors (``weights_only=True`` refuses it).
    """
    head_dir = Path(head_dir)
    raw = read_config_json(head_dir, not_a="an EAGLE head directory")
    config = EagleConfig.from_dict(raw, str(head_dir / "config.json"))
    state = {k: v for k, v in EAGLE_FILES.read(head_dir).items() if k not in IGNORED_TENSORS}
    fc_bias = "fc.bias" in state
    _check_state(state, config, head_dir, fc_bias=fc_bias)
    head = EagleHead(config, fc_bias=fc_bias)
    head.load_state_dict(state, strict=True)
    return head.to(dtype).eval()


def save_eagle_head(head_dir: str | Path, state: Mapping[str, torch.Tensor], config: EagleConfig) -> Path:
    """Write ``config.json`` and ``model.safetensors`` to ``head_dir`` (created); returns ``head_dir``.

    Args:
        state: on-disk names -> tensors, e.g. ``EagleHead(config).state_dict()``; ``fc.bias`` optional.

    Raises:
        ValueError: a tensor missing, unexpected or of the wrong shape for ``config``.
    """
    head_dir = Path(head_dir)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    _check_state(tensors, config, head_dir, fc_bias="fc.bias" in tensors)
    head_dir.mkdir(parents=True, exist_ok=True)
    save_safetensors(tensors, head_dir / SAFETENSORS_NAME)
    raw = {k: v for k, v in asdict(config).items() if v is not None}
    (head_dir / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **raw}, indent=2) + "\n")
    return head_dir


def _check_state(state: Mapping[str, torch.Tensor], config: EagleConfig, where: Path, *, fc_bias: bool) -> None:
    mismatch = (
        f"EAGLE weights do not match num_hidden_layers={config.num_hidden_layers} "
        "(layer 0 has no input_layernorm, there is no final norm)"
    )
    check_state(state, config.expected_shapes(fc_bias=fc_bias), where, mismatch=mismatch)


# --- the head ------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Llama RMSNorm, ``weight`` [H]."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


@dataclass(frozen=True)
class LayerKV:
    """One layer's keys and values, ``[num_kv_heads, S, head_dim]`` each: a call's new rows (an engine call has
    already written them to its :class:`CacheView`), or training's differentiable past (EAGLE-3's test-time
    training steps, ``methods/eagle3/train.py``; the engine's head caches are :class:`HeadCache` slots)."""

    keys: torch.Tensor
    values: torch.Tensor

    def __len__(self) -> int:
        return self.keys.shape[1]

    def cat(self, other: LayerKV) -> LayerKV:
        """Training only: ``self`` then ``other`` along positions (keeps the autograd graph)."""
        return LayerKV(torch.cat([self.keys, other.keys], 1), torch.cat([self.values, other.values], 1))


@dataclass(frozen=True)
class CacheView:
    """Where one request's rows of a head call keep their keys and values: slot ``slot`` of ``cache`` (the
    engine's KV cache interface, :class:`~specbuild.engine.kv_pool.KVCache`), head layer ``layer``. The
    rows are written at positions ``start ..`` and attend over positions ``0 .. start + rows - 1`` (the
    :class:`Segment` mask's columns, in that order)."""

    cache: KVCache
    slot: int
    start: int
    layer: int = 0


class HeadCache:
    """One request's EAGLE / EAGLE-3 head cache on the engine's KV cache interface: slot 0 of a private
    one-slot :class:`~specbuild.engine.kv_pool.KVPool` of the head's geometry (its attention layers,
    kv heads and head size). Committed: the positions fed with TRUE target features; a proposal writes
    its draft nodes after them without committing, so the next update overwrites them. The pool is
    regrown (to what a call needs rounded up to whole :data:`HEAD_CHUNK` s; everything written so far
    copied through :meth:`~specbuild.engine.kv_pool.KVCache.read` / ``write``) when a call would run past it.
    """

    def __init__(self, shape: KVShape, *, dtype: torch.dtype, device: torch.device | str) -> None:
        self.shape, self.dtype, self.device = shape, dtype, device
        self.pool: KVPool | None = None
        self.slot = 0

    @classmethod
    def of(cls, attentions: Sequence[Attention], *, dtype: torch.dtype, device: torch.device | str) -> HeadCache:
        """An empty cache for a head whose attention layers are ``attentions`` (one per head layer)."""
        return cls(KVShape(len(attentions), attentions[0].num_kv_heads, attentions[0].head_dim), dtype=dtype, device=device)

    @property
    def length(self) -> int:
        """Committed (true-feature) positions."""
        return 0 if self.pool is None else self.pool.length(self.slot)

    def view(self, start: int, rows: int) -> CacheView:
        """Room for ``rows`` positions at ``start`` (regrowing the pool if needed); where a call writes them."""
        if self.pool is None or start + rows > self.pool.capacity:
            self._regrow(start + rows)
        return CacheView(self.pool, self.slot, start)

    def commit(self, rows: int) -> None:
        """Keep the ``rows`` positions a call just wrote at the committed length."""
        self.pool.commit(self.slot, list(range(rows)))

    def layer(self, n: int) -> LayerKV:
        """Head layer ``n``'s committed keys and values, ``[num_kv_heads, length, head_dim]`` views."""
        return LayerKV(*self.pool.read(n, self.slot, self.length))

    def copy(self) -> HeadCache:
        """A separate cache holding the same positions and committed length (a sequential oracle's start)."""
        twin = HeadCache(self.shape, dtype=self.dtype, device=self.device)
        if self.pool is not None:
            twin.pool, twin.slot = self.pool, self.slot
            twin._regrow(self.pool.capacity)  # into a pool of its own
        return twin

    def _regrow(self, capacity: int) -> None:
        pool = KVPool(self.shape, num_slots=1, capacity=-(-capacity // HEAD_CHUNK) * HEAD_CHUNK, dtype=self.dtype,
                      device=self.device)
        slot = pool.allocate()
        if self.pool is not None:  # everything written so far (a proposal's draft nodes too), committed length kept
            for layer in range(self.shape.num_layers):
                pool.write(layer, slot, 0, *self.pool.read(layer, self.slot, self.pool.capacity))
            if self.length:
                pool.commit(slot, list(range(self.length)))
        self.pool, self.slot = pool, slot


HEAD_CHUNK = 256
"""Positions a :class:`HeadCache` grows by."""


@dataclass(frozen=True)
class Segment:
    """Rows ``[start, stop)`` of a batched head call that belong to one request: they attend to that
    request's cached positions and to each other through ``mask`` ``[stop - start, P + stop - start]``
    (bool, True = attend; cached positions first, then the segment's own rows)."""

    start: int
    stop: int
    mask: torch.Tensor
    past: CacheView | LayerKV | None = None  # the rows' cache (engine) or a differentiable past (training); None: P = 0


class Attention(nn.Module):
    """Llama self-attention with grouped KV heads; the caller owns the past keys/values."""

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        d, hidden = config.attention_head_dim, config.hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(hidden, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, hidden, bias=False)

    def forward(
        self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], segments: Sequence[Segment]
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        """Several requests' rows in one call (one request: one segment of all rows): the projections run once
        over ``x [S, H]``, attention per :class:`Segment` (``past``: this layer's :class:`CacheView`, where the
        rows' KV is written and read back with the cached positions before it). Returns ``[S, H]`` and each
        segment's new KV.
        """
        s = x.shape[0]
        q = self.q_proj(x).view(s, self.num_heads, self.head_dim).transpose(0, 1)  # [nH, S, d]
        k = self.k_proj(x).view(s, self.num_kv_heads, self.head_dim).transpose(0, 1)  # [nKV, S, d]
        v = self.v_proj(x).view(s, self.num_kv_heads, self.head_dim).transpose(0, 1)  # [nKV, S, d]
        cos, sin = rotary  # [S, d] each
        q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
        groups = self.num_heads // self.num_kv_heads
        outs, news = [], []
        for seg in segments:
            new = LayerKV(k[:, seg.start : seg.stop], v[:, seg.start : seg.stop])
            keys, values = new.keys, new.values
            if isinstance(seg.past, CacheView):
                at = seg.past
                at.cache.write(at.layer, at.slot, at.start, keys, values)
                keys, values = at.cache.read(at.layer, at.slot, at.start + len(new))  # [nKV, P + S_r, d] views
            elif seg.past is not None:  # training's differentiable past
                keys, values = torch.cat([seg.past.keys, keys], 1), torch.cat([seg.past.values, values], 1)
            keys = keys.repeat_interleave(groups, dim=0)  # [nH, P + S_r, d]
            values = values.repeat_interleave(groups, dim=0)
            outs.append(nn.functional.scaled_dot_product_attention(q[:, seg.start : seg.stop], keys, values, attn_mask=seg.mask))
            news.append(new)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # [nH, S, d]
        return self.o_proj(out.transpose(0, 1).reshape(s, -1)), news


class MLP(nn.Module):
    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """A Llama decoder layer; layer 0 has no ``input_layernorm`` (EAGLE ``cnets1.py``: its input is fc's output)."""

    def __init__(self, config: EagleConfig, index: int) -> None:
        super().__init__()
        if index > 0:
            self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor, past: CacheView | None
    ) -> tuple[torch.Tensor, LayerKV]:
        """``x [S, H]``, ``mask [S, P + S]``, ``past`` ``P`` positions -> ``[S, H]``, the new KV."""
        out, (new,) = self.forward_segments(x, rotary, [Segment(0, x.shape[0], mask, past)])
        return out, new

    def forward_segments(
        self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], segments: Sequence[Segment]
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        """``x [S, H]``; per segment ``past`` is this layer's :class:`CacheView` -> ``[S, H]``, each segment's new KV."""
        normed = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
        attended, new = self.self_attn(normed, rotary, segments)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), new


class EagleHead(nn.Module):
    """fc + decoder layers; ``state_dict()`` keys are exactly the on-disk names. Pure: KV is passed in and out."""

    def __init__(self, config: EagleConfig, *, fc_bias: bool = True) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=fc_bias)
        self.layers = nn.ModuleList(DecoderLayer(config, n) for n in range(config.num_hidden_layers))
        self.rotary = LlamaRotaryEmbedding(config.rotary_config())

    def forward(
        self,
        embeds: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        past: CacheView | None = None,
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        """Predicted next features for ``S`` new positions.

        Args:
            embeds: ``[S, H]`` target token embeddings of ``c_{j+1}``.
            features: ``[S, H]`` features ``f_j`` (target's, or the head's own output for draft nodes).
            positions: ``[S]`` long, rotary positions ``j``.
            mask: ``[S, P + S]`` bool, True where new position ``s`` may attend (past first, then new).
            past: the request's cache (layer 0's :class:`CacheView`, the new rows at ``P``), or None (``P = 0``, no cache).

        Returns:
            ``([S, H]`` predicted features ``f'_j``, per layer the ``S`` new positions' KV``)``.
        """
        out, (new_kv,) = self.forward_segments(embeds, features, positions, [Segment(0, embeds.shape[0], mask, past)])
        return out, new_kv

    def forward_segments(
        self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, segments: Sequence[Segment]
    ) -> tuple[torch.Tensor, list[list[LayerKV]]]:
        """:meth:`forward` for several requests at once: their rows concatenated (``[S, H]``, ``[S]``), each
        request a :class:`Segment` whose ``past`` is its cache (a :class:`CacheView`, or None). The linear layers run once
        over all rows, attention per segment, so a request's outputs do not depend on the others'
        (on CPU, with packed linears: the same bits as alone).

        Returns:
            ``([S, H]`` predicted features, per segment its per-layer new KV``)``.
        """
        x = self.fc(torch.cat([embeds, features], dim=-1))  # [S, H]
        cos, sin = self.rotary(x, positions[None])  # [1, S, d] each
        rotary = (cos[0].to(x.dtype), sin[0].to(x.dtype))
        new_kv: list[list[LayerKV]] = [[] for _ in segments]
        for n, layer in enumerate(self.layers):
            layer_segments = [replace(seg, past=None if seg.past is None else replace(seg.past, layer=n)) for seg in segments]
            x, kv = layer.forward_segments(x, rotary, layer_segments)
            for per_segment, layer_kv in zip(new_kv, kv):
                per_segment.append(layer_kv)
        return x, new_kv


# --- drafting ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EagleTreeConfig:
    """How the proposer grows its tree (TensorRT-LLM ``EagleDecodingConfig`` names).

    Attributes:
        num_eagle_layers: tree depth (draft tokens one step can accept at most).
        max_draft_len: draft nodes per step at most.
        eagle_choices: static tree paths; None with ``dynamic_tree_max_topK`` None -> :data:`MC_SIM_7B_63`
            (EAGLE-1's default tree, depth 4).
        dynamic_tree_max_topK: EAGLE-2's K (frontier nodes per depth and children per node); set -> dynamic tree.

    Raises (on construction):
        ValueError: depth of ``eagle_choices`` != ``num_eagle_layers`` (TensorRT-LLM#2588), more choices
            than ``max_draft_len``, both a static and a dynamic tree, or a count < 1.
    """

    num_eagle_layers: int = 4
    max_draft_len: int = 63
    eagle_choices: tuple[tuple[int, ...], ...] | None = None
    dynamic_tree_max_topK: int | None = None
    static_tree: SpecTree | None = field(init=False, default=None, compare=False)

    def __post_init__(self) -> None:
        if self.eagle_choices is not None:
            object.__setattr__(self, "eagle_choices", tuple(tuple(path) for path in self.eagle_choices))
        for name in ("num_eagle_layers", "max_draft_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dynamic_tree_max_topK is not None:
            if self.eagle_choices is not None:
                raise ValueError("use_dynamic_tree builds the tree at run time; remove eagle_choices")
            if self.dynamic_tree_max_topK < 1:
                raise ValueError(f"dynamic_tree_max_topK must be >= 1, got {self.dynamic_tree_max_topK}")
            return
        choices = MC_SIM_7B_63 if self.eagle_choices is None else self.eagle_choices
        tree = SpecTree.from_choices(choices)
        if tree.max_depth != self.num_eagle_layers:
            raise ValueError(
                f"eagle_choices are {tree.max_depth} deep but num_eagle_layers is {self.num_eagle_layers}; "
                "TensorRT-LLM requires them to be equal (TensorRT-LLM#2588)"
            )
        if tree.num_nodes > self.max_draft_len:
            raise ValueError(f"eagle_choices has {tree.num_nodes} nodes, more than max_draft_len {self.max_draft_len}")
        object.__setattr__(self, "static_tree", tree)


@dataclass
class EagleState:
    """One request's head state: the KV of every position fed with a TRUE target feature.

    Attributes:
        cache: the head's KV (:class:`HeadCache`, made at the first update): ``P`` committed positions,
            ``P`` = context length - 1.
        last_output: ``[H]`` head output at position ``P - 1`` (predicts the root's successor's feature).
    """

    cache: HeadCache | None = None
    last_output: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self.cache.length

    @property
    def kv(self) -> list[LayerKV] | None:
        """Per head layer the committed keys and values (views of :attr:`cache`), or None before the first update."""
        return None if self.cache is None else [self.cache.layer(n) for n in range(self.cache.shape.num_layers)]


@dataclass(frozen=True)
class TreeDraft:
    """A proposed tree and its tokens ``[1 + tree.num_nodes]`` (root first, node order of ``tree``)."""

    tree: SpecTree
    tokens: list[int]


@dataclass
class _Node:
    """A draft node while the tree grows: parent index into the node list (-1 = root), child rank, score."""

    token: int
    parent: int
    rank: int
    depth: int
    score: float  # cumulative draft log-probability from the root


class EagleProposer:
    """Grows EAGLE trees for requests of one target (stateless itself; per-request :class:`EagleState`).

    Use: ``state = proposer.new_state()``; ``proposer.update(state, tokens, features)`` with the prefill's
    features; then per step ``draft = proposer.propose(state, root, max_depth)``, verify, and
    ``proposer.update(state, emitted_tokens, features_of_root_and_accepted_nodes)``.

    Attributes:
        prune: skip expansions that cannot reach the dynamic tree's final reranking (exact; see
            :meth:`_dynamic`). False expands every chosen node, as EAGLE-2's reference code does.
    """

    prune: bool = True

    def __init__(
        self, target: PreTrainedModel, head: EagleHead, tree_config: EagleTreeConfig, token_ids: Sequence[int] | None = None,
        weight_dtype: torch.dtype | None = None,
    ) -> None:
        """``token_ids``: a hot-token map for the draft's lm_head (:class:`DraftProjection`); None: the full vocabulary.
        ``weight_dtype``: what that projection's packed weight holds (:func:`~specbuild.engine.draft_linear.draft_weight_dtype`;
        None: the target's dtype).

        Raises: ValueError if the head's hidden size or vocabulary differs from the target's, or the tree
        wants more candidates per node than the vocabulary (or the token map) has."""
        embedding, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        vocab, hidden = embedding.weight.shape
        if head.config.hidden_size != hidden:
            raise ValueError(f"EAGLE head hidden_size {head.config.hidden_size} != target hidden_size {hidden}")
        if head.config.vocab_size not in (None, vocab):
            raise ValueError(f"EAGLE head vocab_size {head.config.vocab_size} != target vocabulary {vocab}")
        widest = tree_config.dynamic_tree_max_topK or max(tree_config.static_tree.top_k_per_depth, default=0)
        draftable = vocab if token_ids is None else len(token_ids)
        if widest > draftable:
            where = "the vocabulary" if token_ids is None else "the token map"
            raise ValueError(f"the tree needs top-{widest} candidates, {where} has {draftable} tokens")
        self.embedding, self.lm_head, self.head, self.tree_config = embedding, lm_head, head, tree_config
        self._project = DraftProjection(lm_head, token_ids, weight_dtype)  # draft logits only; the target's come from its forward
        self._dtype = head.fc.weight.dtype  # kept: the engine then prepacks the head's linears (no .weight)

    @staticmethod
    def new_state() -> EagleState:
        return EagleState()

    def capped(self, num_draft_tokens: int) -> EagleProposer:
        """This proposer verifying at most ``num_draft_tokens`` nodes per step (see :func:`capped_proposer`)."""
        return capped_proposer(self, num_draft_tokens)

    @property
    def batch_key(self) -> EagleHead:
        """Proposers over the same head draft together (:func:`propose_batch`, :func:`update_batch`)."""
        return self.head

    def update(self, state: EagleState, next_tokens: Sequence[int], features: torch.Tensor) -> None:
        """Append ``m`` true positions: ``features [m, H]`` (target, final-norm) paired with the tokens they produced.

        After the prefill: features of every prompt position and ``prompt[1:] + [first_token]``. After a
        step: features at tree indices ``[0, *accepted_nodes]`` and ``acceptance.emitted_tokens``.
        """
        update_batch(self, [state], [next_tokens], [features])

    def propose(self, state: EagleState, root: int, max_depth: int) -> TreeDraft:
        """The tree for this step, at most ``max_depth`` deep (``0`` -> root only); ``state`` is unchanged.

        Raises:
            ValueError: ``state`` was never updated (no prefill features).
        """
        return propose_batch([self], [state], [root], [max_depth])[0]

    def _grow(self, state: EagleState, root: int, max_depth: int) -> Generator[tuple[str, Any], torch.Tensor, TreeDraft]:
        """This request's tree, grown one head call at a time: yields ``("project", outputs [b, H])`` and
        receives their draft log-probabilities (:meth:`_log_probs`, read through :meth:`_top_k`), or ``("forward", _HeadCall)`` and receives the
        nodes' outputs ``[b, H]``; returns the :class:`TreeDraft` (:func:`propose_batch` drives it)."""
        if state.last_output is None:
            raise ValueError("EagleState has no features yet: call update() with the prefill's features first")
        depth = min(max_depth, self.tree_config.num_eagle_layers)
        if depth <= 0:
            return TreeDraft(SpecTree.from_choices([]), [root])
        if self.tree_config.dynamic_tree_max_topK is None:
            return (yield from self._static(state, root, self.tree_config.static_tree.truncated(depth)))
        return (yield from self._dynamic(state, root, depth))

    def _log_probs(self, outputs: torch.Tensor) -> torch.Tensor:
        """``[b, H]`` head outputs -> ``[b, vocab]`` draft log-probabilities through the target's lm_head."""
        return torch.log_softmax(self._project(outputs).float(), dim=-1)

    def _top_k(self, log_probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[b, n]`` rows of :meth:`_log_probs` -> each row's ``k`` best: ``(values [b, k], target ids [b, k])``."""
        top = log_probs.topk(k, dim=-1)
        return top.values, top.indices

    def _static(self, state: EagleState, root: int, tree: SpecTree):
        """Fill ``tree``: child rank ``c`` of index ``i`` gets the ``c``-th best token of ``i``'s distribution."""
        tokens = [root] + [0] * tree.num_nodes
        drafted = DraftKV(self, state)
        frontier, outputs = [0], state.last_output[None]  # index 0 (root) uses the cached last output
        for depth in range(1, tree.max_depth + 1):
            top_k = tree.top_k_per_depth[depth - 1]
            log_probs = yield "project", outputs
            candidates = self._top_k(log_probs, top_k)[1].tolist()  # [len(frontier), top_k] target ids
            row = {index: r for r, index in enumerate(frontier)}
            level = [n for n in range(1, tree.num_nodes + 1) if tree.depths[n] == depth]
            for node in level:
                tokens[node] = candidates[row[tree.parents[node]]][tree.paths[node - 1][-1]]
            frontier = [n for n in level if tree.children[n]]
            if not frontier:
                break
            parent_out = [outputs[row[tree.parents[n]]] for n in frontier]
            outputs = yield "forward", drafted.call(
                [tokens[n] for n in frontier], torch.stack(parent_out), depth,
                [tree.path_to(n)[1:-1] for n in frontier], frontier,
            )
        return TreeDraft(tree, tokens)

    def _dynamic(self, state: EagleState, root: int, depth: int):
        """EAGLE-2 (§4): expand the top-K nodes per depth by cumulative log-prob, rerank, keep max_draft_len.

        With :attr:`prune` (the default) a chosen node that is not among the ``max_draft_len`` best nodes so
        far is not expanded, and drafting stops when no chosen node is: a child scores at most its parent
        and ranks after it, so no descendant of such a node can be kept by the reranking. The tree is the
        same as without pruning; the head and the draft lm_head run on fewer rows (with K = 3 and
        ``max_draft_len`` = 4, usually one row per depth after the second instead of three).
        """
        k = self.tree_config.dynamic_tree_max_topK
        nodes: list[_Node] = []
        drafted = DraftKV(self, state)
        frontier, outputs = [-1], state.last_output[None]  # -1: the root
        for d in range(1, depth + 1):
            log_probs = yield "project", outputs
            values, ids = self._top_k(log_probs, k)  # [len(frontier), K] each: log-probs, target ids
            values, ids = values.tolist(), ids.tolist()
            children: list[int] = []
            for r, parent in enumerate(frontier):
                base = 0.0 if parent < 0 else nodes[parent].score
                for rank in range(k):
                    children.append(len(nodes))
                    nodes.append(_Node(ids[r][rank], parent, rank, d, base + values[r][rank]))
            if d == depth:
                break
            chosen = sorted(children, key=lambda n: -nodes[n].score)[:k]
            if self.prune:
                kept = set(_best(nodes, self.tree_config.max_draft_len))
                chosen = [n for n in chosen if n in kept]
                if not chosen:
                    break
            row = {p: r for r, p in enumerate(frontier)}
            outputs = yield "forward", drafted.call(
                [nodes[n].token for n in chosen], torch.stack([outputs[row[nodes[n].parent]] for n in chosen]), d,
                [_ancestors(nodes, n) for n in chosen], chosen,
            )
            frontier = chosen
        return _rerank(nodes, root, self.tree_config.max_draft_len)


@dataclass
class _HeadCall:
    """One request's rows of a batched head call, where their KV goes, and what to do when it returns."""

    tokens: list[int]
    features: torch.Tensor  # [b, H]
    positions: torch.Tensor  # [b] long
    mask: torch.Tensor  # [b, P + b] bool
    past: CacheView  # where the rows' KV is written (at P) and what they attend to
    done: Callable[[torch.Tensor], None]  # outputs [b, H], once the call succeeded


def _run_head(head: EagleHead, embedding: nn.Module, calls: Sequence[_HeadCall]) -> list[torch.Tensor]:
    """Run every request's :class:`_HeadCall` in one head forward; each gets its outputs ``[b, H]``."""
    device = calls[0].features.device
    tokens = torch.tensor([t for call in calls for t in call.tokens], dtype=torch.long, device=device)
    segments, start = [], 0
    for call in calls:
        segments.append(Segment(start, start + len(call.tokens), call.mask, call.past))
        start += len(call.tokens)
    out, _ = head.forward_segments(
        embedding(tokens), torch.cat([call.features for call in calls]), torch.cat([call.positions for call in calls]), segments,
    )
    outputs = []
    for call, seg in zip(calls, segments):
        outputs.append(out[seg.start : seg.stop])
        call.done(outputs[-1])
    return outputs


def update_batch(
    proposer: EagleProposer, states: Sequence[EagleState], next_tokens: Sequence[Sequence[int]], features: Sequence[torch.Tensor],
) -> None:
    """:meth:`EagleProposer.update` for several requests in one head forward.

    Args:
        states: per request its :class:`EagleState`, updated only when the whole call succeeded.
        next_tokens: per request the ``m_r`` tokens the features produced.
        features: per request ``[m_r, H]`` the target's final-norm features (any float dtype).

    Raises:
        RuntimeError: a feature width other than the head's hidden size (from the head's linears).
    """
    device = proposer.embedding.weight.device
    calls, updates = [], []
    for state, tokens, feats in zip(states, next_tokens, features):
        if state.cache is None:
            state.cache = HeadCache.of([layer.self_attn for layer in proposer.head.layers], dtype=proposer._dtype, device=device)
        m, past = len(tokens), state.length
        calls.append(_HeadCall(
            list(tokens), feats.to(proposer._dtype), torch.arange(past, past + m, device=device),
            torch.ones(m, past + m, dtype=torch.bool, device=device).tril(diagonal=past),  # causal
            state.cache.view(past, m), lambda out, state=state, m=m: updates.append((state, m, out[-1])),
        ))
    _run_head(proposer.head, proposer.embedding, calls)
    for state, m, last in updates:
        state.cache.commit(m)
        state.last_output = last


def propose_batch(
    proposers: Sequence[EagleProposer], states: Sequence[EagleState], roots: Sequence[int], max_depths: Sequence[int],
) -> list[TreeDraft]:
    """:meth:`EagleProposer.propose` for several requests whose proposers share one head (each keeps its
    own tree settings): per draft depth, one head forward and one draft-lm_head projection over every
    request's frontier, so ``B`` requests cost about one request's passes, not ``B``. Each request gets
    the tree it gets alone: its rows attend only to its own cache, and on CPU the packed linears give a
    row the same bits however many rows a call has.

    Raises:
        ValueError: a state was never updated, or the proposers do not share one head.
    """
    lead = proposers[0]
    if any(p.head is not lead.head for p in proposers):
        raise ValueError("propose_batch drafts for proposers of one EAGLE head only")
    growing = [p._grow(state, root, depth) for p, state, root, depth in zip(proposers, states, roots, max_depths)]
    trees: list[TreeDraft | None] = [None] * len(growing)
    replies: list[Any] = [None] * len(growing)
    active = list(range(len(growing)))
    while active:
        asks: dict[int, tuple[str, Any]] = {}
        for i in active:
            try:
                asks[i] = growing[i].send(replies[i])
            except StopIteration as stop:
                trees[i] = stop.value
        active = list(asks)
        projects = [i for i in active if asks[i][0] == "project"]
        if projects:
            log_probs = lead._log_probs(torch.cat([asks[i][1] for i in projects]))  # [sum b, vocab]
            for i, part in zip(projects, log_probs.split([len(asks[i][1]) for i in projects])):
                replies[i] = part
        forwards = [i for i in active if asks[i][0] == "forward"]
        if forwards:
            for i, out in zip(forwards, _run_head(lead.head, lead.embedding, [asks[i][1] for i in forwards])):
                replies[i] = out
    return trees  # type: ignore[return-value]


class DraftKV:
    """Draft positions of one propose() call: written after the request's committed true-feature positions
    (in its :class:`HeadCache`, uncommitted, so the next update overwrites them), in node order."""

    def __init__(self, proposer: EagleProposer, state: EagleState) -> None:
        self.proposer, self.state = proposer, state
        self.ids: list[int] = []  # node id per draft position, in order

    def call(
        self, tokens: list[int], parent_outputs: torch.Tensor, depth: int, ancestors: list[list[int]], ids: list[int]
    ) -> _HeadCall:
        """The head call of ``b`` draft nodes of one depth; each attends to the true cache, its drafted
        ancestors and itself. Their KV is kept when the call returns.

        Args:
            parent_outputs: ``[b, H]`` the parents' head outputs (their predicted features).
            ancestors: per node the ids of its draft ancestors (depth >= 1, itself excluded).
        """
        state = self.state
        b, past, drafted = len(tokens), state.length, len(self.ids)
        device = parent_outputs.device
        position = {node: p for p, node in enumerate(self.ids)}
        mask = torch.zeros(b, past + drafted + b, dtype=torch.bool, device=device)
        mask[:, :past] = True
        for row, node_ancestors in enumerate(ancestors):
            mask[row, [past + position[a] for a in node_ancestors]] = True
            mask[row, past + drafted + row] = True
        positions = torch.full((b,), past + depth - 1, dtype=torch.long, device=device)

        def keep(out: torch.Tensor) -> None:
            del out
            self.ids += ids

        return _HeadCall(tokens, parent_outputs, positions, mask, state.cache.view(past + drafted, b), keep)

    def forward(
        self, tokens: list[int], parent_outputs: torch.Tensor, depth: int, ancestors: list[list[int]], ids: list[int]
    ) -> torch.Tensor:
        """Run :meth:`call`'s nodes alone; returns their outputs ``[b, H]``."""
        return _run_head(self.proposer.head, self.proposer.embedding, [self.call(tokens, parent_outputs, depth, ancestors, ids)])[0]


def _ancestors(nodes: list[_Node], node: int) -> list[int]:
    """Draft ancestors of ``node`` (root excluded, ``node`` excluded), nearest last."""
    chain, parent = [], nodes[node].parent
    while parent >= 0:
        chain.append(parent)
        parent = nodes[parent].parent
    return chain[::-1]


def _rank(nodes: list[_Node], n: int) -> tuple[float, int, int]:
    """Reranking order: higher cumulative score first, then the shallower node, then the older one."""
    return (-nodes[n].score, nodes[n].depth, n)


def _best(nodes: list[_Node], count: int) -> list[int]:
    """The ``count`` best nodes of ``nodes`` in reranking order."""
    return sorted(range(len(nodes)), key=lambda n: _rank(nodes, n))[:count]


def _rerank(nodes: list[_Node], root: int, max_draft_len: int) -> TreeDraft:
    """Keep the ``max_draft_len`` best nodes (score desc, then shallower first) as a :class:`SpecTree`.

    A child's score is its parent's plus a log-probability <= 0, and ties go to the shallower node, so a
    parent always ranks before its children and the kept set is a connected tree.
    """
    order = _best(nodes, max_draft_len)
    paths: dict[int, tuple[int, ...]] = {}
    for n in sorted(order, key=lambda n: nodes[n].depth):
        parent = nodes[n].parent
        if parent >= 0 and parent not in paths:
            raise AssertionError(f"reranked tree is not connected at node {n}")
        paths[n] = (paths[parent] if parent >= 0 else ()) + (nodes[n].rank,)
    tree = SpecTree.from_choices(list(paths.values()))
    token_of = {paths[n]: nodes[n].token for n in paths}
    return TreeDraft(tree, [root, *(token_of[p] for p in tree.paths)])


# --- the reference engine's side of "eagle": settings -> head loaded once -> proposer -----------------


def tree_config(config: EagleSpeculation) -> EagleTreeConfig:
    """The proposer's tree from the method's settings: ``eagle_choices`` (None: :data:`MC_SIM_7B_63`) or,
    with ``use_dynamic_tree``, EAGLE-2's dynamic tree of ``dynamic_tree_max_topK``.
    ``max_non_leaves_per_layer`` has no effect here (the dynamic tree expands ``dynamic_tree_max_topK``
    nodes per depth).

    Raises:
        ValueError: any :class:`EagleTreeConfig` error, e.g. the default tree (depth 4) with another
            ``num_eagle_layers`` (TensorRT-LLM#2588).
    """
    choices = config.eagle_choices
    return EagleTreeConfig(
        num_eagle_layers=config.num_eagle_layers,
        max_draft_len=config.max_draft_len,
        eagle_choices=None if choices is None else tuple(tuple(c) for c in choices),
        dynamic_tree_max_topK=config.dynamic_tree_max_topK if config.use_dynamic_tree else None,
    )


LoadedEagle = LoadedHead[EagleSpeculation, EagleProposer]  # the engine state of "Eagle"


def load_eagle(config: EagleSpeculation, context: MethodContext) -> LoadedEagle:
    """Load the head from ``config.eagle_model`` in the target's dtype and device.

    Raises:
        FileNotFoundError / ValueError: as :func:`load_eagle_head`; a tree the settings cannot make
            (:func:`tree_config`); a head that does not fit the target (:class:`EagleProposer`); a
            target attention that cannot take a tree mask; a bad ``speculative_token_map`` (:func:`load_token_ids`).
    """
    target = context.target
    tree = tree_config(config)
    path = Path(config.eagle_model)
    head = load_eagle_head(path, dtype=target.dtype).to(target.device)
    check_tree_attention(target, "EAGLE")
    token_ids = load_token_ids(config, target.get_output_embeddings().weight.shape[0])
    proposer = EagleProposer(target, head, tree, token_ids, context.draft_weight_dtype)
    pack_draft_linears(head, context.draft_weight_dtype)
    return LoadedHead(config, proposer, path)


def capped_proposer(proposer: EagleProposer, num_draft_tokens: int) -> EagleProposer:
    """``proposer`` verifying at most ``num_draft_tokens`` nodes per step, sharing its head.

    Static tree: its first ``k`` nodes in node order (:meth:`SpecTree.first`, as Medusa's per-request
    cap), e.g. k = 2 on ``[[0], [1], [0, 0]]`` keeps ``[0]`` and ``[1]``; dynamic tree: EAGLE-2's
    reranking keeps the ``k`` best nodes. ``k`` at or above the tree's size returns ``proposer`` itself.
    """
    config = proposer.tree_config
    capped = copy.copy(proposer)
    if config.dynamic_tree_max_topK is not None:
        if num_draft_tokens >= config.max_draft_len:
            return proposer
        capped.tree_config = replace(config, max_draft_len=num_draft_tokens)
    else:
        if num_draft_tokens >= config.static_tree.num_nodes:
            return proposer
        capped.tree_config = copy.copy(config)  # static_tree is derived (init=False): set it on the copy
        object.__setattr__(capped.tree_config, "static_tree", config.static_tree.first(num_draft_tokens))
    return capped


# --- drafting: a request's trees, fed the target's features of every accepted position ---------------


class FeatureTreeProposer(Protocol):
    """A tree proposer fed with the target's features of every position (:class:`EagleProposer`)."""

    def new_state(self) -> Any:
        """Per-request state, empty."""
        ...

    def update(self, state: Any, next_tokens: Sequence[int], features: torch.Tensor) -> None:
        """Feed ``features [m, H]`` and the ``m`` tokens they produced."""
        ...

    def propose(self, state: Any, root: int, max_depth: int) -> TreeDraft:
        """A tree at most ``max_depth`` deep and its ``[1 + n]`` tokens, ``root`` first."""
        ...


class FeatureTreeDrafter(PlainDrafter):
    """A :class:`FeatureTreeProposer`'s trees, the proposer fed the target's final-norm features of every
    accepted position; drafts alone.

    The features of a step wait in :attr:`pending` until the next draft, so that the requests of one
    head feed theirs and grow their trees in shared head calls (:class:`EagleDrafter`).
    """

    wants_hidden = True
    tree_drafts = True  # the iteration's K caps the tree's nodes (max_draft_tokens)

    def __init__(self, proposer: FeatureTreeProposer) -> None:
        self.proposer = proposer
        self.state = proposer.new_state()
        self.pending: tuple[list[int], torch.Tensor] | None = None  # (tokens, features [m, H]) not yet fed

    def start(self, prompt, first_token, hidden_states) -> None:
        self.pending = ([*prompt[1:], first_token], hidden_states[-1])

    def step_plan(self, max_accept: int, max_draft_tokens: int | None) -> tuple[Any, int]:
        """``(proposer, max_depth)`` of this step: the iteration's K caps the tree's nodes (``capped``: a
        static tree's first K nodes, a dynamic tree's K best; as a request's ``num_draft_tokens``); None:
        no cap, 0: a root-only step. ``max_accept`` bounds the depth."""
        if max_draft_tokens == 0:
            return self.proposer, 0
        if max_draft_tokens is None or not hasattr(self.proposer, "capped"):
            return self.proposer, max_accept
        return self.proposer.capped(max_draft_tokens), max_accept

    def draft(self, context, *, max_accept, sampler, max_draft_tokens=None) -> Block:
        if self.pending is not None:
            self.proposer.update(self.state, *self.pending)
            self.pending = None
        proposer, depth = self.step_plan(max_accept, max_draft_tokens)
        proposal = proposer.propose(self.state, context[-1], depth)
        return Block.of_tree(proposal.tree, proposal.tokens)

    def update(self, context, step) -> None:
        self.pending = (step.emitted, step.hidden_states[-1][step.keep])


def feed_pending(drafters: Sequence[Any], update_batch: Callable[..., None]) -> None:
    """Feed every drafter's ``pending`` (tokens, features) to its head in one ``update_batch`` call
    (EAGLE-1/2's or EAGLE-3's, the drafters sharing one proposer's head), and clear them."""
    feeding = [d for d in drafters if d.pending is not None]
    if feeding:
        update_batch(feeding[0].proposer, [d.state for d in feeding], [d.pending[0] for d in feeding],
                     [d.pending[1] for d in feeding])
        for d in feeding:
            d.pending = None


class EagleDrafter(GroupedByProposer, FeatureTreeDrafter):
    """The engine's head (an :class:`EagleProposer`): the requests of one head feed their features and
    grow their trees in shared head calls (a :class:`~specbuild.engine.drafters.BatchDrafter`)."""

    proposer: EagleProposer
    # the batched feed of this drafter's head (EAGLE-1/2's :func:`update_batch`; EAGLE-3's drafter sets its own)
    head_update_batch: Callable[..., None] = staticmethod(update_batch)

    @classmethod
    def draft_batch(cls, drafters: Sequence[EagleDrafter], contexts, *, max_accepts, samplers, max_draft_tokens=None) -> list[Block]:
        """:meth:`draft` for requests of one head: one head call feeds every pending feature
        (:attr:`head_update_batch`), then one head call and one draft projection per tree depth for all of them."""
        del samplers
        feed_pending(drafters, cls.head_update_batch)
        plans = [d.step_plan(m, max_draft_tokens) for d, m in zip(drafters, max_accepts)]
        proposals = propose_batch([p for p, _ in plans], [d.state for d in drafters], [c[-1] for c in contexts],
                                  [depth for _, depth in plans])
        return [Block.of_tree(p.tree, p.tokens) for p in proposals]


def make_drafter(loaded: LoadedEagle, request: ResolvedRequest) -> EagleDrafter:
    """A request's drafter: the engine's head growing trees of at most ``num_draft_tokens`` nodes."""
    return EagleDrafter(loaded.proposer.capped(request.num_draft_tokens))


ENGINE = EngineMethod(make_drafter=make_drafter, load=load_eagle, greedy_only=True)
"""The head loaded once per engine; trees of at most ``num_draft_tokens`` nodes per request."""


# --- the builder: the head checked and written into the engine directory -----------------------------


def read_for_build(loaded: LoadedRecipe, head_dir: Path, target_dir: Path):
    """:attr:`~specbuild.methods.ReferenceWeights.load`: the ``EagleHead`` in the target's dtype (a ``.pt`` / ``.bin`` read with ``weights_only=True``).

    Raises:
        RecipeError: a malformed head directory (located at ``speculation.eagle_model``).
    """
    del target_dir
    return refuse_unreadable(loaded, "eagle_model", lambda: load_eagle_head(head_dir, dtype=torch_dtype(loaded.recipe.target.dtype)))


def write_for_build(loaded: LoadedRecipe, head, out: Path, *, log) -> None:
    """:attr:`~specbuild.methods.ReferenceWeights.write`: the head into the engine directory."""
    del loaded
    c = head.config
    log(f"writing the EAGLE head ({c.num_hidden_layers} decoder layer(s), hidden_size={c.hidden_size})")
    save_eagle_head(out, head.state_dict(), c)
