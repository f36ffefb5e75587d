"""The engine's attention kernel (engine/rowgemm.py ``attention``, engine/csrc/rowgemm.c): PyTorch's
attention to float32 rounding, and a query's bits depend on its own visible keys only: the same as a
one-token step, inside a ``k + 1`` chain, in a tree, beside other rows, with any thread count. That is
what makes fp32 greedy speculative output equal plain decoding exactly, not just up to near-ties."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specbuild.engine import rowgemm
from specbuild.engine import target as target_model
from specbuild.engine.forward import RowBlock, forward_blocks
from specbuild.engine.kernels import pack_linears
from specbuild.engine.kv_pool import KVPool, KVShape
from specbuild.engine.tree import SpecTree

needs_kernel = pytest.mark.skipif(rowgemm.library() is None, reason=f"rowgemm not built here: {rowgemm.unavailable_reason()}")


def _rope_tables(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = positions[:, None].float() * inv[None]
    emb = torch.cat([angles, angles], -1)
    return emb.cos().contiguous(), emb.sin().contiguous()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


def _reference(qkv, cos, sin, cache_k, cache_v, rows, hq, hkv, scale):
    """PyTorch: rotary embedding, cache writes, then SDPA per row with an explicit mask."""
    d = cache_k.shape[-1]
    qkv = qkv.view(qkv.shape[0], hq + 2 * hkv, d)
    q, k, v = qkv[:, :hq], qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
    q = q * cos[:, None] + _rotate_half(q) * sin[:, None]
    k = k * cos[:, None] + _rotate_half(k) * sin[:, None]
    out, start = torch.empty(qkv.shape[0], hq, d), 0
    for slot, length, size, allow in rows:
        cache_k[slot, :, length : length + size] = k[start : start + size].transpose(0, 1)
        cache_v[slot, :, length : length + size] = v[start : start + size].transpose(0, 1)
        block = torch.ones(size, size, dtype=torch.bool).tril() if allow is None else allow
        mask = torch.ones(size, length + size, dtype=torch.bool)
        mask[:, length:] = block
        o = F.scaled_dot_product_attention(
            q[start : start + size].transpose(0, 1)[None],
            cache_k[slot, :, : length + size].repeat_interleave(hq // hkv, 0)[None],
            cache_v[slot, :, : length + size].repeat_interleave(hq // hkv, 0)[None], attn_mask=mask, scale=scale)
        out[start : start + size] = o[0].transpose(0, 1)
        start += size
    return out.reshape(qkv.shape[0], -1)


def _run(rows, hq, hkv, d, capacity=96, seed=0, threads=None):
    """Random q/k/v for ``rows`` ((slot, length, size, allowed)); returns (kernel out, reference out,
    kernel caches, reference caches)."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(size for _, _, size, _ in rows)
    cache_k = torch.randn(4, hkv, capacity, d, generator=gen)
    cache_v = torch.randn(4, hkv, capacity, d, generator=gen)
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=gen)
    positions = torch.cat([torch.arange(length, length + size) for _, length, size, _ in rows])
    cos, sin = _rope_tables(positions, d)
    ref_k, ref_v = cache_k.clone(), cache_v.clone()
    expected = _reference(qkv.clone(), cos, sin, ref_k, ref_v, rows, hq, hkv, d**-0.5)
    out = _kernel(rows, hq, qkv, cos, sin, cache_k, cache_v, d**-0.5, threads=threads)
    return out, expected, (cache_k, cache_v), (ref_k, ref_v)


def _kernel(rows, hq, qkv, cos, sin, cache_k, cache_v, scale, threads=None):
    """``rowgemm.attention`` over ``rows`` ((slot, length, size, allowed)) on ``threads`` torch threads
    (None: as set), the thread count restored after."""
    before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        plan = rowgemm.AttentionRows([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                                     [r[3] for r in rows], tuple(cache_k.shape), hq)
        return rowgemm.attention(plan, qkv, cos, sin, cache_k, cache_v, scale)
    finally:
        torch.set_num_threads(before)


TREE = SpecTree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])


@needs_kernel
@pytest.mark.parametrize("heads", [(4, 2), (9, 3), (8, 1), (2, 2), (12, 2)], ids=lambda h: f"hq{h[0]}-hkv{h[1]}")
@pytest.mark.parametrize("head_dim", [16, 48, 64, 128])
def test_attention_is_pytorchs_for_chains_trees_and_one_token_rows(heads, head_dim):
    hq, hkv = heads
    rows = [(2, 37, 1, None), (0, 5, 4, None), (3, 20, len(TREE.depths), TREE.ancestor_mask()), (1, 0, 6, None)]
    out, expected, caches, ref_caches = _run(rows, hq, hkv, head_dim)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(caches, ref_caches):  # k (rotated) and v written where each row's block goes
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-6)


