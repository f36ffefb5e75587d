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
    assert server.repo == tmp_path / "out" / "triton_repo" and server.log_file == tmp_path / "out" / "logs" / "tritonserver.log"
    assert "decoupled: true" in (server.repo / "tensorrt_llm" / "config.pbtxt").read_text()


def test_deploy_refuses_a_tensorrt_llm_recipe_before_any_work(tmp_path, stand_in):
    with pytest.raises(RecipeError, match="TensorRT-LLM Triton container"):
        with deploy(load_recipe("llama-eagle"), output_dir=tmp_path / "out"):
            pass
    assert stand_in == [] and not (tmp_path / "out").exists()
