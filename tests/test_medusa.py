"""Medusa: the head format (load/save), the tree proposer, and greedy equivalence of Medusa decoding."""

from __future__ import annotations

import json
import random

import pytest
import torch

from conftest import hf_greedy
from drive import generate_alone
from specbuild.engine import worker
from specbuild.methods.medusa.engine import (
    MedusaConfig,
    MedusaHeads,
    MedusaProposer,
    TreeDrafter,
    load_medusa_heads,
    save_medusa_heads,
)
from specbuild.engine.tree import SpecTree, accept_tree_greedy
from specbuild.methods.base import MC_SIM_7B_63

VOCAB, HIDDEN = 384, 64
CONFIG = MedusaConfig(medusa_num_heads=4, medusa_num_layers=1, hidden_size=HIDDEN, vocab_size=VOCAB)
DEFAULT_TREE = SpecTree.from_choices(MC_SIM_7B_63)
USER_TREE = SpecTree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
PROMPTS = [[17, 203, 44, 91, 300, 12], [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [42]]
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def plain_outputs(model) -> list[list[int]]:
    return hf_greedy(model, PROMPTS, NEW_TOKENS)


def _generate(model, proposer, prompt, *, max_tokens: int, tree: SpecTree):
    """Greedy decoding of ``prompt`` with ``proposer``'s trees (``tree``, cut per step), through the worker alone."""
    return generate_alone(model, TreeDrafter(proposer, tree), prompt, max_tokens=max_tokens, max_block=1 + tree.num_nodes)


def _random_heads(config: MedusaConfig = CONFIG, seed: int = 0) -> MedusaHeads:
    torch.manual_seed(seed)
    return MedusaHeads(config).eval()


# --- format ------------------------------------------------------------------------------------


def test_state_dict_uses_the_on_disk_names():
    config = MedusaConfig(medusa_num_heads=2, medusa_num_layers=2, hidden_size=8, vocab_size=16)
    state = MedusaHeads(config).heads.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == config.expected_shapes()
    assert set(state) == {
        "0.0.linear.weight", "0.0.linear.bias", "0.1.linear.weight", "0.1.linear.bias", "0.2.weight",
        "1.0.linear.weight", "1.0.linear.bias", "1.1.linear.weight", "1.1.linear.bias", "1.2.weight",
    }


def test_resblock_and_head_math():
    heads = _random_heads()
    x = torch.randn(HIDDEN)
    block, projection = heads.heads[1][0], heads.heads[1][1]
    expected = projection.weight @ (x + torch.nn.functional.silu(block.linear.weight @ x + block.linear.bias))
    torch.testing.assert_close(heads(x)[1], expected)
    assert heads(x).shape == (4, VOCAB)


def test_save_load_round_trip(tmp_path):
    heads = _random_heads()
    save_medusa_heads(tmp_path, heads.heads.state_dict(), CONFIG)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "medusa_lm_head.safetensors"]
    assert json.loads((tmp_path / "config.json").read_text())["medusa_num_heads"] == 4
    loaded = load_medusa_heads(tmp_path)
    assert loaded.config == CONFIG
    for (name, tensor), (loaded_name, loaded_tensor) in zip(heads.heads.state_dict().items(), loaded.heads.state_dict().items()):
        assert name == loaded_name and torch.equal(tensor, loaded_tensor)


def test_load_fasterdecoding_config_without_sizes(tmp_path):
    """FasterDecoding's config.json has no hidden_size / vocab_size: they come from the projection's shape."""
    heads = _random_heads()
    save_medusa_heads(tmp_path, heads.heads.state_dict(), CONFIG)
    medusa_config = {"medusa_num_heads": 4, "medusa_num_layers": 1, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}
    (tmp_path / "config.json").write_text(json.dumps(medusa_config))
    assert load_medusa_heads(tmp_path).config == CONFIG


def test_load_pt_with_weights_only(tmp_path):
    heads = _random_heads()
    save_medusa_heads(tmp_path, heads.heads.state_dict(), CONFIG)
    (tmp_path / "medusa_lm_head.safetensors").unlink()
    torch.save(heads.heads.state_dict(), tmp_path / "medusa_lm_head.pt")
    x = torch.randn(HIDDEN)
    torch.testing.assert_close(load_medusa_heads(tmp_path)(x), heads(x))


def test_head_count_mismatch_names_the_override(tmp_path):
    """medusa-vicuna-7b-v1.3 says medusa_num_heads=2 but holds 4 (TensorRT-LLM's --fixed_num_medusa_heads)."""
    save_medusa_heads(tmp_path, _random_heads().heads.state_dict(), CONFIG)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "medusa_num_heads": 2, "base_model_name_or_path": "x"}))
    with pytest.raises(ValueError, match=r"medusa_num_heads=2.*the weights hold 4 heads.*unexpected \['2\.0"):
        load_medusa_heads(tmp_path)
    assert load_medusa_heads(tmp_path, num_heads=4).config.medusa_num_heads == 4


