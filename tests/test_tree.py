"""Speculation trees: structure, validation, greedy tree acceptance, one-pass tree verification, cache compaction."""

from __future__ import annotations

import random

import pytest
import torch

from specbuild.engine import target as target_model
from specbuild.engine.kv_cache_tree import compact
from specbuild.engine.tree import MC_SIM_7B_63, SpecTree, accept_tree_greedy
from specbuild.engine.tree_verify import tree_attention_mask, tree_forward

EXAMPLE = [[0], [1], [0, 0]]  # the module docstring's worked example
USER_TREE = [[1], [0], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0]]
PREFIX = [17, 203, 44, 91, 300, 12]
VOCAB = 384


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)


# --- structure ---------------------------------------------------------------------------------


def test_worked_example():
    tree = SpecTree.from_choices(EXAMPLE)
    assert tree.paths == ((0,), (1,), (0, 0))
    assert tree.parents == (-1, 0, 0, 1)
    assert tree.depths == (0, 1, 1, 2)
    assert tree.children == ((1, 2), (3,), (), ())
    assert (tree.num_nodes, tree.max_depth, tree.top_k_per_depth) == (3, 2, (2, 1))
    assert tree.position_ids(5).tolist() == [5, 6, 6, 7]
    assert tree.ancestor_mask().int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert tree.leaf_paths() == [[0, 2], [0, 1, 3]]
    assert tree.path_to(3) == [0, 1, 3]


def test_default_medusa_tree():
    tree = SpecTree.from_choices(MC_SIM_7B_63)
    assert tree.num_nodes == 63 and tree.max_depth == 4
    assert tree.top_k_per_depth == (10, 10, 10, 2)
    assert [tree.depths.count(d) for d in range(1, 5)] == [10, 28, 23, 2]
    assert tree.paths[:3] == ((0,), (1,), (2,)) and tree.paths[-1] == (0, 0, 0, 1)
    assert len(tree.leaf_paths()) == 42
    mask = tree.ancestor_mask()
    assert mask.shape == (64, 64)
    assert mask.sum(dim=1).tolist() == [d + 1 for d in tree.depths]  # each index sees itself and its ancestors
    assert all(tree.parents[i] < i for i in range(1, 64))  # parents before children


def test_node_order_does_not_depend_on_input_order():
    shuffled = list(MC_SIM_7B_63)
    random.Random(0).shuffle(shuffled)
    assert SpecTree.from_choices(shuffled) == SpecTree.from_choices(MC_SIM_7B_63)


@pytest.mark.parametrize(
    ("choices", "message"),
    [
        ([[0], [0]], r"\[0\] appears more than once"),
        ([[0], [1, 0]], r"\[1, 0\] has no parent: \[1\]"),
        ([[0], [0, 0, 0]], r"\[0, 0, 0\] has no parent"),
        ([[0], []], "empty"),
        ([[0], [-1]], "non-negative integer"),
        ([[0.5]], "non-negative integer"),
    ],
)
def test_invalid_trees(choices, message):
    with pytest.raises(ValueError, match=message):
        SpecTree.from_choices(choices)


def test_truncated_and_root_only():
    tree = SpecTree.from_choices(MC_SIM_7B_63)
    assert tree.truncated(9) is tree
    assert tree.truncated(1).paths == tuple((c,) for c in range(10))
    root_only = tree.truncated(0)
    assert (root_only.num_nodes, root_only.max_depth, root_only.leaf_paths()) == (0, 0, [[0]])
    assert root_only.ancestor_mask().tolist() == [[True]]


# --- acceptance --------------------------------------------------------------------------------

T, A, B, C, X, Y = 10, 11, 12, 13, 14, 15


@pytest.mark.parametrize(
    ("target", "nodes", "accepted", "bonus"),
    [
        ([A, C, X, Y], [1, 3], [A, C], Y),  # root -> [0] -> [0, 0]
        ([B, C, X, Y], [2], [B], X),  # second child of the root, a leaf
        ([A, X, Y, Y], [1], [A], X),  # [0] accepted, [0, 0] rejected
        ([X, C, Y, Y], [], [], X),  # nothing accepted: bonus is the root's argmax
    ],
)
def test_accept_tree_greedy(target, nodes, accepted, bonus):
    acceptance = accept_tree_greedy(SpecTree.from_choices(EXAMPLE), [T, A, B, C], target)
    assert (acceptance.accepted_nodes, acceptance.accepted_tokens, acceptance.bonus_token) == (nodes, accepted, bonus)
    assert acceptance.emitted_tokens == [*accepted, bonus]
    assert acceptance.last_index == (nodes[-1] if nodes else 0)


def test_accept_tree_greedy_checks_lengths():
    with pytest.raises(ValueError, match="need 4 tree tokens"):
        accept_tree_greedy(SpecTree.from_choices(EXAMPLE), [T, A, B], [A, B, C, X])


