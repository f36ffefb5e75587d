import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import make_tiny_llama  # noqa: E402


SERVER_START_ENV = "SPECBUILD_TEST_SERVER_START_S"


BASE_SERVER_START_S = 300.0  # TritonServer's own default, enough on an idle 2-core machine
MAX_LOAD_FACTOR = 4.0


def server_start_timeout_s(environ=os.environ, load: float | None = None, cores: int | None = None) -> float:
    """Seconds the end-to-end tests give tritonserver to become ready: ``$SPECBUILD_TEST_SERVER_START_S``,
    else 300 s scaled by how busy the machine is when the session starts: x the 1-minute load average
    per core (``load`` / ``cores``, default ``os.getloadavg()[0]`` / ``os.cpu_count()``), at least x1
    and at most x4 (1,200 s). Example: load 10 on 2 cores -> 1,200 s; load 1 on 2 cores -> 300 s.
    The all-methods fixture loads ten Python-backend models, which took over 4.5 minutes at load 10.

    Raises:
        pytest.UsageError: the variable is not a positive number.
    """
    if SERVER_START_ENV not in environ:
        if load is None:
            try:
                load = os.getloadavg()[0]
            except OSError:  # not available on this platform
                load = 0.0
        per_core = load / max(1, cores or os.cpu_count() or 1)
        return BASE_SERVER_START_S * min(MAX_LOAD_FACTOR, max(1.0, per_core))
    text = environ[SERVER_START_ENV]
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise pytest.UsageError(f"{SERVER_START_ENV}={text!r}: give the tritonserver start timeout in seconds, e.g. 600")
    return value


