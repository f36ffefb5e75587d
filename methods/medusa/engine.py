"""Medusa heads (Cai et al. 2024, "Medusa", §2.1.1) in the FasterDecoding / TensorRT-LLM on-disk format.

Head ``h`` (0-based) reads the target's final-norm hidden state at position ``p`` (the position whose own
argmax is the token at ``p + 1``) and guesses the token at ``p + 2 + h``::

    head_h(x) = W_h @ ResBlock_{h,L-1}( ... ResBlock_{h,0}(x))      ResBlock(x) = x + SiLU(linear(x))

On disk (a directory, TensorRT-LLM ``examples/medusa/convert_checkpoint.py --medusa_model_dir``):

    config.json                  {"medusa_num_heads": 4, "medusa_num_layers": 1, "hidden_size": ..., "vocab_size": ...}
    medusa_lm_head.safetensors   "{h}.{l}.linear.weight" [hidden, hidden], "{h}.{l}.linear.bias" [hidden],
                                 "{h}.{L}.weight" [vocab, hidden]   (no bias; L = medusa_num_layers)
    (or medusa_lm_head.pt, read only with torch.load(weights_only=True))

The proposer fills a :class:`~specbuild.engine.tree.SpecTree`: a node at depth ``d`` with child index ``c``
gets the ``c``-th most likely token of head ``d - 1``. Example: tree ``[[0], [1], [0, 0]]``, head 0 top-2
``[a, b]``, head 1 top-1 ``[c]``, root ``t`` -> tree tokens ``[t, a, b, c]``.

As the reference engine's side of the ``medusa`` method (:mod:`specbuild.methods.medusa`, whose
settings model validates the speculative_config): :func:`load_medusa` loads the heads (and their
stateless proposer) once per engine, :func:`make_drafter` gives each request a :class:`MedusaDrafter`
over that proposer and the tree's first ``num_draft_tokens`` nodes. Greedy only, as in TensorRT-LLM.
One step of a request::

    slot holds context[:-1]; root = context[-1]; hidden = target's final-norm state that produced root
    block       = [root, head candidates per node]                       1 + n tokens, ancestor mask
    target      = one pass over the block
    accepted    = longest root-to-node path matching the target's argmax; bonus = argmax at its end
    slot        = keep prefix + root + accepted path
    next root   = bonus, next hidden = hidden at the last accepted index
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from specbuild.util.atomic import save_safetensors
from specbuild.engine.block import Block
from specbuild.engine.draft_linear import DraftProjection, pack_draft_linears
from specbuild.engine.drafters import EngineMethod, MethodContext, PlainDrafter
from specbuild.engine.tree import SpecTree
from specbuild.methods.base import MC_SIM_7B_63

from ..head_files import HeadFiles, LoadedHead, check_state, check_tree_attention, read_config_json
from ..heads import refuse_unreadable, target_config, torch_dtype
from ..token_map import load_token_ids
from . import WEIGHT_FILES, MedusaSpeculation

if TYPE_CHECKING:
    from specbuild.builder.recipe import LoadedRecipe
    from specbuild.engine.validation import ResolvedRequest

SAFETENSORS_NAME, PT_NAME = WEIGHT_FILES
MEDUSA_FILES = HeadFiles(SAFETENSORS_NAME, (PT_NAME,))


@dataclass(frozen=True)
class MedusaConfig:
    """The head directory's config.json keys (FasterDecoding names)."""

    medusa_num_heads: int
    medusa_num_layers: int
    hidden_size: int
    vocab_size: int

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            low = 0 if name == "medusa_num_layers" else 1
            if not isinstance(value, int) or value < low:
                raise ValueError(f"Medusa config {name} must be an integer >= {low}, got {value!r}")

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape for every weight the format requires."""
        shapes: dict[str, tuple[int, ...]] = {}
        hidden, layers = self.hidden_size, self.medusa_num_layers
        for h in range(self.medusa_num_heads):
            for layer in range(layers):
                shapes[f"{h}.{layer}.linear.weight"] = (hidden, hidden)
                shapes[f"{h}.{layer}.linear.bias"] = (hidden,)
            shapes[f"{h}.{layers}.weight"] = (self.vocab_size, hidden)
        return shapes


class ResBlock(nn.Module):
    """``x + SiLU(linear(x))``, hidden -> hidden."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """All heads; ``heads`` state-dict keys are exactly the on-disk names (``"0.0.linear.weight"``, ...)."""

    def __init__(self, config: MedusaConfig) -> None:
        super().__init__()
        self.config = config
        self.heads = nn.ModuleList(
            nn.Sequential(
                *(ResBlock(config.hidden_size) for _ in range(config.medusa_num_layers)),
                nn.Linear(config.hidden_size, config.vocab_size, bias=False),
            )
            for _ in range(config.medusa_num_heads)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [..., hidden_size]`` -> logits ``[num_heads, ..., vocab]``."""
        return torch.stack([head(hidden) for head in self.heads])


