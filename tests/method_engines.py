"""One reference engine per speculative method on the shared tiny target, with a "same" draft (an
oracle that proposes the target's own greedy continuation: everything accepted) and a "random" draft
(random heads / a random draft model / random tokens: mostly rejected), for the equivalence tests of
streaming and in-flight batching.

The oracles know the plain greedy output of each prompt (``truth``), find which prompt a context
belongs to, and propose what comes next; they stand in for the method's proposer behind the method's
own drafter class (an engine's ``make_drafter`` is swapped), so the engine's verification, cache
compaction and stopping run unchanged. Oracle drafters draft alone (they are no BatchDrafter).
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from specbuild.engine import GenerationRequest
from specbuild.runtime import EngineLimits, ReferenceEngine
from specbuild.engine.drafters import ChainDrafter
from specbuild.methods.eagle.engine import EagleConfig, EagleHead, FeatureTreeDrafter, TreeDraft, save_eagle_head
from specbuild.methods.eagle3.engine import Eagle3Config, Eagle3Head, FeatureChainDrafter, save_eagle3_head
from specbuild.methods.eagle3.tree import Eagle3TreeDrafter
from specbuild.methods.medusa.engine import MedusaConfig, MedusaHeads, TreeDrafter, save_medusa_heads
from specbuild.engine.scheduler import Scheduler
from specbuild.engine.stream import collect
from specbuild.engine.tree import SpecTree
from tiny_models import make_tiny_llama

VOCAB, HIDDEN = 384, 64
# The build's max_draft_len per method (a request's default num_draft_tokens).
DRAFT_LEN = {"plain": 0, "ngram": 4, "sa": 4, "draft_target": 4, "lookahead": 15, "medusa": 7, "eagle": 7, "eagle3": 4,
             "eagle3_tree": 7}  # eagle3_tree: EAGLE-3's dynamic tree, max_total_draft_tokens nodes


def limits(method: str) -> EngineLimits:
    return EngineLimits(max_batch_size=4, max_input_len=64, max_seq_len=160, max_draft_len=DRAFT_LEN[method])
CHOICES = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # 7 nodes, depth 3
# Four prompts with distinct first tokens (an oracle tells them apart by their prefix).
PROMPTS = [[17, 203, 44, 91, 300, 12], [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [42, 42, 7], [101, 102, 103, 104]]
NEW_TOKENS = 16
# Every method of the reference engine; a new method is covered by the equivalence, streaming and
# batching suites once it is added here (and to _configs and build_engines' oracles below).
METHODS = ("plain", "ngram", "sa", "draft_target", "lookahead", "medusa", "eagle", "eagle3", "eagle3_tree")
# (method, kind) pairs that exist: plain never speculates and lookahead has no draft to swap for an oracle.
CASES = [(m, k) for m in METHODS for k in ("same", "random") if not (k == "same" and m in ("plain", "lookahead"))]
# Drafts a "same" engine gets accepted per step at most (chain length, or the tree's depth).
DEPTH = {"ngram": 4, "sa": 4, "draft_target": 4, "eagle3": 4, "medusa": 3, "eagle": 3, "eagle3_tree": 3}


def greedy(prompt: list[int], max_tokens: int = NEW_TOKENS, **kwargs) -> GenerationRequest:
    return GenerationRequest(list(prompt), max_tokens, **{"end_id": -1, **kwargs})


class Truth:
    """The plain greedy continuation of each prompt, looked up by context."""

    def __init__(self, plain: dict[tuple[int, ...], list[int]]) -> None:
        self.plain = plain

    def next_tokens(self, context: Sequence[int], count: int, *, skip_first: bool = False) -> list[int]:
        """``count`` tokens after ``context`` (prompt + emitted; without the prompt's first token when
        ``skip_first``, as the EAGLE states hold it); past the end the last token repeats."""
        for prompt, plain in self.plain.items():
            head = prompt[1:] if skip_first else prompt
            if tuple(context[: len(head)]) == head:
                emitted = len(context) - len(head)
                return [plain[min(emitted + d, len(plain) - 1)] for d in range(count)]
        raise AssertionError(f"context {list(context)[:8]}... belongs to no known prompt")


class ChainOracle:
    """A :class:`~specbuild.engine.drafters.Proposer` proposing the true continuation."""

    def __init__(self, truth: Truth) -> None:
        self.truth = truth

    def propose(self, context, num_draft_tokens):
        return self.truth.next_tokens(context, num_draft_tokens)

    def update(self, context, num_accepted):
        del context, num_accepted


class RandomChain:
    """A chain proposer of seeded random tokens (nearly all rejected)."""

    def __init__(self) -> None:
        self.rng = random.Random(7)

    def propose(self, context, num_draft_tokens):
        del context
        return [self.rng.randrange(VOCAB) for _ in range(num_draft_tokens)]

    def update(self, context, num_accepted):
        del context, num_accepted


def _tree_tokens(truth: list[int], tree) -> list[int]:
    """Node tokens: the truth at child 0 of each depth, a wrong token at every other child."""
    return [(truth[len(p) - 1] + p[-1]) % VOCAB for p in tree.paths]


class TreeOracle:
    """A Medusa :class:`~specbuild.methods.medusa.engine.TreeProposer` filling the true path."""

    def __init__(self, truth: Truth, tree) -> None:
        self.truth, self.tree = truth, tree

    def propose_tree(self, context, hidden, tree):
        del hidden
        return [context[-1], *_tree_tokens(self.truth.next_tokens(context, tree.max_depth), tree)]


class FeatureTreeOracle:
    """An EAGLE :class:`~specbuild.methods.eagle.engine.FeatureTreeProposer` filling the true path."""

    def __init__(self, truth: Truth, tree, cap: int | None = None) -> None:
        self.truth, self.tree = truth, tree if cap is None else tree.first(cap)

    def new_state(self) -> list[int]:
        return []

    def capped(self, num_draft_tokens: int) -> FeatureTreeOracle:
        return FeatureTreeOracle(self.truth, self.tree, num_draft_tokens)

    def update(self, state, next_tokens, features):
        assert features.shape == (len(next_tokens), HIDDEN)  # the target's final-norm features
        state += next_tokens

    def propose(self, state, root, max_depth):
        tree = self.tree.truncated(max_depth)
        truth = self.truth.next_tokens(state, tree.max_depth, skip_first=True)
        return TreeDraft(tree, [root, *_tree_tokens(truth, tree)])


class FeatureChainOracle:
    """An :class:`~specbuild.methods.eagle3.engine.Eagle3Proposer` stand-in proposing the truth (it still
    captures the target's features through the real proposer)."""

    def __init__(self, truth: Truth, real) -> None:
        self.truth, self.real = truth, real

    def new_state(self) -> list[int]:
        return []

    def capture(self, hidden_states):
        return self.real.capture(hidden_states)

    def update(self, state, next_tokens, features):
        assert features.shape == (len(next_tokens), 3 * HIDDEN)  # three captured target layers
        state += next_tokens

    def propose(self, state, k):
        return self.truth.next_tokens(state, min(k, self.real.max_draft_len), skip_first=True)


class FusedTreeOracle(FeatureTreeOracle):
    """An :class:`~specbuild.methods.eagle3.tree.Eagle3TreeProposer` stand-in filling the true path (it still
    captures the target's fused features through the real proposer)."""

    def __init__(self, truth: Truth, tree, real, cap: int | None = None) -> None:
        super().__init__(truth, tree, cap)
        self.real = real

    def capped(self, num_draft_tokens: int) -> FusedTreeOracle:
        return FusedTreeOracle(self.truth, self.tree, self.real, num_draft_tokens)

    def capture(self, hidden_states):
        return self.real.capture(hidden_states)

    def update(self, state, next_tokens, features):
        assert features.shape == (len(next_tokens), 3 * HIDDEN)  # three captured target layers
        state += next_tokens


def _configs(root: Path) -> dict[str, dict | None]:
    """speculative_config per method, with random weights written under ``root``."""
    torch.manual_seed(3)
    medusa = MedusaConfig(medusa_num_heads=3, medusa_num_layers=1, hidden_size=HIDDEN, vocab_size=VOCAB)
    eagle = EagleConfig(hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                        num_hidden_layers=1, rms_norm_eps=1e-6, max_position_embeddings=512)
    eagle3 = Eagle3Config(hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                          rms_norm_eps=1e-6, max_position_embeddings=512, vocab_size=VOCAB, aux_layer_ids=(0, 1, 1))
    return {
        "plain": None,
        "ngram": {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2},
        "sa": {"decoding_type": "SA", "max_draft_len": 4},
        "draft_target": {"decoding_type": "DraftTarget", "max_draft_len": 4,
                         "speculative_model_dir": str(make_tiny_llama(root / "draft", seed=1, num_hidden_layers=1))},
        "lookahead": {"decoding_type": "Lookahead", "max_window_size": 4, "max_ngram_size": 3, "max_verification_set_size": 4},
        "medusa": {"decoding_type": "Medusa", "num_medusa_heads": 3, "medusa_choices": CHOICES,
                   "speculative_model_dir": str(save_medusa_heads(root / "medusa", MedusaHeads(medusa).heads.state_dict(), medusa))},
        "eagle": {"decoding_type": "Eagle", "eagle_choices": CHOICES, "num_eagle_layers": 3, "max_draft_len": 7,
                  "speculative_model_dir": str(save_eagle_head(root / "eagle", EagleHead(eagle).state_dict(), eagle))},
        "eagle3": {"decoding_type": "Eagle3", "max_draft_len": 4,
                   "speculative_model_dir": str(save_eagle3_head(root / "eagle3", Eagle3Head(eagle3).state_dict(), eagle3))},
        "eagle3_tree": {"decoding_type": "Eagle3", "max_draft_len": 3, "use_dynamic_tree": True, "dynamic_tree_max_topK": 3,
                        "max_total_draft_tokens": 7, "speculative_model_dir": str(root / "eagle3")},
    }


def build_engines(model, root: Path) -> dict[tuple[str, str], ReferenceEngine]:
    """``(method, kind)`` -> engine; kind "random" for every method, "same" (oracle) where a draft exists.

    Plain has only "random" (never speculates); lookahead has no draft to swap: its "random" is the
    real lookahead (its Jacobi guesses are mostly rejected on a random model).
    """
    engines: dict[tuple[str, str], ReferenceEngine] = {}
    for method, config in _configs(root).items():
        engines[method, "random"] = ReferenceEngine(model, limits=limits(method), end_id=-1, speculative_config=config)
    plain_engine = engines["plain", "random"]
    truth = Truth({tuple(p): plain_engine.generate(greedy(p, NEW_TOKENS + 8)).output_ids for p in PROMPTS})
    for chain in ("ngram", "sa"):  # their real drafts are tested in their own files; here random chains are rejected
        engines[chain, "random"]._method = dataclasses.replace(
            engines[chain, "random"]._method, make_drafter=lambda _, request: ChainDrafter(RandomChain(), request.num_draft_tokens))
    tree = SpecTree.from_choices(CHOICES)
    oracles = {  # (loaded, request) -> the method's drafter class over an oracle
        "ngram": lambda loaded, request: ChainDrafter(ChainOracle(truth), request.num_draft_tokens),
        "sa": lambda loaded, request: ChainDrafter(ChainOracle(truth), request.num_draft_tokens),
        "draft_target": lambda loaded, request: ChainDrafter(ChainOracle(truth), request.num_draft_tokens),
        "medusa": lambda loaded, request: TreeDrafter(TreeOracle(truth, tree), tree.first(request.num_draft_tokens)),
        "eagle": lambda loaded, request: FeatureTreeDrafter(FeatureTreeOracle(truth, tree).capped(request.num_draft_tokens)),
        "eagle3": lambda loaded, request: FeatureChainDrafter(FeatureChainOracle(truth, loaded.proposer), request.num_draft_tokens),
        "eagle3_tree": lambda loaded, request: Eagle3TreeDrafter(FusedTreeOracle(truth, tree, loaded.proposer).capped(request.num_draft_tokens)),
    }
    for method, make in oracles.items():
        engine = ReferenceEngine(model, limits=limits(method), end_id=-1, speculative_config=engines[method, "random"].speculative_config)
        engine._method = dataclasses.replace(engine._method, make_drafter=make)
        engines[method, "same"] = engine
    return engines


def check_greedy(method: str, kind: str, results, plain: dict[tuple[int, ...], list[int]], depth: int | None = None) -> None:
    """``results`` (one per prompt of PROMPTS, NEW_TOKENS each) equal plain greedy decoding, after at least
    two verify steps; a "same" draft gets ``depth`` (default DEPTH[method]) drafts accepted at every
    step, a "random" one has most of its drafts rejected."""
    for prompt, result in zip(PROMPTS, results):
        assert result.output_ids == plain[tuple(prompt)], (method, kind, prompt)
        assert result.finish_reason == "length" and result.num_decoding_iterations >= 2
        assert result.num_decoding_iterations == NEW_TOKENS - 1 - result.total_accepted_draft_tokens
        assert result.total_accepted_draft_tokens <= result.total_draft_tokens
    if kind == "same":  # the whole depth accepted at every step
        per_step = (DEPTH[method] if depth is None else depth) + 1
        assert all(r.num_decoding_iterations == -(-(NEW_TOKENS - 1) // per_step) for r in results)
    elif method != "plain":  # drafts were verified, and most were rejected
        assert sum(r.total_draft_tokens for r in results) > 2 * sum(r.total_accepted_draft_tokens for r in results)


def mixed_requests(method: str) -> list[GenerationRequest]:
    """Eight requests: the four prompts (3 to 13 tokens) twice, each with its own draft length, some
    speculative and some plain (``num_draft_tokens=0``); lookahead rows also vary ``(w, n, g)``."""
    top = DRAFT_LEN[method]
    lengths = [top, 0, 1, top, 0, max(top // 2, 1), top, 2 if top >= 2 else 0]
    windows = [None, None, (2, 2, 1), (4, 3, 4), None, (1, 1, 0), (3, 3, 2), None]
    requests = []
    for i, k in enumerate(lengths):
        extra = {"lookahead_config": windows[i]} if method == "lookahead" and k else {}
        requests.append(greedy(PROMPTS[i % 4], num_draft_tokens=min(k, top), **extra))
    return requests


def check_mixed_batch(engine: ReferenceEngine, plain: dict[tuple[int, ...], list[int]], method: str, kind: str) -> None:
    """:func:`mixed_requests` in a batch of up to 8 whose rows join in three waves, each wave once the
    previous one is decoding: every output equals plain greedy decoding, and every request's acceptance
    counters equal those of the same request run alone (batching never changes them)."""
    requests = mixed_requests(method)
    alone = [engine.generate(r) for r in requests]
    steps: list[list] = [[] for _ in requests]
    stepped = [threading.Event() for _ in requests]
    finished = threading.Semaphore(0)

    def on_step(i, step):
        steps[i].append(step)
        if step.num_decoding_iterations >= 1:
            stepped[i].set()  # past its prefill: the next wave joins a batch that is decoding
        if step.is_final:
            finished.release()

    with Scheduler(engine, max_batch_size=8) as scheduler:
        for wave in (range(0, 3), range(3, 6), range(6, 8)):
            for i in wave:
                scheduler.submit(requests[i], lambda step, i=i: on_step(i, step), pytest.fail)
            assert stepped[wave[0]].wait(60)
        for _ in requests:
            assert finished.acquire(timeout=120)
    together = [collect(s) for s in steps]
    assert scheduler.max_active_seen >= 4
    for request, batched, single in zip(requests, together, alone):
        assert batched.output_ids == plain[tuple(request.input_ids)], (method, kind, request)
        assert (batched.total_draft_tokens, batched.total_accepted_draft_tokens, batched.num_decoding_iterations) == (
            single.total_draft_tokens, single.total_accepted_draft_tokens, single.num_decoding_iterations
        ), (method, kind, request)
        if request.num_draft_tokens == 0:
            assert batched.total_draft_tokens == 0 and batched.num_decoding_iterations == NEW_TOKENS - 1


def check_sampled_batch(engine: ReferenceEngine) -> None:
    """Seeded sampled requests (temperature 0.8, top-k 50) give the same tokens alone and four in flight:
    each request owns its sampler, so batching changes nothing."""
    requests = [greedy(p, temperature=0.8, top_k=50, seed=11 + i) for i, p in enumerate(PROMPTS)]
    alone = [engine.generate(r) for r in requests]
    with Scheduler(engine, max_batch_size=4) as scheduler:
        together = [collect(s) for s in [scheduler.stream(r) for r in requests]]
    assert together == alone
    assert sum(r.total_draft_tokens for r in alone) > 0
