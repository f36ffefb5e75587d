"""The opt-in request log (recipe ``serve.request_log``): the preprocessing model appends each request's
prompt, and nothing else, in the format ``train.prompts`` / ``train-draft --from-log`` read."""

from __future__ import annotations

import json
import sys
import threading
import types

import numpy as np
import pytest

from specbuild.prompts import load_prompts
from specbuild.triton_repo.request_log import RequestLog


class _Tensor:
    def __init__(self, name, array):
        self.name, self.array = name, array

    def as_numpy(self):
        return self.array


def fake_pb_utils() -> types.ModuleType:
    """The calls the preprocessing model makes on ``triton_python_backend_utils``."""
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor = _Tensor

    class InferenceResponse:
        def __init__(self, output_tensors, error=None):
            self.outputs = {t.name: t.array for t in output_tensors}
            self.error = error

    class TritonError(Exception):
        def __init__(self, message, code=None):
            super().__init__(message)

    pb.InferenceResponse, pb.TritonError = InferenceResponse, TritonError
    pb.get_input_tensor_by_name = lambda request, name: _Tensor(name, request[name]) if name in request else None
    return pb


def preprocessing(tokenizer_dir, monkeypatch, **parameters):
    from specbuild.triton_repo.models import preprocessing as module

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb_utils())
    model = module.TritonPythonModel()
    params = {"tokenizer_dir": str(tokenizer_dir), "end_id": "0", "pad_id": "0"} | parameters
    model.initialize({"model_config": json.dumps({"parameters": {k: {"string_value": v} for k, v in params.items()}})})
    return model


def request(*texts: str) -> dict:
    return {"QUERY": np.array([[t.encode()] for t in texts], dtype=object),
            "REQUEST_OUTPUT_LEN": np.array([[8]] * len(texts), dtype=np.int32)}


def test_preprocessing_appends_each_prompt_and_nothing_else(tiny_checkpoint, tmp_path, monkeypatch):
    log = tmp_path / "logs" / "requests.jsonl"
    model = preprocessing(tiny_checkpoint, monkeypatch, request_log=str(log))
    chat = "<|user|>Plan a trip\nto Oslo<|end|><|assistant|>"
    responses = model.execute([request("def add(a, b):"), request(chat, "héllo \"quoted\"")])
    assert all(r.error is None for r in responses)
    assert responses[0].outputs["INPUT_ID"].shape[0] == 1  # the request itself is answered as before
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert lines == [{"prompt": "def add(a, b):"}, {"prompt": chat}, {"prompt": 'héllo "quoted"'}]
    assert (log.stat().st_mode & 0o777) == 0o600  # prompts are private: the owner reads them
    assert [p.text for p in load_prompts(str(log))] == ["def add(a, b):", chat, 'héllo "quoted"']  # what --from-log reads


