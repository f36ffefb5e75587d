"""NVIDIA's AIPerf (PyPI ``aiperf``) as a third-party client of a specbuild deployment, both doors:
the OpenAI front (``--endpoint-type completions --streaming``) and Triton's own generate endpoint
(``--endpoint-type template`` with ``benchmarks/aiperf/triton_generate.json``, reading ``text_output``).

AIPerf needs numpy >= 2, which the Triton Python backend here cannot take (numpy < 2), so it lives in
its own virtual environment: ``python3 -m venv ~/aiperf && ~/aiperf/bin/pip install aiperf``, then
``SPECBUILD_AIPERF=~/aiperf/bin/aiperf pytest -m slow tests/test_aiperf.py``. Skipped without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import write_recipe

AIPERF = os.environ.get("SPECBUILD_AIPERF") or shutil.which("aiperf")
TEMPLATE = Path(__file__).resolve().parents[1] / "benchmarks" / "aiperf" / "triton_generate.json"
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(AIPERF is None, reason="AIPerf not installed: set SPECBUILD_AIPERF to its executable (see module docstring)"),
]
LOAD = ["--synthetic-input-tokens-mean", "32", "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", "16",
        "--output-tokens-stddev", "0", "--concurrency", "2", "--request-count", "8", "--ui-type", "none"]


@pytest.fixture(scope="module")
def served(tiny_checkpoint, tmp_path_factory):
    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine
    from specbuild.triton_repo.reference_repository import spec_from_engine_dir, write_reference_repository
    from specbuild.triton_repo.openai_frontend import OpenAIServer, config_from_deployment
    from specbuild.triton_repo.tritonserver import TritonServer

    out = tmp_path_factory.mktemp("aiperf")
    loaded = load_recipe(str(write_recipe(out / "r.yaml", tiny_checkpoint)))
    engine_dir = build_reference_engine(loaded, out / "engine", log=lambda m: None).engine_dir
    repo = write_reference_repository(spec_from_engine_dir(engine_dir, decoupled=True), out / "repo")
    with TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=out / "server.log") as triton:
        with OpenAIServer(config_from_deployment(triton.grpc_url, model="tiny"), port=0) as front:
            yield triton, front, str(engine_dir / "tokenizer")


def _profile(args: list[str], artifacts: Path) -> dict:
    result = subprocess.run([AIPERF, "profile", *args, *LOAD, "--artifact-dir", str(artifacts)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((artifacts / "profile_export_aiperf.json").read_text())


def test_aiperf_through_the_openai_front(served, tmp_path):
    _, front, tokenizer = served
    base = front.url.removesuffix("/v1")
    data = _profile(["--model", "tiny", "--url", base, "--endpoint-type", "completions", "--streaming", "--tokenizer",
                     tokenizer, "--extra-inputs", "ignore_eos:true"], tmp_path / "openai")
    assert data["request_count"]["avg"] == 8 and not data.get("error_summary")
    assert data["time_to_first_token"]["avg"] > 0


def test_aiperf_reads_text_output_from_triton_generate(served, tmp_path):
    triton, _, tokenizer = served
    data = _profile(["--model", "ensemble", "--url", f"http://{triton.http_url}/v2/models/ensemble/generate",
                     "--endpoint-type", "template", "--extra-inputs", f"payload_template:{TEMPLATE}",
                     "--extra-inputs", "response_field:text_output", "--tokenizer", tokenizer], tmp_path / "triton")
    assert data["request_count"]["avg"] == 8 and not data.get("error_summary")
    assert data["output_sequence_length"]["avg"] > 0  # AIPerf read a text_output from every response
