"""The CPU kernel path (engine/kernels.py): oneDNN-prepacked linears (and the engine's own rowgemm,
tests/test_rowgemm.py) give a row the same bits however many rows share the pass (eager ``F.linear``
does not: MKL picks another GEMM for another row count). With oneDNN, a token alone and the same token
as one of a k + 1 block attend over the same keys with another query length, which PyTorch's CPU flash
attention may round differently, so their logits agree to rounding: greedy outputs can differ only at
a logit near-tie, which verify reports with its margin. (The engine's own kernels attend per query and
agree bit for bit: tests/test_attention_kernel.py.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specbuild.engine import target as target_model
from specbuild.engine.forward import RowBlock, forward_blocks
from specbuild.engine.kernels import PackedLinear, onednn_supports, pack_linears, resolve_kernels
from specbuild.engine.kv_pool import KVPool, KVShape

needs_onednn = pytest.mark.skipif(not onednn_supports(torch.float32), reason="this torch build has no oneDNN linear kernels")


@needs_onednn
@pytest.mark.parametrize("shape", [(64, 96), (96, 1000)], ids=str)
def test_packed_linear_matches_f_linear_and_keeps_a_row_bitwise_whatever_the_row_count(shape):
    torch.manual_seed(0)
    linear = nn.Linear(*shape, bias=True)
    packed = PackedLinear(linear)
    x = torch.randn(1, 40, shape[0])
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
        alone = packed(x[:, :1])
        for rows in (2, 3, 5, 8, 17, 40):
            assert torch.equal(packed(x[:, :rows])[:, :1], alone), rows
        # the same row at another index of a 3D batch
        assert torch.equal(packed(x[0, :8].reshape(8, 1, -1))[5], packed(x[:, 5:6])[0])


@needs_onednn
def test_packed_model_gives_a_token_the_same_logits_alone_in_a_block_and_in_a_batch(tiny_checkpoint):
    """The property speculative equality stands on: the logits at one position agree, to fp32 rounding of
    the attention, when the token runs alone (plain decoding), as one of a k + 1 block (verification), or
    beside other rows of other lengths (in-flight batching)."""
    model = target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    assert pack_linears(model, "onednn") > 0
    prefix, block, other = [17, 203, 44, 91, 300, 12], [9, 8, 7, 6], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    with torch.inference_mode():
        pool = KVPool(KVShape.of(model), num_slots=3, capacity=64, dtype=model.dtype, device="cpu")
        slots = []
        for prompt in (prefix, other, prefix):
            slot = pool.allocate()
            forward_blocks(model, pool, [RowBlock(slot, prompt, logits_from=len(prompt) - 1)])
            pool.commit(slot, list(range(len(prompt))))
            slots.append(slot)
        alone = forward_blocks(model, pool, [RowBlock(slots[0], block[:1])]).logits[0][0]
        in_block = forward_blocks(model, pool, [RowBlock(slots[0], block)]).logits[0][0]
        in_batch = forward_blocks(model, pool, [RowBlock(slots[0], block[:1]), RowBlock(slots[1], [3, 4, 5]),
                                                RowBlock(slots[2], block)]).logits
    for other_pass in (in_block, in_batch[0][0], in_batch[2][0]):  # slot 2: the same prefix at another batch index
        torch.testing.assert_close(other_pass, alone, rtol=0, atol=1e-5)
        assert torch.equal(other_pass.argmax(), alone.argmax())


def test_resolve_and_pack_reject_what_they_cannot_do():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    assert resolve_kernels("eager", model) == "eager"
    from specbuild.engine import rowgemm

    fp32_default = "rowgemm" if rowgemm.library() is not None else "onednn" if onednn_supports(torch.float32) else "eager"
    assert resolve_kernels("auto", model) == fp32_default
    assert resolve_kernels("auto", model.to(torch.float16)) == "eager"
    assert pack_linears(model, "eager") == 0
    with pytest.raises(ValueError, match="kernels='fast' is not known"):
        pack_linears(model, "fast")
    with pytest.raises(ValueError, match="use kernels='eager' or 'auto'"):
        pack_linears(model, "onednn")  # float16: oneDNN packs float32 (and bfloat16 where supported)
    with pytest.raises(ValueError, match="rowgemm runs float32 models on the CPU"):
        pack_linears(model, "rowgemm")


@needs_onednn
def test_pack_linears_swaps_every_linear_and_keeps_the_lm_head_weight_for_draft_heads(tiny_checkpoint):
    model = target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert pack_linears(model, "onednn") == linears
    assert not any(type(m) is nn.Linear for m in model.modules())
    head = model.get_output_embeddings()
    assert isinstance(head, PackedLinear) and head.weight.shape == (head.out_features, head.in_features)
