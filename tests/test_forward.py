"""The one target forward call site: ragged rows in one pass, each at its own positions with its own mask
(chains, trees), slot KV cache commits (rollback and tree compaction) equal to sequential runs."""

from __future__ import annotations

import random

import pytest
import torch

from specbuild.engine import decoder
from specbuild.engine import target as target_model
from specbuild.engine.attention import ENGINE_ATTENTION
from specbuild.engine.forward import RowBlock, forward_blocks
from specbuild.engine.kv_pool import KVCacheFullError, KVPool, KVShape
from specbuild.engine.tree import SpecTree
from specbuild.methods.base import MC_SIM_7B_63

USER_TREE = [[1], [0], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0]]
PREFIXES = [[17, 203, 44, 91, 300, 12], [5, 6, 7], [42] * 11]
VOCAB = 384


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    model = target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    assert model.config._attn_implementation == ENGINE_ATTENTION  # load_target switches sdpa to the engine's
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped-query heads are exercised
    assert decoder.supports(model)  # the engine's layer loop (engine/decoder.py); "sdpa"/"eager" runs transformers'
    return model


def _pool(model, slots: int = 4, *, garbage: bool = True) -> KVPool:
    pool = KVPool(KVShape.of(model), num_slots=slots, capacity=160, dtype=model.dtype, device="cpu")
    if garbage:  # never-written memory may hold anything: masked positions must not leak into outputs
        for cache in (*pool.keys, *pool.values):
            cache.fill_(float("nan"))
    return pool


def _prefill(model, pool: KVPool, prompt: list[int]) -> int:
    slot = pool.allocate()
    forward_blocks(model, pool, [RowBlock(slot, prompt, logits_from=len(prompt) - 1)])
    pool.commit(slot, list(range(len(prompt))))
    return slot


def _sequential_logits(model, tokens: list[int]) -> torch.Tensor:
    """Plain causal forward without a cache; ``[vocab]`` logits after the last token."""
    return model(input_ids=torch.tensor([tokens])).logits[0, -1]


def _tree_row(slot: int, tree: SpecTree, tokens: list[int]) -> RowBlock:
    return RowBlock(slot, tokens, list(tree.depths), tree.ancestor_mask())