def load_medusa_heads(
    head_dir: str | Path, *, num_heads: int | None = None, dtype: torch.dtype = torch.float32
) -> MedusaHeads:
    """Load heads from ``head_dir`` (config.json + medusa_lm_head.safetensors, or the .pt).

    ``hidden_size`` / ``vocab_size`` missing from config.json (FasterDecoding's own configs carry only
    ``medusa_num_heads``, ``medusa_num_layers``, ``base_model_name_or_path``) are read off head 0's vocab
    projection ``0.{medusa_num_layers}.weight`` ``[vocab, hidden]``.

    Args:
        num_heads: override config.json's ``medusa_num_heads`` (TensorRT-LLM's ``--fixed_num_medusa_heads``;
            medusa-vicuna-7b-v1.3 says 2 but holds 4).

    Raises:
        FileNotFoundError: config.json or both weight files missing.
        ValueError: a config key missing or invalid; a tensor missing, unexpected or of the wrong shape
            (the message names it and the head count the weights hold).
    """
    head_dir = Path(head_dir)
    raw = read_medusa_config(head_dir, num_heads=num_heads)
    state = MEDUSA_FILES.read(head_dir)
    config = _complete_config(raw, state, head_dir / "config.json")
    _check_state(state, config, head_dir)
    heads = MedusaHeads(config)
    heads.heads.load_state_dict(state, strict=True)
    return heads.to(dtype).eval()


def read_medusa_config(head_dir: Path, *, num_heads: int | None = None) -> dict:
    """The raw ``head_dir/config.json``, ``medusa_num_heads`` replaced by ``num_heads`` when given.

    Raises:
        FileNotFoundError: no config.json.
    """
    raw = read_config_json(head_dir, not_a="a Medusa head directory")
    if num_heads is not None:
        raw["medusa_num_heads"] = num_heads
    return raw


def _complete_config(raw: Mapping, state: Mapping[str, torch.Tensor], path: Path) -> MedusaConfig:
    """MedusaConfig from config.json keys, sizes missing there taken from the vocab projection's shape."""
    missing = [k for k in ("medusa_num_heads", "medusa_num_layers") if k not in raw]
    if missing:
        raise ValueError(f"{path}: missing key(s) {missing}")
    projection = state.get(f"0.{raw['medusa_num_layers']}.weight")
    sizes = {} if projection is None else {"vocab_size": projection.shape[0], "hidden_size": projection.shape[1]}
    values = {**sizes, **raw}
    missing = [k for k in MedusaConfig.__dataclass_fields__ if k not in values]
    if missing:
        raise ValueError(f"{path}: missing key(s) {missing} and no tensor 0.{raw['medusa_num_layers']}.weight to infer them")
    return MedusaConfig(**{k: values[k] for k in MedusaConfig.__dataclass_fields__})


