"""Speculation trees: structure, validation, greedy tree acceptance (verification passes: test_forward.py)."""

from __future__ import annotations

import random

import pytest
import torch

from specbuild.engine import target as target_model
from specbuild.engine.tree import SpecTree, accept_tree_greedy
from specbuild.methods.base import MC_SIM_7B_63

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