def test_format_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a Medusa head directory"):
        load_medusa_heads(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_layers": 1}))
    torch.save({}, tmp_path / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match=r"missing key\(s\) \['medusa_num_heads'\]"):
        load_medusa_heads(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 4, "medusa_num_layers": 1}))
    with pytest.raises(ValueError, match=r"missing key\(s\) \['hidden_size', 'vocab_size'\] and no tensor 0\.1\.weight"):
        load_medusa_heads(tmp_path)
    (tmp_path / "medusa_lm_head.pt").unlink()
    with pytest.raises(ValueError, match="medusa_num_heads must be an integer >= 1"):
        MedusaConfig(medusa_num_heads=0, medusa_num_layers=1, hidden_size=8, vocab_size=8)
    state = _random_heads().heads.state_dict()
    with pytest.raises(ValueError, match=r"tensor 0\.1\.weight has shape \(384, 32\), expected \(384, 64\)"):
        save_medusa_heads(tmp_path, {**state, "0.1.weight": torch.zeros(VOCAB, 32)}, CONFIG)
    with pytest.raises(ValueError, match=r"missing \['3\.1\.weight'\]"):
        save_medusa_heads(tmp_path, {k: v for k, v in state.items() if k != "3.1.weight"}, CONFIG)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG.__dict__))
    with pytest.raises(FileNotFoundError, match="neither medusa_lm_head.safetensors nor medusa_lm_head.pt"):
        load_medusa_heads(tmp_path)


# --- proposer ----------------------------------------------------------------------------------


def test_proposer_fills_the_tree_from_top_k():
    heads, x = _random_heads(), torch.randn(HIDDEN)
    tree = SpecTree.from_choices([[0], [1], [0, 0], [0, 1], [1, 2]])
    top = [heads(x)[d].topk(3).indices.tolist() for d in range(2)]
    tokens = MedusaProposer(heads, tree).propose_tree([9, 8, 7], x)
    # node order: [0], [1], [0, 0], [0, 1], [1, 2]
    assert tokens == [7, top[0][0], top[0][1], top[1][0], top[1][1], top[1][2]]
    assert MedusaProposer(heads, DEFAULT_TREE).propose_tree([7], x, tree.truncated(0)) == [7]


def test_requests_drafted_together_get_the_trees_they_get_alone():
    """propose_trees (each head run once for every request of a batch) gives each request, with its own
    tree, the tokens propose_tree gives it alone."""
    from specbuild.engine.draft_linear import pack_draft_linears

    heads = _random_heads(seed=4)
    for head in heads.heads:
        pack_draft_linears(head[:-1])  # as the engine loads them
    proposer = MedusaProposer(heads, DEFAULT_TREE)
    trees = [DEFAULT_TREE, USER_TREE.truncated(1), DEFAULT_TREE.first(5), USER_TREE.truncated(0), USER_TREE]
    contexts = [[3, 4, 5], [9], [1, 2], [7, 7], [8]]
    hiddens = list(torch.randn(len(trees), HIDDEN))
    with torch.inference_mode():
        together = proposer.propose_trees(contexts, hiddens, trees)
        alone = [proposer.propose_tree(c, h, t) for c, h, t in zip(contexts, hiddens, trees)]
    assert together == alone
    assert [len(t) for t in together] == [1 + t.num_nodes for t in trees]


def test_proposer_refuses_a_tree_deeper_than_the_heads():
    with pytest.raises(ValueError, match="tree depth 4 exceeds medusa_num_heads=3"):
        MedusaProposer(_random_heads(MedusaConfig(3, 1, HIDDEN, VOCAB)), DEFAULT_TREE)


# --- greedy equivalence ------------------------------------------------------------------------


def _lm_head_heads(model) -> MedusaHeads:
    """Heads that are the target's own LM head (ResBlocks zeroed: x + SiLU(0) = x): head 0 guesses a repeat."""
    heads = _random_heads()
    with torch.no_grad():
        for head in heads.heads:
            head[0].linear.weight.zero_()
            head[0].linear.bias.zero_()
            head[1].weight.copy_(model.lm_head.weight)
    return heads


@pytest.mark.parametrize("tree", [DEFAULT_TREE, USER_TREE], ids=["mc_sim_7b_63", "user"])
@pytest.mark.parametrize("kind", ["random", "lm_head"])
def test_medusa_equals_plain_greedy(model, plain_outputs, tree, kind):
    """Random heads are (nearly) always rejected; LM-head heads get accepted where the tiny model loops."""
    heads = _random_heads(seed=3) if kind == "random" else _lm_head_heads(model)
    accepted = 0
    for prompt, plain in zip(PROMPTS, plain_outputs):
        result = _generate(model, MedusaProposer(heads, tree), prompt, max_tokens=NEW_TOKENS, tree=tree)
        assert result.output_ids == plain, f"prompt {prompt}"
        assert result.finish_reason == "length"
        assert result.num_decoding_iterations >= 2
        assert result.num_decoding_iterations == NEW_TOKENS - 1 - result.total_accepted_draft_tokens
        assert result.total_accepted_draft_tokens < result.total_draft_tokens
        accepted += result.total_accepted_draft_tokens
    if kind == "lm_head":
        assert accepted > 0