def save_medusa_heads(head_dir: str | Path, heads_state: Mapping[str, torch.Tensor], config: MedusaConfig) -> Path:
    """Write ``config.json`` and ``medusa_lm_head.safetensors`` to ``head_dir``; returns ``head_dir``.

    Args:
        heads_state: on-disk names -> tensors, e.g. ``MedusaHeads(config).heads.state_dict()``.

    Raises:
        ValueError: a tensor missing, unexpected or of the wrong shape for ``config``.
    """
    head_dir = Path(head_dir)
    state = {k: v.detach().contiguous().cpu() for k, v in heads_state.items()}
    _check_state(state, config, head_dir)
    head_dir.mkdir(parents=True, exist_ok=True)
    save_safetensors(state, head_dir / SAFETENSORS_NAME)
    (head_dir / "config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
    return head_dir


def _check_state(state: Mapping[str, torch.Tensor], config: MedusaConfig, where: Path) -> None:
    held = 1 + max((int(k.split(".")[0]) for k in state if k.split(".")[0].isdigit()), default=-1)
    mismatch = (
        f"Medusa weights do not match medusa_num_heads={config.medusa_num_heads}, "
        f"medusa_num_layers={config.medusa_num_layers} (the weights hold {held} heads)"
    )
    check_state(state, config.expected_shapes(), where, mismatch=mismatch)


class MedusaProposer:
    """Fills a speculation tree from the heads' top-k tokens (one request; stateless between steps)."""

    def __init__(self, heads: MedusaHeads, tree: SpecTree, token_ids: Sequence[int] | None = None,
                 weight_dtype: torch.dtype | None = None) -> None:
        """``token_ids``: a hot-token map for every head's vocabulary projection (:class:`DraftProjection`);
        None: the full vocabulary. ``weight_dtype``: what those projections' packed weights hold
        (:func:`~specbuild.engine.draft_linear.draft_weight_dtype`; None: the heads' dtype).

        Raises: ValueError if the tree is deeper than the head count or wants more candidates than the
        vocabulary (or the token map)."""
        config = heads.config
        if tree.max_depth > config.medusa_num_heads:
            raise ValueError(
                f"tree depth {tree.max_depth} exceeds medusa_num_heads={config.medusa_num_heads} "
                "(one head per tree level)"
            )
        draftable = config.vocab_size if token_ids is None else len(token_ids)
        if any(k > draftable for k in tree.top_k_per_depth):
            where = "vocab_size" if token_ids is None else "the token map's size"
            raise ValueError(f"tree needs top-{max(tree.top_k_per_depth)} candidates, {where} is {draftable}")
        self.heads = heads
        self.tree = tree
        self._projections = [DraftProjection(head[-1], token_ids, weight_dtype) for head in heads.heads]  # each head's vocab projection
        self._dtype = heads.heads[0][-1].weight.dtype

    def head_candidates(self, hidden: torch.Tensor, tree: SpecTree) -> list[list[int]]:
        """``hidden [hidden_size]`` -> per depth ``d`` the top-``tree.top_k_per_depth[d]`` tokens of head ``d``
        (only the heads the tree reaches are run)."""
        return self._candidates(hidden[None], [tree])[0]

    def _candidates(self, hidden: torch.Tensor, trees: Sequence[SpecTree]) -> list[list[list[int]]]:
        """``hidden [B, hidden_size]``, one tree per row -> per row, per depth of its tree, the top-k tokens.

        Each head runs once for all ``B`` rows, up to the deepest tree. A row's candidates do not depend
        on the other rows: its logits come out of row-wise ops and, on CPU, packed linears that give a
        row the same bits however many rows a call has (:mod:`specbuild.engine.kernels`).
        """
        hidden = hidden.to(self._dtype)
        logits = [
            self._projections[d](self.heads.heads[d][:-1](hidden))  # residual blocks, then the projection [B, vocab]
            for d in range(max(tree.max_depth for tree in trees))
        ]
        return [
            [logits[d][row].topk(k).indices.tolist() for d, k in enumerate(tree.top_k_per_depth)]
            for row, tree in enumerate(trees)
        ]

    def propose_tree(self, context: Sequence[int], hidden: torch.Tensor, tree: SpecTree | None = None) -> list[int]:
        """Tree tokens ``[1 + n]`` for ``tree`` (default: the proposer's; a truncated one near max_tokens).

        Args:
            context: prompt + emitted tokens; ``context[-1]`` is the root (tree index 0).
            hidden: ``[hidden_size]`` target final-norm hidden state at the position that produced ``context[-1]``.
        """
        return self.propose_trees([context], [hidden], [self.tree if tree is None else tree])[0]

    def propose_trees(
        self, contexts: Sequence[Sequence[int]], hiddens: Sequence[torch.Tensor], trees: Sequence[SpecTree]
    ) -> list[list[int]]:
        """:meth:`propose_tree` for ``B`` requests at once (the heads run once per depth for all of them).

        Args:
            contexts: per request, prompt + emitted tokens (``[-1]`` is its root).
            hiddens: per request ``[hidden_size]``, as in :meth:`propose_tree`.
            trees: per request its tree (requests may cap theirs differently).

        Returns: per request its tree tokens ``[1 + n]``, the same as :meth:`propose_tree` alone.
        """
        roots = [[context[-1]] for context in contexts]
        if all(tree.num_nodes == 0 for tree in trees):
            return roots
        candidates = self._candidates(torch.stack(list(hiddens)), trees)
        return [
            root + [cands[len(path) - 1][path[-1]] for path in tree.paths]
            for root, cands, tree in zip(roots, candidates, trees)
        ]


# --- the reference engine's "Medusa" method: speculative_config -> heads loaded once -> proposer --------

LoadedMedusa = LoadedHead[MedusaSpeculation, MedusaProposer]  # the engine state of "Medusa"


def check_heads_fit(heads: MedusaConfig, *, hidden_size: int, vocab_size: int, where: Path) -> None:
    """Refuse heads whose ``hidden_size`` / ``vocab_size`` differ from the target's.

    Raises:
        ValueError: naming both sizes of both.
    """
    if (heads.hidden_size, heads.vocab_size) != (hidden_size, vocab_size):
        raise ValueError(
            f"Medusa heads {where} have hidden_size={heads.hidden_size}, vocab_size={heads.vocab_size} but the "
            f"target has hidden_size={hidden_size}, vocab_size={vocab_size}; the heads must be trained on this target"
        )


def load_medusa(config: MedusaSpeculation, context: MethodContext) -> LoadedMedusa:
    """Load ``config.num_medusa_heads`` heads from ``config.medusa_model`` in the target's dtype and
    device, and check they fit the target and the tree (``medusa_choices``; None -> :data:`MC_SIM_7B_63`).

    Raises:
        FileNotFoundError: no head directory (config.json or weights missing).
        ValueError: the heads' sizes differ from the target's; the tree is deeper than the heads (or
            wants more candidates than the vocabulary); the target's attention cannot take a tree mask;
            a malformed head directory; a bad ``speculative_token_map`` (:func:`load_token_ids`).
    """
    target = context.target
    path = Path(config.medusa_model)
    heads = load_medusa_heads(path, num_heads=config.num_medusa_heads, dtype=target.dtype).to(target.device)
    text_config = target.config.get_text_config()
    check_heads_fit(heads.config, hidden_size=int(text_config.hidden_size), vocab_size=int(text_config.vocab_size), where=path)
    tree = SpecTree.from_choices(MC_SIM_7B_63 if config.medusa_choices is None else config.medusa_choices)
    proposer = MedusaProposer(heads, tree, load_token_ids(config, heads.config.vocab_size), context.draft_weight_dtype)  # raises on a tree the heads cannot fill
    for head in heads.heads:
        pack_draft_linears(head[:-1], context.draft_weight_dtype)  # the residual blocks; the vocabulary projections are the proposer's
    check_tree_attention(target, "Medusa")
    return LoadedHead(config, proposer, path)


# --- drafting: a request's tree from the target's hidden state -----------------------------------------


class TreeProposer(Protocol):
    """Fills a speculation tree from the target's last hidden state (:class:`MedusaProposer`).

    Attributes:
        tree: the full tree this proposer fills; a request keeps its first ``num_draft_tokens`` nodes
            (:meth:`SpecTree.first`), a step the depth ``max_tokens`` still allows (:meth:`SpecTree.truncated`).
    """

    tree: SpecTree

    def propose_tree(self, context: Sequence[int], hidden: torch.Tensor, tree: SpecTree) -> list[int]:
        """``[1 + tree.num_nodes]`` tokens, ``context[-1]`` (the root) first; ``hidden [hidden_size]`` is the
        target's final-norm state that produced ``context[-1]``."""
        ...


class TreeDrafter(PlainDrafter):
    """A :class:`TreeProposer`'s trees, filled from the target's final-norm hidden state at the root's
    producer; drafts alone."""

    wants_hidden = True
    tree_drafts = True  # the iteration's K caps the tree's nodes (max_draft_tokens)

    def __init__(self, proposer: TreeProposer, tree: SpecTree) -> None:
        self.proposer, self.tree = proposer, tree
        self.hidden: torch.Tensor | None = None  # [H]

    def start(self, prompt, first_token, hidden_states) -> None:
        self.hidden = hidden_states[-1][-1]

    def step_tree(self, max_accept: int, max_draft_tokens: int | None = None) -> SpecTree:
        """This step's tree: no deeper than ``max_accept``, its first ``max_draft_tokens`` nodes (node order,
        as a request's ``num_draft_tokens`` cuts it; None: all)."""
        tree = self.tree.truncated(0 if max_draft_tokens == 0 else max_accept)
        return tree if not max_draft_tokens else tree.first(max_draft_tokens)

    def draft(self, context, *, max_accept, sampler, max_draft_tokens=None) -> Block:
        tree = self.step_tree(max_accept, max_draft_tokens)
        return Block.of_tree(tree, self.proposer.propose_tree(context, self.hidden, tree))

    def update(self, context, step) -> None:
        self.hidden = step.hidden_states[-1][step.keep[-1]]


class MedusaDrafter(TreeDrafter):
    """The engine's heads (:class:`MedusaProposer`, shared by every request): the requests of one engine
    draft together, the heads running once per depth for all of them (a
    :class:`~specbuild.engine.drafters.BatchDrafter`)."""

    proposer: MedusaProposer

    @property
    def batch_key(self) -> MedusaProposer:
        return self.proposer

    @classmethod
    def draft_batch(cls, drafters: Sequence[MedusaDrafter], contexts, *, max_accepts, samplers, max_draft_tokens=None) -> list[Block]:
        """:meth:`draft` for requests sharing one proposer: the heads run once for all of them."""
        del samplers
        trees = [d.step_tree(m, max_draft_tokens) for d, m in zip(drafters, max_accepts)]
        tokens = drafters[0].proposer.propose_trees(contexts, [d.hidden for d in drafters], trees)
        return [Block.of_tree(tree, t) for tree, t in zip(trees, tokens)]


def make_drafter(loaded: LoadedMedusa, request: ResolvedRequest) -> MedusaDrafter:
    """A request's drafter: the engine's heads over the tree's first ``num_draft_tokens`` nodes."""
    return MedusaDrafter(loaded.proposer, loaded.proposer.tree.first(request.num_draft_tokens))


ENGINE = EngineMethod(make_drafter=make_drafter, load=load_medusa, greedy_only=True)
"""Heads loaded once per engine; their tree cut to each request's first ``num_draft_tokens`` nodes."""


# --- the builder: the heads checked and written into the engine directory ----------------------------


def read_for_build(loaded: LoadedRecipe, heads_dir: Path, target_dir: Path):
    """:attr:`~specbuild.methods.ReferenceWeights.load`: the heads (``MedusaHeads``) in the target's dtype,
    ``num_medusa_heads`` of them, checked against the target's sizes. Seconds at most: it runs before the
    target is written.

    Raises:
        RecipeError: a malformed head directory, a head count other than ``num_medusa_heads``, or sizes
            that differ from the target's (located at ``speculation.medusa_model``).
    """
    r = loaded.recipe
    target = target_config(target_dir)

    def read():
        heads = load_medusa_heads(heads_dir, num_heads=r.speculation.num_medusa_heads, dtype=torch_dtype(r.target.dtype))
        check_heads_fit(heads.config, hidden_size=target.get("hidden_size"), vocab_size=target.get("vocab_size"), where=heads_dir)
        return heads

    return refuse_unreadable(loaded, "medusa_model", read)


def write_for_build(loaded: LoadedRecipe, heads, out: Path, *, log) -> None:
    """:attr:`~specbuild.methods.ReferenceWeights.write`: the heads into the engine directory."""
    del loaded
    c = heads.config
    log(f"writing {c.medusa_num_heads} Medusa heads ({c.medusa_num_layers} layer(s) each)")
    save_medusa_heads(out, heads.heads.state_dict(), c)

