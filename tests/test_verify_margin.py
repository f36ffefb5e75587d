"""Logit margins from a real server, and the Hugging Face oracle, on the tiny checkpoint.

The server's ``logit_margin`` / ``runner_up_ids`` must be the target's own top-two logits (checked
against transformers run here), so the margin verify prints at a divergence can be trusted; the
oracle must agree with a correct deployment and disagree, with its margin, with another checkpoint.
"""

from __future__ import annotations

import pytest
import torch

from specbuild.client.oracle import HFOracle, OracleError, compare_with_oracle
from specbuild.client.prompts import Prompt
from specbuild.client.sdk import SpecClient
from specbuild.client.verify import verify
from tiny_models import make_tiny_llama

pytestmark = pytest.mark.e2e
PROMPTS = [
    Prompt("repeat", "for i in range(10):\n    print(i, i * i)\nfor i in range(10):\n    print(i"),
    Prompt("code", "def fib(n):\n    if n < 2:\n        return n\n"),
]
MAX_TOKENS = 12


@pytest.fixture
def server(plain_server):
    return plain_server[0]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_server_margins_are_the_targets_top_two_logits(server, tiny_checkpoint, protocol):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    url = server.grpc_url if protocol == "grpc" else server.http_url
    with SpecClient(url, protocol=protocol) as client:
        result = client.generate(PROMPTS[0].text, max_tokens=MAX_TOKENS, end_id=-1, return_logit_margin=True)
        plain = client.generate(PROMPTS[0].text, max_tokens=MAX_TOKENS, end_id=-1)
    assert result.output_ids == plain.output_ids and plain.logit_margin is None  # only when asked for
    assert len(result.logit_margin) == len(result.runner_up_ids) == MAX_TOKENS
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    prompt = AutoTokenizer.from_pretrained(tiny_checkpoint)(PROMPTS[0].text)["input_ids"]
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + result.output_ids[:-1]])).logits[0, len(prompt) - 1 :]  # [n, vocab]
    top = logits.topk(2, dim=-1)
    assert top.indices[:, 0].tolist() == result.output_ids  # greedy: each token is the top-1
    assert result.runner_up_ids == top.indices[:, 1].tolist()
    assert result.logit_margin == pytest.approx((top.values[:, 0] - top.values[:, 1]).tolist(), abs=1e-4)
    assert all(m >= 0 for m in result.logit_margin)


def test_verify_on_a_correct_deployment_fetches_no_margins(server):
    with SpecClient(server.grpc_url) as client:
        report = verify(client, PROMPTS, max_tokens=MAX_TOKENS, end_id=-1)
    assert report.all_match and report.passed and report.num_near_ties == 0


def test_oracle_agrees_with_the_deployment_on_its_checkpoint(server, tiny_checkpoint):
    with SpecClient(server.grpc_url) as client:
        for end_id in (-1, None):
            report = compare_with_oracle(client, PROMPTS, HFOracle(tiny_checkpoint), max_tokens=MAX_TOKENS, end_id=end_id)
            assert report.all_match, report.describe()
            assert all(len(r.oracle_ids) == MAX_TOKENS for r in report.results) or end_id is None


def test_oracle_on_another_checkpoint_disagrees_and_shows_its_margin(server, tmp_path):
    other = make_tiny_llama(tmp_path / "other", seed=1)  # same tokenizer, other weights
    with SpecClient(server.grpc_url) as client:
        report = compare_with_oracle(client, PROMPTS, HFOracle(other), max_tokens=MAX_TOKENS, end_id=-1)
    assert not report.all_match
    d = report.results[0].baseline_divergence
    assert d is not None and d.logit_margin is not None and d.logit_margin >= 0 and d.runner_up_token is not None
    assert "ORACLE DISAGREES" in report.describe() and "oracle margin" in report.describe()


def test_oracle_refuses_a_folder_without_a_checkpoint(tmp_path):
    with pytest.raises(OracleError, match="no config.json"):
        HFOracle(tmp_path)


def test_verify_cli_sampling_and_oracle(server, tiny_checkpoint, tmp_path):
    import json

    from click.testing import CliRunner

    from specbuild.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": p.id, "prompt": p.text}) + "\n" for p in PROMPTS))
    common = ["verify", "--url", server.grpc_url, "--prompts", str(prompts)]
    sampling = CliRunner().invoke(main, [*common, "--sampling", "--samples", "30", "--positions", "8", "--sampling-prompts", "1",
                                         "--top-k", "3", "--report", str(tmp_path / "s.json")])
    assert sampling.exit_code == 0, sampling.output
    summary = json.loads((tmp_path / "s.json").read_text())["summary"]
    assert summary["passed"] and summary["exercised"] and summary["num_tests"] == 9 and 0 < summary["p_value"] <= 1
    # 30 samples per arm detect only large shifts: a pass is "not rejected", never "equivalent"
    assert "NOT REJECTED (low power" in sampling.output and "EQUIVALENT" not in sampling.output
    assert "total-variation shift >=" in sampling.output
    greedy = CliRunner().invoke(main, [*common, "--max-tokens", "8", "--end-id", "-1", "--hf-oracle", str(tiny_checkpoint),
                                       "--report", str(tmp_path / "g.json")])
    assert greedy.exit_code == 0, greedy.output
    assert "ORACLE AGREES: 2/2" in greedy.output and json.loads((tmp_path / "g.oracle.json").read_text())["all_match"]


def test_generation_logits_are_not_served_here_and_that_is_a_rejection(server):
    """The reference deployment has no generation_logits (TensorRT-LLM's route to the margin): a 400, named."""
    from specbuild.client.sdk import RequestError

    with SpecClient(server.http_url, protocol="http") as client:
        with pytest.raises(RequestError, match="generation_logits") as info:
            client.generate(PROMPTS[0].text, max_tokens=2, return_generation_logits=True)
    assert info.value.invalid_argument and info.value.attempts == 1
