"""specbuild.deploy: the stages in order, the server stopped however the block ends (a stand-in server;
the real one is started by the pipeline's and bench's end-to-end tests)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from conftest import write_recipe
from specbuild.builder.recipe import RecipeError, load_recipe
from specbuild.deploy import deploy


class StandInServer:
    """Records what deploy asks of a TritonServer; ports 0 become 1, 2, 3."""

    instances: list[StandInServer] = []

    def __init__(self, repo, *, host, http_port, grpc_port, metrics_port, log_file, startup_timeout_s):
        self.repo, self.log_file = repo, log_file
        self.ports = (http_port or 1, grpc_port or 2, metrics_port or 3)
        self.events: list[str] = []
        StandInServer.instances.append(self)

    def start(self):
        self.events.append("start")
        return self

    def stop(self):
        self.events.append("stop")

    grpc_url = property(lambda self: f"127.0.0.1:{self.ports[1]}")
    http_url = property(lambda self: f"127.0.0.1:{self.ports[0]}")
    metrics_url = property(lambda self: f"127.0.0.1:{self.ports[2]}")


@pytest.fixture
def stand_in(monkeypatch):
    import specbuild.triton_repo.tritonserver as server

    StandInServer.instances = []
    monkeypatch.setattr(server, "TritonServer", StandInServer)
    return StandInServer.instances


def recorder(stages: list[str]):
    @contextmanager
    def stage(name: str):
        stages.append(name)
        yield

    return stage


@pytest.mark.parametrize("error", [RuntimeError("verification failed"), KeyboardInterrupt()])
def test_deploy_runs_every_stage_and_stops_the_server_however_the_block_ends(tiny_checkpoint, tmp_path, stand_in, error):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint)
    stages: list[str] = []
    with pytest.raises(type(error)):
        with deploy(recipe, output_dir=tmp_path / "out", free_ports=True, decoupled=True, stage=recorder(stages),
                    log=lambda m: None) as served:
            assert served.grpc_url == "127.0.0.1:2" and served.metrics_url == "127.0.0.1:3"
            assert served.tokenizer_dir == tmp_path / "out" / "engine" / "tokenizer" and served.tokenizer_dir.is_dir()
            assert served.decoupled and served.name == "tiny-ngram" and served.prompts
            raise error
    assert stages == ["validate", "build", "repository", "serve", "shutdown"]
    (server,) = stand_in
    assert server.events == ["start", "stop"]
    # the recipe is not decoupled: the streaming repository is written beside triton_repo/
    assert server.repo == tmp_path / "out" / "triton_repo_decoupled" and server.log_file == tmp_path / "out" / "logs" / "tritonserver.log"
    assert "decoupled: true" in (server.repo / "tensorrt_llm" / "config.pbtxt").read_text()


def test_deploy_refuses_a_tensorrt_llm_recipe_before_any_work(tmp_path, stand_in):
    with pytest.raises(RecipeError, match="TensorRT-LLM Triton container"):
        with deploy(load_recipe("llama-eagle"), output_dir=tmp_path / "out"):
            pass
    assert stand_in == [] and not (tmp_path / "out").exists()


def _mode(repo) -> bool:
    """The repository's tensorrt_llm model is decoupled (parsed with Triton's protobuf schema)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse((repo / "tensorrt_llm" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    return config.model_transaction_policy.decoupled


def test_triton_repo_keeps_the_recipes_mode_whatever_runs_in_the_folder(tiny_checkpoint, tmp_path, stand_in):
    """issue 36: `bench` (decoupled) on the quick start's folder rewrote its triton_repo as decoupled, so
    `specbuild serve DIR/triton_repo` + `verify` then failed ("ModelInfer RPC doesn't support models with
    decoupled transaction policy"). Now the other mode gets its own repository over the same engine."""
    from specbuild.deploy import build_recipe
    from specbuild.pipeline import RunPaths

    loaded = load_recipe(str(write_recipe(tmp_path / "r.yaml", tiny_checkpoint)))
    paths, messages = RunPaths(tmp_path / "out"), []
    first = build_recipe(loaded, paths, log=lambda m: None)  # `specbuild recipe` / `specbuild build`
    assert first.repo_dir == paths.repo_dir and not _mode(paths.repo_dir)
    with deploy(loaded, output_root=tmp_path / "out", free_ports=True, decoupled=True, log=messages.append) as served:
        assert served.build.repo_dir == paths.output_dir / "triton_repo_decoupled" and _mode(served.build.repo_dir)
        assert not served.engine_rebuilt  # one engine, two repositories
    assert stand_in[0].repo == served.build.repo_dir
    assert not _mode(paths.repo_dir)  # what `specbuild serve specbuild-out/NAME/triton_repo` serves
    assert any(str(served.build.repo_dir) in m and "decoupled" in m for m in messages), messages
    again = build_recipe(loaded, paths, decoupled=False, log=lambda m: None)
    assert again.repo_dir == paths.repo_dir and not _mode(paths.repo_dir)


def test_a_recipe_that_is_decoupled_gets_a_separate_plain_repository(tiny_checkpoint, tmp_path):
    from specbuild.deploy import build_recipe
    from specbuild.pipeline import RunPaths

    loaded = load_recipe(str(write_recipe(tmp_path / "r.yaml", tiny_checkpoint, extra="  decoupled: true\n")))
    paths = RunPaths(tmp_path / "out")
    assert _mode(build_recipe(loaded, paths, log=lambda m: None).repo_dir)
    plain = build_recipe(loaded, paths, decoupled=False, log=lambda m: None)
    assert plain.repo_dir == paths.output_dir / "triton_repo_not_decoupled" and not _mode(plain.repo_dir)
    assert _mode(paths.repo_dir)


def test_an_interrupted_repository_write_leaves_nothing_that_looks_finished(tiny_checkpoint, tmp_path, monkeypatch):
    import specbuild.triton_repo.reference_repository as reference_repository
    from specbuild.deploy import build_recipe
    from specbuild.pipeline import RunPaths

    loaded = load_recipe(str(write_recipe(tmp_path / "r.yaml", tiny_checkpoint)))
    paths = RunPaths(tmp_path / "out")
    build_recipe(loaded, paths, log=lambda m: None)
    before = (paths.repo_dir / "tensorrt_llm" / "config.pbtxt").read_text()
    render = reference_repository.render

    def interrupted(model):
        if model.name == "postprocessing":
            raise KeyboardInterrupt
        return render(model)

    monkeypatch.setattr(reference_repository, "render", interrupted)
    for decoupled in (False, True):
        with pytest.raises(KeyboardInterrupt):
            build_recipe(loaded, paths, decoupled=decoupled, log=lambda m: None)
    assert (paths.repo_dir / "tensorrt_llm" / "config.pbtxt").read_text() == before
    assert sorted(p.name for p in paths.output_dir.iterdir()) == ["engine", "triton_repo"]


def test_deploy_dir_naming_a_folder_bench_wrote_is_reused(tmp_path):
    """A deployment folder that so far holds only bench's decoupled repository is still recognised."""
    import json

    from specbuild.deploy import recipe_output_dir

    (tmp_path / "triton_repo_decoupled").mkdir()
    (tmp_path / "triton_repo_decoupled" / "specbuild-repo.json").write_text(json.dumps({"recipe": "smollm2-ngram"}))
    assert recipe_output_dir(tmp_path, "smollm2-ngram") == tmp_path
    assert recipe_output_dir(tmp_path, "smollm2-eagle") == tmp_path / "smollm2-eagle"