class _OracleProposer:
    """Puts the target's true continuation at child index ``r_d`` of depth ``d`` and wrong tokens elsewhere.

    ``noise_seed=None``: ``r_d = 0`` ("same" draft, the all-zeros path always accepted); otherwise ``r_d`` is
    drawn per step from ``0..top_k`` (``top_k`` = absent), so accepted paths end at varied depths and
    go through non-first children.
    """

    def __init__(self, prompt: list[int], plain: list[int], noise_seed: int | None = None) -> None:
        self.prompt_len, self.plain = len(prompt), plain
        self.rng = None if noise_seed is None else random.Random(noise_seed)

    def propose_tree(self, context, hidden, tree):
        emitted = len(context) - self.prompt_len
        true_tokens = [self.plain[min(emitted + d, len(self.plain) - 1)] for d in range(tree.max_depth)]
        right = [0 if self.rng is None else self.rng.randrange(k + 1) for k in tree.top_k_per_depth]
        return [context[-1]] + [
            true_tokens[len(p) - 1] if p[-1] == right[len(p) - 1] else (true_tokens[len(p) - 1] + 1 + p[-1]) % VOCAB
            for p in tree.paths
        ]


def test_same_draft_accepts_the_full_depth_of_the_default_tree(model, plain_outputs):
    """Depth 4 of mc_sim_7b_63 (a user tree, every method: tests/test_method_equivalence.py)."""
    prompt, plain, tree = PROMPTS[0], plain_outputs[0], DEFAULT_TREE
    result = _generate(model, _OracleProposer(prompt, plain), prompt, max_tokens=NEW_TOKENS, tree=tree)
    assert result.output_ids == plain
    assert result.num_decoding_iterations == -(-(NEW_TOKENS - 1) // (tree.max_depth + 1))
    assert result.total_accepted_draft_tokens == NEW_TOKENS - 1 - result.num_decoding_iterations


@pytest.mark.parametrize("seed", [0, 1])
def test_partly_right_draft_equals_plain_greedy(model, plain_outputs, monkeypatch, seed):
    accepted_choices = []

    def recording_accept(tree, tree_tokens, target_tokens):
        acceptance = accept_tree_greedy(tree, tree_tokens, target_tokens)
        accepted_choices.append(tree.paths[acceptance.last_index - 1] if acceptance.accepted_nodes else ())
        return acceptance

    monkeypatch.setattr(worker, "accept_tree_greedy", recording_accept)
    for prompt, plain in zip(PROMPTS, plain_outputs):
        proposer = _OracleProposer(prompt, plain, noise_seed=seed)
        result = _generate(model, proposer, prompt, max_tokens=NEW_TOKENS, tree=DEFAULT_TREE)
        assert result.output_ids == plain
    depths = {len(choice) for choice in accepted_choices}
    assert len(depths) >= 2 and max(depths) >= 2, f"accepted depths {depths}"
    assert any(any(c != 0 for c in choice) for choice in accepted_choices), "only first children were accepted"


def test_step_keeps_the_accepted_path_and_feeds_its_hidden_state(model, plain_outputs):
    prompt, plain = PROMPTS[1], plain_outputs[1]
    drafter = TreeDrafter(_OracleProposer(prompt, plain), DEFAULT_TREE)
    request = worker.InflightRequest(list(prompt), NEW_TOKENS, -1, drafter)
    running = worker.Worker(model, max_batch_size=1, max_seq_len=64, max_block=64, max_num_tokens=64)
    running.add(request)
    (_, first), = running.step()  # prefill
    prefill_hidden = drafter.hidden
    (_, step), = running.step()  # one tree verification: the whole depth (4) accepted + bonus
    # the heads' next input: the final-norm state where a sequential run predicts the bonus token
    with torch.inference_mode():
        sequential = model(input_ids=torch.tensor([[*prompt, *plain[:5]]]), output_hidden_states=True)
    assert first.token_ids == plain[:1] and step.token_ids == plain[1:6]
    assert running.pool.lengths[request.slot] == len(prompt) + 1 + 4
    assert drafter.hidden.shape == (HIDDEN,)
    torch.testing.assert_close(drafter.hidden, sequential.hidden_states[-1][0, -1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(prefill_hidden, sequential.hidden_states[-1][0, len(prompt) - 1], rtol=1e-4, atol=1e-5)

