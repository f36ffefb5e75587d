"""The engine on transformers' own forward: the path a CUDA device runs (``engine/forward.py`` past
:func:`~specbuild.engine.decoder.supports`: the rows padded to the widest, a :class:`SlotCache`, the
engine's per-row attention), with transformers' linear layers.

On the CPU the engine normally takes its own layer loop (``engine/decoder.py``), so here that loop is
switched off and every pass must go through transformers' ``LlamaForCausalLM.forward``. The ``cuda``
cases run the same checks on a GPU where one is present (skipped otherwise): every method, alone, four
in flight and eight joining in waves with per-request draft lengths, equals plain greedy decoding, and
plain decoding equals transformers' ``generate()`` on the same device.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from method_engines import CASES, PROMPTS, build_engines, check_greedy, check_mixed_batch, check_sampled_batch, greedy  # noqa: E402

from specbuild.engine import decoder  # noqa: E402
from specbuild.engine import target as target_model  # noqa: E402
from specbuild.engine.scheduler import Scheduler  # noqa: E402
from specbuild.engine.stream import collect  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")])]


@pytest.fixture(scope="module", params=DEVICES)
def path_engines(request, tiny_checkpoint, tmp_path_factory):
    """``(device, (method, kind) -> engine)`` on the tiny target loaded on ``device`` with transformers'
    linears, every pass through transformers' forward."""
    device = request.param
    with pytest.MonkeyPatch.context() as patch:
        if device == "cpu":
            patch.setattr(decoder, "supports", lambda model: False)

        def lean_loop(*args, **kwargs):
            raise AssertionError("the engine's own layer loop ran; this suite checks transformers' forward")

        patch.setattr(decoder, "forward_rows", lean_loop)
        model = target_model.load_target(tiny_checkpoint, dtype="float32", device=device, trust_remote_code=False)
        yield device, build_engines(model, tmp_path_factory.mktemp(f"transformers_path_{device}"))


@pytest.fixture(scope="module")
def plain(path_engines) -> dict[tuple[int, ...], list[int]]:
    _, engines = path_engines
    engine = engines["plain", "random"]
    return {tuple(p): engine.generate(greedy(p, num_draft_tokens=0)).output_ids for p in PROMPTS}


def test_plain_decoding_equals_transformers_generate(path_engines, plain):
    from transformers import GenerationConfig

    device, engines = path_engines
    model = engines["plain", "random"].model
    assert model.device.type == device
    config = GenerationConfig(do_sample=False, max_new_tokens=len(next(iter(plain.values()))), eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        for prompt, ours in plain.items():
            theirs = model.generate(torch.tensor([prompt], device=device), generation_config=config)[0, len(prompt) :].tolist()
            assert ours == theirs, prompt


@pytest.mark.parametrize("method, kind", CASES)
def test_one_request_equals_plain_greedy(path_engines, plain, method, kind):
    _, engines = path_engines
    engine = engines[method, kind]
    check_greedy(method, kind, [engine.generate(greedy(p)) for p in PROMPTS], plain)


@pytest.mark.parametrize("method, kind", CASES)
def test_four_requests_in_flight_equal_plain_greedy(path_engines, plain, method, kind):
    device, engines = path_engines
    with Scheduler(engines[method, kind], max_batch_size=4) as scheduler:
        results = [collect(s) for s in [scheduler.stream(greedy(p)) for p in PROMPTS]]
        assert {cache.device.type for cache in scheduler.worker.pool.keys} == {device}  # the KV cache lives on the device
    assert scheduler.max_active_seen == 4
    check_greedy(method, kind, results, plain)


@pytest.mark.parametrize("method, kind", CASES)
def test_eight_mixed_requests_joining_at_different_times_equal_plain_greedy(path_engines, plain, method, kind):
    _, engines = path_engines
    check_mixed_batch(engines[method, kind], plain, method, kind)


def test_sampled_requests_give_the_same_tokens_in_a_batch(path_engines):
    """Speculative sampling on this path: each seeded request gives the same tokens alone and batched."""
    _, engines = path_engines
    check_sampled_batch(engines["draft_target", "random"])