@pytest.fixture(scope="session", autouse=True)
def server_start_timeout():
    """Every TritonServer a test starts without its own ``startup_timeout_s`` waits
    :func:`server_start_timeout_s` (the ``ServerStartError`` "not ready after N s")."""
    from specbuild.triton_repo.tritonserver import TritonServer

    timeout_s = server_start_timeout_s()
    init = TritonServer.__init__

    def with_timeout(self, *args, startup_timeout_s: float = timeout_s, **kwargs):
        init(self, *args, startup_timeout_s=startup_timeout_s, **kwargs)

    TritonServer.__init__ = with_timeout
    yield timeout_s
    TritonServer.__init__ = init


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A random tiny Llama + BPE tokenizer (vocab 384, eos id 0), made once per session."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    """The tiny target (transformers Llama, fp32, CPU), loaded once per test module (a module may change
    it: each gets its own). A module that needs another target defines its own ``model``."""
    from specbuild.engine import target as target_model

    return target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)


def hf_greedy(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Transformers' own greedy ``generate()`` of ``new_tokens`` per prompt (no end token): the oracle."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        return [model.generate(torch.tensor([p]), generation_config=config)[0, len(p) :].tolist() for p in prompts]


def write_recipe(
    path: Path, checkpoint: Path, *, method: str = "ngram", extra: str = "", speculation: str | None = None,
    max_seq_len: int = 500,
) -> Path:
    """A recipe for the tiny checkpoint with free ports and small limits.

    ``speculation``: the lines under ``speculation:`` (two-space indented, e.g. ``"  method: medusa\\n
    medusa_model: heads\\n"``); None -> n-gram (``method="ngram"``) or none.
    """
    if speculation is None:
        speculation = "  method: ngram\n  max_draft_len: 4\n  max_matching_ngram_size: 2\n" if method == "ngram" else "  method: none\n"
    path.write_text(
        f"name: tiny-{method}\n"
        f"target:\n  checkpoint: {checkpoint}\n"
        f"speculation:\n{speculation}"
        f"build:\n  max_batch_size: 4\n  max_input_len: 400\n  max_seq_len: {max_seq_len}\n"
        "serve:\n  http_port: 0\n  grpc_port: 0\n  metrics_port: 0\n"
        + (f"  startup_timeout_s: {server_start_timeout_s()}\n" if SERVER_START_ENV in os.environ else "")
        + extra
    )
    return path


def text_prompts() -> list:
    """Two short texts for the end-to-end checks: one that repeats itself (drafts get accepted), one prose."""
    from specbuild.client.prompts import Prompt

    return [
        Prompt("repeat", "for i in range(10):\n    print(i, i * i)\nfor i in range(10):\n    print(i"),
        Prompt("prose", "The quick brown fox jumps over the lazy dog."),
    ]


@contextmanager
def served(engine_dir: Path, tmp_path: Path) -> Iterator:
    """``engine_dir``'s reference repository (``tmp_path/repo``) served by a real tritonserver on free
    ports (log ``tmp_path/server.log``); yields a ready gRPC SpecClient, stops the server after."""
    from specbuild.client.sdk import SpecClient
    from specbuild.triton_repo.reference_repository import spec_from_engine_dir, write_reference_repository
    from specbuild.triton_repo.tritonserver import TritonServer

    repo = write_reference_repository(spec_from_engine_dir(engine_dir), tmp_path / "repo")
    server = TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=tmp_path / "server.log")
    with server, SpecClient(server.grpc_url) as client:
        client.wait_ready()
        yield client


def build_with_pt_head(recipe: Path, head_dir: Path, state_dict, out: Path, subdir: str) -> tuple[Path, dict]:
    """A head directory as EAGLE's releases ship it: ``state_dict`` as ``head_dir/model.pt`` (read with
    ``weights_only=True``) in place of its ``model.safetensors``. The recipe built into ``out/engine``
    holds the head as ``<subdir>/config.json`` + ``model.safetensors``, and a newer ``model.pt`` gives
    another engine fingerprint. Returns the engine directory and its config.json."""
    import torch

    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine, engine_fingerprint, locate_target, locate_weights

    torch.save(state_dict, head_dir / "model.pt")
    (head_dir / "model.safetensors").unlink()
    loaded = load_recipe(str(recipe))
    build = build_reference_engine(loaded, out / "engine", log=lambda m: None)
    assert sorted(p.name for p in (build.engine_dir / subdir).iterdir()) == ["config.json", "model.safetensors"]
    weights = head_dir / "model.pt"
    os.utime(weights, (weights.stat().st_atime, weights.stat().st_mtime + 10))  # another head -> another engine
    assert engine_fingerprint(loaded, locate_target(loaded), locate_weights(loaded)) != build.fingerprint
    return build.engine_dir, json.loads((build.engine_dir / "config.json").read_text())


def tiny_reference_server(tiny_checkpoint: Path, out: Path, *, decoupled: bool):
    """The tiny n-gram recipe built (``out/engine``) and its reference repository written
    (``out/repo``, ``decoupled``: streaming); returns ``(TritonServer on free ports, not started, engine_dir)``."""
    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine
    from specbuild.triton_repo.reference_repository import spec_from_engine_dir, write_reference_repository
    from specbuild.triton_repo.tritonserver import TritonServer

    loaded = load_recipe(str(write_recipe(out / "r.yaml", tiny_checkpoint)))
    engine_dir = build_reference_engine(loaded, out / "engine", log=lambda m: None).engine_dir
    repo = write_reference_repository(spec_from_engine_dir(engine_dir, decoupled=decoupled), out / "repo")
    return TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=out / "server.log"), engine_dir


@pytest.fixture(scope="session")
def decoupled_server(tiny_checkpoint, tmp_path_factory):
    """One decoupled (streaming) tritonserver over the tiny n-gram engine, shared by the streaming, strict
    JSON, OpenAI and AIPerf tests (a server start costs tens of seconds on a 2-core machine): yields
    ``(server, engine_dir)``. Tests must not stop it or rely on its counters starting at zero."""
    server, engine_dir = tiny_reference_server(tiny_checkpoint, tmp_path_factory.mktemp("decoupled"), decoupled=True)
    with server:
        yield server, engine_dir


@pytest.fixture(scope="session")
def plain_server(tiny_checkpoint, tmp_path_factory):
    """One non-decoupled tritonserver over the tiny n-gram engine, shared by the end-to-end, logit-margin
    and strict-JSON tests: yields ``(server, engine_dir)``. Tests must not stop it or rely on its
    counters starting at zero."""
    server, engine_dir = tiny_reference_server(tiny_checkpoint, tmp_path_factory.mktemp("plain"), decoupled=False)
    with server:
        yield server, engine_dir


def verify_lossless(client, *, max_tokens: int = 20):
    """``specbuild verify`` of :func:`text_prompts` (EOS off): every speculative output equals the
    baseline and drafts were verified. Returns the report."""
    from specbuild.client.verify import verify

    report = verify(client, text_prompts(), max_tokens=max_tokens, end_id=-1)
    assert report.all_match, [r.divergence for r in report.results if not r.match]
    assert report.total_draft_tokens > 0
    return report


@pytest.fixture(scope="session")
def method_engines(tiny_checkpoint, tmp_path_factory):
    """``(method, kind)`` -> ReferenceEngine on the tiny target for every method, "same" (oracle) and
    "random" drafts (tests/method_engines.py); built once per session."""
    from method_engines import build_engines

    from specbuild.engine import target as target_model
    from specbuild.engine.kernels import pack_linears, resolve_kernels

    model = target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    pack_linears(model, resolve_kernels("auto", model))  # the kernels a served engine uses (ReferenceEngine.from_pretrained's default)
    return build_engines(model, tmp_path_factory.mktemp("method_engines"))
