"""What a running Triton deployment says about itself: its speculation method and limits, read from
the ``tensorrt_llm`` model's configuration (Triton's ``get_model_config``), so that a ``host:port``
target is labelled and checked like a recipe target."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .plan import Deployment

# tensorrtllm_backend's ``decoding_mode`` parameter -> our method (the modes that name one).
DECODING_MODES = {"medusa": "medusa", "eagle": "eagle", "lookahead": "lookahead", "redrafter": "redrafter"}


def method_from_model_config(config: dict) -> tuple[str, dict | None]:
    """``(method, speculative_config)`` from a ``tensorrt_llm`` model configuration (the JSON form
    of its config.pbtxt): the reference engine's ``engine_dir/config.json`` ``speculative_config``
    when that folder is on this machine, else the ``decoding_mode`` parameter of a TensorRT-LLM
    deployment; ``("unknown", None)`` when neither says.

    Example: ``{"parameters": {"engine_dir": {"string_value": "/out/engine"}}}`` with
    ``/out/engine/config.json`` holding ``{"speculative_config": {"decoding_type": "NGram", ...}}``
    -> ``("ngram", {...})``; ``speculative_config: null`` -> ``("none", None)``.
    """
    from specbuild.builder.recipe import method_spellings

    parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
    engine_dir = parameters.get("engine_dir") or parameters.get("gpt_model_path")
    if engine_dir:
        try:
            engine = json.loads((Path(engine_dir) / "config.json").read_text())
            speculative = engine["speculative_config"]
        except (OSError, ValueError, KeyError, TypeError):
            speculative = "unread"
        if speculative is None:
            return "none", None
        if isinstance(speculative, dict):
            return method_spellings().get(str(speculative.get("decoding_type", "")).lower(), "unknown"), speculative
    return DECODING_MODES.get(parameters.get("decoding_mode", "").lower(), "unknown"), None


def with_server_method(deployment: Deployment, *, timeout_s: float = 10.0) -> Deployment:
    """``deployment`` (a ``host:port`` target) with the method, ``max_draft_len`` and lookahead
    ``(W, N, G)`` its server's ``tensorrt_llm`` configuration gives; unchanged when the server cannot
    be asked (the sweep then reports why it cannot reach it)."""
    if deployment.method != "unknown" or deployment.protocol not in ("grpc", "http"):
        return deployment
    try:
        config = _model_config(deployment, timeout_s)
    except Exception:  # noqa: BLE001 - not up yet, not a Triton server, no tensorrt_llm model: keep "unknown"
        return deployment
    method, speculative = method_from_model_config(config)
    update: dict = {"method": method}
    interval = config.get("parameters", {}).get("stream_interval", {}).get("string_value", "1")
    if interval.isdigit() and int(interval) > 1:  # the reference repository's engine parameter
        update["stream_interval"] = int(interval)
    most = (speculative or {}).get("max_total_draft_tokens") if (speculative or {}).get("use_dynamic_tree") else None
    most = most if isinstance(most, int) else (speculative or {}).get("max_draft_len")  # EAGLE-3 trees: their nodes
    if speculative and deployment.max_draft_len is None and isinstance(most, int):
        update["max_draft_len"] = most
    if method == "lookahead" and speculative and deployment.lookahead is None:
        wng = tuple(speculative.get(k) for k in ("max_window_size", "max_ngram_size", "max_verification_set_size"))
        if all(isinstance(v, int) for v in wng):
            update["lookahead"] = wng
    return dataclasses.replace(deployment, **update)


def _model_config(deployment: Deployment, timeout_s: float) -> dict:
    if deployment.protocol == "http":
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(deployment.url, connection_timeout=timeout_s, network_timeout=timeout_s)
        try:
            return client.get_model_config("tensorrt_llm")
        finally:
            client.close()
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(deployment.url)
    try:
        return client.get_model_config("tensorrt_llm", as_json=True, client_timeout=timeout_s)["config"]
    finally:
        client.close()