def test_without_the_parameter_nothing_is_written(tiny_checkpoint, tmp_path, monkeypatch):
    model = preprocessing(tiny_checkpoint, monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert model.request_log is None
    model.execute([request("secret prompt")])
    assert list(tmp_path.iterdir()) == []


def test_a_bad_request_is_not_logged(tiny_checkpoint, tmp_path, monkeypatch):
    log = tmp_path / "requests.jsonl"
    model = preprocessing(tiny_checkpoint, monkeypatch, request_log=str(log))
    bad = {"QUERY": np.array([[b"\xff\xfe"]], dtype=object), "REQUEST_OUTPUT_LEN": np.array([[8]], dtype=np.int32)}
    [response] = model.execute([bad])
    assert response.error is not None and "not valid UTF-8" in str(response.error)
    assert log.read_text() == ""


def test_concurrent_writers_append_whole_lines(tmp_path):
    path = tmp_path / "requests.jsonl"
    logs = [RequestLog(path), RequestLog(path)]  # two model instances on one file
    texts = [f"prompt {i} " + "x" * (i % 7) * 300 for i in range(200)]

    def writer(k):
        for text in texts[k::4]:
            logs[k % 2].write([text])

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = path.read_text().splitlines()
    assert sorted(json.loads(line)["prompt"] for line in lines) == sorted(texts)


def test_the_recipe_field_reaches_the_preprocessing_model_and_is_off_by_default(tmp_path):
    from specbuild.builder.recipe import parse_recipe
    from specbuild.triton_repo.reference_repository import ReferenceRepoSpec, reference_models

    spec = ReferenceRepoSpec(engine_dir=tmp_path, end_id=0, pad_id=0, max_batch_size=1)
    pre = {m.name: m for m in reference_models(spec)}["preprocessing"]
    assert "request_log" not in pre.parameters
    logged = {m.name: m for m in reference_models(ReferenceRepoSpec(tmp_path, 0, 0, 1, request_log="/x/requests.jsonl"))}
    assert logged["preprocessing"].parameters["request_log"] == "/x/requests.jsonl"
    base = "name: r\ntarget: {checkpoint: some/model}\n"
    where = tmp_path / "r.yaml"
    assert parse_recipe(base, where).recipe.serve.request_log is None
    on = parse_recipe(base + "serve: {request_log: logs/requests.jsonl}\n", where)
    assert on.resolve_path(on.recipe.serve.request_log) == tmp_path / "logs" / "requests.jsonl"  # beside the recipe
    with pytest.raises(ValueError, match=r"serve\.request_log.*reference backend's preprocessing"):
        parse_recipe(base + "serve: {request_log: logs/requests.jsonl}\nbuild: {backend: pytorch}\n", where)


@pytest.mark.e2e
def test_a_recipe_with_a_request_log_logs_triton_and_openai_requests_then_train_reads_them(tiny_checkpoint, tmp_path):
    """End to end: the recipe's serve.request_log reaches the served repository; a Triton request and an
    OpenAI completion are each logged once, as prompts only, and the log loads as training prompts."""
    import urllib.request

    from conftest import write_recipe

    from specbuild.builder.recipe import load_recipe
    from specbuild.client.sdk import SpecClient
    from specbuild.deploy import deploy
    from specbuild.triton_repo.openai_frontend import OpenAIServer, config_from_deployment

    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint, extra="  request_log: logs/requests.jsonl\n")
    log = tmp_path / "logs" / "requests.jsonl"
    with deploy(load_recipe(str(recipe)), output_dir=tmp_path / "out", free_ports=True, log=lambda m: None) as served:
        with SpecClient(served.grpc_url) as client:
            client.wait_ready()
            client.generate("def fib(n):", max_tokens=4)
        with OpenAIServer(config_from_deployment(served.grpc_url, model="tiny"), port=0) as front:
            body = json.dumps({"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 4}).encode()
            req = urllib.request.Request(f"{front.url}/completions", body, {"Content-Type": "application/json"})
            answer = json.loads(urllib.request.urlopen(req, timeout=120).read())
    lines = log.read_text(encoding="utf-8").splitlines()
    assert answer["choices"][0]["finish_reason"] == "length"
    # exactly the two prompts, once each: no outputs, ids or settings (the front's request reached Triton once)
    assert [json.loads(line) for line in lines] == [{"prompt": "def fib(n):"}, {"prompt": "The quick brown fox"}]
    assert [p.text for p in load_prompts(str(log))] == ["def fib(n):", "The quick brown fox"]


def test_plan_refuses_a_request_log_that_is_not_a_new_or_earlier_log(tmp_path, tiny_checkpoint):
    """A folder, a non-.jsonl name (--from-log could not read it) or an existing file of something else
    (a checkpoint's config.json would get prompts appended) is refused before the build; a new path and an
    earlier log are fine."""
    from conftest import write_recipe

    from specbuild.builder.recipe import RecipeError, load_recipe
    from specbuild.pipeline import check_inputs

    (tmp_path / "logs.jsonl").mkdir()
    (tmp_path / "other.jsonl").write_text('{"id": 1, "text": "not a prompt log"}\n')
    (tmp_path / "earlier.jsonl").write_text('{"prompt": "def f():"}\n')
    cases = {"logs.jsonl": "is a directory", "requests.log": "is not a .jsonl file", "other.jsonl": "holds something other than a request log"}
    for value, says in cases.items():
        recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint, extra=f"  request_log: {value}\n")
        with pytest.raises(RecipeError, match=f"serve.request_log: .*{says}"):
            check_inputs(load_recipe(str(recipe)))
    for value in ("earlier.jsonl", "new/folder/requests.jsonl"):
        check_inputs(load_recipe(str(write_recipe(tmp_path / "r.yaml", tiny_checkpoint, extra=f"  request_log: {value}\n"))))
    assert (tmp_path / "other.jsonl").read_text() == '{"id": 1, "text": "not a prompt log"}\n'