@needs_kernel
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_a_query_has_the_same_bits_alone_in_a_chain_in_a_tree_in_a_batch_and_on_any_threads(head_dim):
    """Query at block index 2 of a chain sees cache + block 0..2; the same query as a one-token row after
    those positions were committed, as a tree node over the same path, and beside other rows."""
    hq, hkv, length = 6, 2, 40
    gen = torch.Generator().manual_seed(1)
    capacity = 64
    cache_k = torch.randn(4, hkv, capacity, head_dim, generator=gen)
    cache_v = torch.randn(4, hkv, capacity, head_dim, generator=gen)
    block = torch.randn(5, (hq + 2 * hkv) * head_dim, generator=gen)
    cos, sin = _rope_tables(torch.arange(length, length + 5), head_dim)

    def attend(rows, qkv, cos, sin, k, v, threads=None):
        return _kernel(rows, hq, qkv.clone(), cos, sin, k, v, head_dim**-0.5, threads=threads)

    chain_k, chain_v = cache_k.clone(), cache_v.clone()
    chain = attend([(0, length, 5, None)], block, cos, sin, chain_k, chain_v)
    width = hq * head_dim
    # one token at a time, each committed (written at its position) before the next
    step_k, step_v = cache_k.clone(), cache_v.clone()
    for t in range(5):
        one = attend([(0, length + t, 1, None)], block[t : t + 1], cos[t : t + 1], sin[t : t + 1], step_k, step_v)
        assert torch.equal(one, chain[t : t + 1]), t
    assert torch.equal(step_k, chain_k) and torch.equal(step_v, chain_v)
    # a tree whose node 3 has the path 0 -> 1 -> 3 (block positions 0, 1, 3 hold the chain's tokens 0, 1, 2)
    tree_tokens = torch.stack([block[0], block[1], block[4], block[2]])
    allowed = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    depth = torch.tensor([0, 1, 1, 2])
    tcos, tsin = _rope_tables(length + depth, head_dim)
    tree = attend([(1, length, 4, allowed)], tree_tokens, tcos, tsin, cache_k.clone().index_copy_(0, torch.tensor([1]), cache_k[:1]),
                  cache_v.clone().index_copy_(0, torch.tensor([1]), cache_v[:1]))
    for node, t in ((0, 0), (1, 1), (3, 2)):
        assert torch.equal(tree[node], chain[t]), (node, t)
    # beside other rows, and on 1 or 3 threads
    others_k, others_v = cache_k.clone(), cache_v.clone()
    pad_qkv = torch.randn(9, block.shape[1], generator=gen)
    pcos, psin = _rope_tables(torch.arange(9), head_dim)
    batched = attend([(2, 0, 2, None), (0, length, 5, None), (3, 11, 7, None)], torch.cat([pad_qkv[:2], block, pad_qkv[2:]]),
                     torch.cat([pcos[:2], cos, pcos[2:]]), torch.cat([psin[:2], sin, psin[2:]]), others_k, others_v)
    assert torch.equal(batched[2:7], chain)
    for threads in (1, 3):
        assert torch.equal(attend([(0, length, 5, None)], block, cos, sin, cache_k.clone(), cache_v.clone(), threads), chain)
    assert chain.shape == (5, width)


@needs_kernel
def test_a_model_token_gets_the_same_logits_as_a_plain_step_and_inside_a_verification_block(tiny_checkpoint):
    """Through the engine's forward: greedy speculative decoding equals plain decoding by construction."""
    model = target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    pack_linears(model, "rowgemm")
    prompt, block = [17, 203, 44, 91, 300, 12, 7], [5, 9, 13, 21, 2, 8]
    with torch.inference_mode():
        pool = KVPool(KVShape.of(model), num_slots=2, capacity=64, dtype=model.dtype, device="cpu")
        slots = []
        for _ in range(2):
            slot = pool.allocate()
            forward_blocks(model, pool, [RowBlock(slot, prompt, logits_from=len(prompt) - 1)])
            pool.commit(slot, list(range(len(prompt))))
            slots.append(slot)
        verify = forward_blocks(model, pool, [RowBlock(slots[0], block)]).logits[0]
        for t, token in enumerate(block):
            step = forward_blocks(model, pool, [RowBlock(slots[1], [token])]).logits[0]
            pool.commit(slots[1], [0])
            assert torch.equal(step[0], verify[t]), t


@needs_kernel
def test_bad_attention_inputs_are_refused_with_what_is_wrong():
    shape = (2, 2, 32, 16)
    cases = [
        (([0], [0], [1], [None], (2, 2, 32, 12), 4), "multiples of 16"),
        (([0], [0], [1], [None], shape, 3), "H_q a multiple of H_kv"),
        (([2], [0], [1], [None], shape, 4), "distinct slots of the pool's 2"),
        (([0, 0], [0, 0], [1, 1], [None, None], shape, 4), "distinct slots"),
        (([0], [30], [3], [None], shape, 4), "capacity 32"),
        (([0], [0], [0], [None], shape, 4), "1 .. capacity - length"),
        (([0], [0], [2], [torch.ones(3, 3, dtype=torch.bool)], shape, 4), "must be [2, 2]"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
            rowgemm.AttentionRows(*args)
    plan = rowgemm.AttentionRows([0], [3], [2], [None], shape, 4)
    cache = torch.zeros(shape)
    good = dict(qkv=torch.zeros(2, 8 * 16), cos=torch.ones(2, 16), sin=torch.zeros(2, 16), cache_k=cache, cache_v=cache.clone())
    for name, bad in [("qkv", torch.zeros(2, 7 * 16)), ("qkv", torch.zeros(2, 8 * 16, dtype=torch.float64)),
                      ("cos", torch.ones(16, 2).t()), ("cache_v", torch.zeros(2, 2, 31, 16))]:
        with pytest.raises(ValueError, match="attention takes contiguous float32"):
            rowgemm.attention(plan, **{**good, name: bad}, scale=0.25)


@needs_kernel
def test_silu_mul_is_swiglus_gate_row_by_row():
    torch.manual_seed(0)
    gate_up = torch.randn(7, 2 * 48) * 8
    gate_up[0, :4] = torch.tensor([-200.0, 200.0, 0.0, -90.0])  # saturating exp, both ends
    out = rowgemm.silu_mul(gate_up)
    torch.testing.assert_close(out, F.silu(gate_up[:, :48]) * gate_up[:, 48:], rtol=1e-6, atol=1e-6)
    assert all(torch.equal(rowgemm.silu_mul(gate_up[i : i + 1]), out[i : i + 1]) for i in range(7))
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="multiple of 16"):
        rowgemm.silu_mul(torch.zeros(2, 40))
