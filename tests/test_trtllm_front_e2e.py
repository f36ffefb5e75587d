"""The TensorRT-LLM repository's ``ensemble`` (specbuild's BLS front) through a real tritonserver,
with the unchanged client SDK and ``verify``.

The ``tensorrtllm`` backend needs a GPU, so ``tensorrt_llm`` / ``tensorrt_llm_draft`` are served by
a Python stand-in (tests/trtllm_standin.py) under the generated configs with only the backend
swapped: the front, its BLS calls and the tensor declarations are the real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trtllm_standin
from specbuild.client.prompts import load_prompts
from specbuild.client.sdk import RequestError, SpecClient
from specbuild.client.verify import verify
from specbuild.triton_repo.tritonserver import TritonServer
from specbuild.triton_repo.tensorrtllm import EngineModel, TrtllmRepoSpec, launch_command, write_trtllm_repository

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # ~60 s: five Python-backend models load
SHELL = "import sys\nsys.path.insert(0, {tests!r})\nfrom trtllm_standin import TritonPythonModel  # noqa: F401\n"


def standin_repository(tokenizer_dir: Path, out: Path, method: str = "draft_target") -> Path:
    spec = TrtllmRepoSpec(
        method=method, target=EngineModel("tensorrt_llm", out / "engines/target", "top_k_top_p"), tokenizer_dir=tokenizer_dir,
        end_id=0, pad_id=0, max_batch_size=2, max_draft_len=4,
        draft=EngineModel("tensorrt_llm_draft", out / "engines/draft", "top_k_top_p") if method == "draft_target" else None,
    )
    repo = out / "repo"
    write_trtllm_repository(spec, repo, launch_argv=launch_command(spec, repo, http_port=8000, grpc_port=8001, metrics_port=8002))
    for name, role in (("tensorrt_llm", "target"), ("tensorrt_llm_draft", "draft")):
        config = repo / name / "config.pbtxt"
        if config.exists():
            text = config.read_text().replace('backend: "tensorrtllm"', 'backend: "python"')
            text += f'parameters {{\n  key: "role"\n  value: {{\n    string_value: "{role}"\n  }}\n}}\n'
            config.write_text(text)
            (repo / name / "1" / "model.py").write_text(SHELL.format(tests=str(Path(__file__).parent)))
    return repo


def test_draft_target_front_verifies_with_the_unchanged_client(tiny_checkpoint, tmp_path):
    repo = standin_repository(tiny_checkpoint, tmp_path)
    with TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=tmp_path / "server.log") as server:
        with SpecClient(server.grpc_url) as client:
            client.wait_ready()
            report = verify(client, load_prompts("humaneval:2"), max_tokens=24, end_id=-1)
            base = client.generate("def add(a, b):", max_tokens=10, num_draft_tokens=0, end_id=-1)
            with pytest.raises(RequestError, match="exceeds the engine's max_draft_len 4"):
                client.generate("def add(a, b):", max_tokens=10, num_draft_tokens=9)
    assert report.all_match, [r.divergence for r in report.results if not r.match]
    assert 0 < report.total_accepted_draft_tokens < report.total_draft_tokens  # the draft is wrong every third token
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(str(tiny_checkpoint))("def add(a, b):")["input_ids"]
    assert base.output_ids == trtllm_standin.run(trtllm_standin.target_next, prompt, 10, -1)


def test_ngram_front_verifies_with_the_unchanged_client(tiny_checkpoint, tmp_path):
    repo = standin_repository(tiny_checkpoint, tmp_path, method="ngram")
    assert not (repo / "tensorrt_llm_draft").exists()
    with TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=tmp_path / "server.log") as server:
        with SpecClient(server.grpc_url) as client:
            client.wait_ready()
            report = verify(client, load_prompts("humaneval:2"), max_tokens=24, end_id=-1)
    assert report.all_match, [r.divergence for r in report.results if not r.match]