@pytest.mark.parametrize("attn", [ENGINE_ATTENTION, "sdpa", "eager"])
@pytest.mark.parametrize("choices", [USER_TREE, MC_SIM_7B_63], ids=["user", "mc_sim_7b_63"])
def test_rows_of_a_batch_equal_sequential_runs(model, attn, choices):
    """The core claim: in ONE pass with a tree row, a chain row and a one-token row (different cached
    lengths), every scored position equals a causal run over its own prefix + path."""
    tree = SpecTree.from_choices(choices)
    rng = random.Random(1)
    tree_tokens = [rng.randrange(VOCAB) for _ in range(tree.num_nodes + 1)]
    chain = [9, 8, 7, 6]
    model.set_attn_implementation(attn)
    try:
        with torch.inference_mode():
            pool = _pool(model)
            slots = [_prefill(model, pool, p) for p in PREFIXES]
            out = forward_blocks(
                model, pool,
                [_tree_row(slots[0], tree, tree_tokens), RowBlock(slots[1], chain), RowBlock(slots[2], [3])],
            )
            assert [tuple(x.shape) for x in out.logits] == [(tree.num_nodes + 1, VOCAB), (4, VOCAB), (1, VOCAB)]
            for node in range(tree.num_nodes + 1):
                path = [tree_tokens[i] for i in tree.path_to(node)]
                expected = _sequential_logits(model, [*PREFIXES[0], *path])
                torch.testing.assert_close(out.logits[0][node], expected, rtol=1e-4, atol=1e-5)
            for i in range(len(chain)):
                torch.testing.assert_close(out.logits[1][i], _sequential_logits(model, [*PREFIXES[1], *chain[: i + 1]]), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(out.logits[2][0], _sequential_logits(model, [*PREFIXES[2], 3]), rtol=1e-4, atol=1e-5)
    finally:
        model.set_attn_implementation(ENGINE_ATTENTION)


@pytest.mark.parametrize("kernels", ["eager", "rowgemm"])
def test_hidden_states_are_transformers_own(model, tiny_checkpoint, kernels):
    """What EAGLE, EAGLE-3 and Medusa read: the embeddings, each decoder layer's output, the last one
    after the final norm, as transformers' ``output_hidden_states`` gives them (with the engine's kernels,
    which add each residual in place, too: every layer's state is its own, not the last one's)."""
    from specbuild.engine import rowgemm
    from specbuild.engine.kernels import pack_linears

    block = [9, 8, 7]
    engine_model = model
    if kernels == "rowgemm":
        if rowgemm.library() is None:
            pytest.skip(f"rowgemm not built here: {rowgemm.unavailable_reason()}")
        engine_model = target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
        pack_linears(engine_model, "rowgemm")
    with torch.inference_mode():
        pool = _pool(engine_model)
        slot = _prefill(engine_model, pool, PREFIXES[0])
        out = forward_blocks(engine_model, pool, [RowBlock(slot, block)], hidden_states=True)
        reference = model(input_ids=torch.tensor([[*PREFIXES[0], *block]]), output_hidden_states=True).hidden_states
    assert len(out.hidden_states[0]) == len(reference) == model.config.num_hidden_layers + 1
    for mine, theirs in zip(out.hidden_states[0], reference):
        torch.testing.assert_close(mine, theirs[0, -len(block) :], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("choice", [(0, 0, 0, 1), (1, 0, 1), (2, 2), (9,), ()], ids=str)
def test_committed_tree_path_equals_a_sequential_cache(model, choice):
    """Keep prefix + root + one path: the next pass equals a fresh run over those tokens."""
    tree = SpecTree.from_choices(MC_SIM_7B_63)
    node_path = tree.path_to(tree.paths.index(choice) + 1 if choice else 0)
    rng = random.Random(2)
    tokens = [rng.randrange(VOCAB) for _ in range(tree.num_nodes + 1)]
    kept = [tokens[i] for i in node_path]
    with torch.inference_mode():
        pool = _pool(model)
        slot = _prefill(model, pool, PREFIXES[0])
        forward_blocks(model, pool, [_tree_row(slot, tree, tokens)])
        pool.commit(slot, node_path)
        assert pool.lengths[slot] == len(PREFIXES[0]) + len(node_path)
        after = forward_blocks(model, pool, [RowBlock(slot, [7])]).logits[0][0]
    torch.testing.assert_close(after, _sequential_logits(model, [*PREFIXES[0], *kept, 7]), rtol=1e-4, atol=1e-5)


def test_rolled_back_chain_continues_like_a_fresh_run(model):
    with torch.inference_mode():
        pool = _pool(model)
        slot = _prefill(model, pool, PREFIXES[1])
        forward_blocks(model, pool, [RowBlock(slot, [1, 2, 3, 4])])
        pool.commit(slot, [0, 1])  # root + one accepted draft; 3, 4 rejected
        after = forward_blocks(model, pool, [RowBlock(slot, [5])]).logits[0][0]
    torch.testing.assert_close(after, _sequential_logits(model, [*PREFIXES[1], 1, 2, 5]), rtol=1e-4, atol=1e-5)


def test_pool_slots_and_errors(model):
    pool = _pool(model, slots=2, garbage=False)
    assert pool.nbytes == 2 * 160 * KVShape.of(model).bytes_per_token(torch.float32)
    a, b = pool.allocate(), pool.allocate()
    assert (a, b) == (0, 1)
    with pytest.raises(KVCacheFullError, match="all 2 KV-cache slots"):
        pool.allocate()
    pool.release(a)
    assert pool.allocate() == 0
    with pytest.raises(ValueError, match="ascending"):
        pool.commit(0, [1, 0])
    with pytest.raises(ValueError, match="capacity"), torch.inference_mode():
        forward_blocks(model, pool, [RowBlock(0, list(range(161)))])


def test_forward_refuses_attention_that_ignores_the_mask(model, monkeypatch):
    from specbuild.engine.forward import check_mask_attention

    monkeypatch.setattr(model.config, "_attn_implementation", "flash_attention_2")
    with pytest.raises(ValueError, match="'flash_attention_2'"):
        check_mask_attention(model)


def test_a_pool_larger_than_memory_is_refused_up_front(model):
    """Sized from the build: a pool that could not be backed when full fails at load, with the fix."""
    with pytest.raises(KVCacheFullError, match=r"lower build.max_batch_size or build.max_seq_len"):
        KVPool(KVShape.of(model), num_slots=4096, capacity=2**24, dtype=model.dtype, device="cpu")


def test_a_slot_left_out_of_a_pass_keeps_its_cache(model):
    """A request that waits for the next iteration (its slot between two rows of the pass) keeps its
    committed keys and values: the pass's stand-in row for that slot writes past its length."""
    with torch.inference_mode():
        pool = _pool(model, garbage=False)
        slots = [_prefill(model, pool, p) for p in PREFIXES]
        held = [cache[slots[1], :, : pool.lengths[slots[1]]].clone() for cache in (*pool.keys, *pool.values)]
        forward_blocks(model, pool, [RowBlock(slots[0], [9, 8]), RowBlock(slots[2], [3])])
        for before, cache in zip(held, (*pool.keys, *pool.values)):
            assert torch.equal(cache[slots[1], :, : pool.lengths[slots[1]]], before)
        waited = forward_blocks(model, pool, [RowBlock(slots[1], [4])]).logits[0][0]
    torch.testing.assert_close(waited, _sequential_logits(model, [*PREFIXES[1], 4]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernels", ["rowgemm", "onednn"])
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(tiny_checkpoint, kernels):
    """With the engine's CPU kernels (row-invariant linears, each row attending alone) a row's logits and
    hidden states do not depend on the rows beside it, their widths or their cached lengths: what makes
    greedy output and acceptance counts exactly the same alone or in any batch."""
    from specbuild.engine import rowgemm
    from specbuild.engine.kernels import onednn_supports, pack_linears

    if kernels == "onednn" and not onednn_supports(torch.float32):
        pytest.skip("oneDNN is not usable in this torch build")
    if kernels == "rowgemm" and rowgemm.library() is None:
        pytest.skip(f"rowgemm not built here: {rowgemm.unavailable_reason()}")
    packed = target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    pack_linears(packed, kernels)
    tree = SpecTree.from_choices(USER_TREE)
    row = _tree_row(0, tree, [5, 7, 11, 13, 17, 19, 23, 29])
    with torch.inference_mode():
        pool = _pool(packed, slots=4)
        slots = [_prefill(packed, pool, p) for p in [PREFIXES[0], *PREFIXES]]
        alone = forward_blocks(packed, pool, [row], hidden_states=True)
        for others in ([RowBlock(slots[1], [3])], [RowBlock(slots[2], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])],
                       [RowBlock(slots[1], [3, 4]), RowBlock(slots[3], list(range(40)))]):
            batched = forward_blocks(packed, pool, [row, *others], hidden_states=True)
            assert torch.equal(batched.logits[0], alone.logits[0])
            assert all(torch.equal(a, b) for a, b in zip(batched.hidden_states[0], alone.hidden_states[0]))


class TokenMajorPool(KVPool):
    """A KV pool laid out token-major, ``[slot, position, kv_head, d]`` in memory (SGLang's token_to_kv_pool
    order): the layout changed by overriding the one method that chooses it (:meth:`KVPool._buffer`)."""

    @staticmethod
    def _buffer(size, dtype, device):
        slots, kv_heads, capacity, head_dim = size
        return torch.empty(slots, capacity, kv_heads, head_dim, dtype=dtype, device=device).permute(0, 2, 1, 3)


@pytest.mark.parametrize("path", ["rowgemm", "sdpa-rows", "transformers"])
def test_a_token_major_kv_layout_changes_no_bit(tiny_checkpoint, path, monkeypatch):
    """Changing the KV layout touches engine/kv_pool.py alone: the layer loop reads and writes through the
    KV cache interface and the C attention kernel follows the pool's strides (``KVPool.addressing``), so a
    token-major pool gives the same logits, bit for bit, through a batched prefill, a tree step committed
    along a non-prefix path, and a next step, on every forward path."""
    from specbuild.engine import rowgemm
    from specbuild.engine.kernels import pack_linears

    model = target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    if path == "rowgemm":
        if rowgemm.library() is None:
            pytest.skip(f"rowgemm not built here: {rowgemm.unavailable_reason()}")
        pack_linears(model, "rowgemm")
    elif path == "transformers":
        monkeypatch.setattr(decoder, "supports", lambda model: False)
    tree = SpecTree.from_choices(USER_TREE)
    path_nodes = tree.path_to(tree.paths.index((0, 1, 0)) + 1)  # not a prefix: the commit moves positions
    runs = []
    for cls in (KVPool, TokenMajorPool):
        pool = cls(KVShape.of(model), num_slots=2, capacity=160, dtype=model.dtype, device="cpu")
        addressing = pool.addressing()
        assert (addressing.pos_stride == addressing.num_kv_heads * addressing.head_dim) == (cls is TokenMajorPool)
        with torch.inference_mode():
            slots = [pool.allocate() for _ in PREFIXES[:2]]
            logits = forward_blocks(model, pool, [RowBlock(s, p) for s, p in zip(slots, PREFIXES[:2])]).logits
            for s, p in zip(slots, PREFIXES[:2]):
                pool.commit(s, list(range(len(p))))
            step = forward_blocks(model, pool, [_tree_row(slots[0], tree, [5, 7, 11, 13, 17, 19, 23, 29]), RowBlock(slots[1], [3, 4])])
            pool.commit(slots[0], path_nodes)
            pool.commit(slots[1], [0])
            after = forward_blocks(model, pool, [RowBlock(s, [9]) for s in slots]).logits
        runs.append([*logits, *step.logits, *after])
    assert all(torch.equal(a, b) for a, b in zip(*runs))