# --- one-pass tree verification on the target ---------------------------------------------------


def test_tree_attention_mask_layout():
    mask = tree_attention_mask(SpecTree.from_choices(EXAMPLE), 2, torch.float32)
    assert mask.shape == (1, 1, 4, 6)
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 1]]
    assert mask[0, 0, 0, 3] == torch.finfo(torch.float32).min


def _random_tree_tokens(tree: SpecTree, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(tree.num_nodes + 1)]


def _sequential_logits(model, tokens: list[int]) -> torch.Tensor:
    """Plain causal forward without a cache; ``[vocab]`` logits after the last token."""
    return model(input_ids=torch.tensor([tokens])).logits[0, -1]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("choices", [USER_TREE, MC_SIM_7B_63], ids=["user", "mc_sim_7b_63"])
def test_tree_logits_equal_sequential_logits(model, attn, choices):
    """The core claim: every node's logits in the one tree pass == a causal run over prefix + its path."""
    tree = SpecTree.from_choices(choices)
    tokens = _random_tree_tokens(tree, seed=1)
    model.set_attn_implementation(attn)
    try:
        with torch.inference_mode():
            cache = target_model.new_cache(model)
            target_model.prefill(model, PREFIX, cache)
            forward = tree_forward(model, tree, tokens, cache)
            assert forward.logits.shape == (tree.num_nodes + 1, VOCAB)
            assert cache.get_seq_length() == len(PREFIX) + tree.num_nodes + 1
            for node in range(tree.num_nodes + 1):
                path_tokens = [tokens[i] for i in tree.path_to(node)]
                expected = _sequential_logits(model, [*PREFIX, *path_tokens])
                torch.testing.assert_close(forward.logits[node], expected, rtol=1e-4, atol=1e-5)
    finally:
        model.set_attn_implementation("sdpa")


def test_tree_forward_rejects_wrong_token_count(model):
    with torch.inference_mode(), pytest.raises(ValueError, match="4 indices"):
        tree_forward(model, SpecTree.from_choices(EXAMPLE), [1, 2], target_model.new_cache(model))


def test_tree_forward_refuses_attention_that_ignores_the_mask(model, monkeypatch):
    monkeypatch.setattr(model.config, "_attn_implementation", "flash_attention_2")
    with torch.inference_mode(), pytest.raises(ValueError, match="'flash_attention_2'"):
        tree_forward(model, SpecTree.from_choices(EXAMPLE), [1, 2, 3, 4], target_model.new_cache(model))


# --- cache compaction ---------------------------------------------------------------------------


def _cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


@pytest.mark.parametrize("choice", [(0, 0, 0, 1), (1, 0, 1), (2, 2), (9,), ()], ids=str)
def test_compacted_cache_equals_sequential_cache(model, choice):
    """Keep prefix + root + one path: the cache equals a fresh run over those tokens, and continues the same."""
    tree = SpecTree.from_choices(MC_SIM_7B_63)
    node_path = tree.path_to(tree.paths.index(choice) + 1 if choice else 0)
    assert [tree.paths[i - 1][-1] for i in node_path[1:]] == list(choice)
    tokens = _random_tree_tokens(tree, seed=2)
    kept_tokens = [tokens[i] for i in node_path]
    with torch.inference_mode():
        cache = target_model.new_cache(model)
        target_model.prefill(model, PREFIX, cache)
        tree_forward(model, tree, tokens, cache)
        compact(cache, prefix_len=len(PREFIX), keep_indices=node_path)
        fresh = target_model.new_cache(model)
        target_model.prefill(model, [*PREFIX, *kept_tokens], fresh)
        assert cache.get_seq_length() == fresh.get_seq_length() == len(PREFIX) + len(node_path)
        for (k, v), (fresh_k, fresh_v) in zip(_cache_tensors(cache), _cache_tensors(fresh), strict=True):
            torch.testing.assert_close(k, fresh_k, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(v, fresh_v, rtol=1e-4, atol=1e-5)
        next_logits = model(input_ids=torch.tensor([[7]]), cache=cache).logits[0, -1]
        fresh_logits = model(input_ids=torch.tensor([[7]]), cache=fresh).logits[0, -1]
        torch.testing.assert_close(next_logits, fresh_logits, rtol=1e-4, atol=1e-5)


def test_compact_errors(model):
    with torch.inference_mode():
        cache = target_model.new_cache(model)
        target_model.prefill(model, PREFIX, cache)
        with pytest.raises(ValueError, match="outside the tree block"):
            compact(cache, prefix_len=4, keep_indices=[0, 2])
        with pytest.raises(ValueError, match="ascending"):
            compact(cache, prefix_len=3, keep_indices=[1, 0])
        assert cache.get_seq_length() == len(PREFIX)
