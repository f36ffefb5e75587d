"""Helpers shared by the Python-backend models (parameter parsing, optional inputs, errors)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np


def model_parameters(args: dict[str, Any]) -> dict[str, str]:
    """The ``parameters`` of a Python-backend model's config (``args["model_config"]`` JSON)."""
    config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def as_bool(value: str) -> bool:
    """Triton-style boolean parameter: true/false/1/0/yes/no (case-insensitive)."""
    lowered = value.strip().lower()
    if lowered in {"true", "1", "yes"}:
        return True
    if lowered in {"false", "0", "no"}:
        return False
    raise ValueError(f"expected a boolean (true/false), got {value!r}")


def optional_input(pb_utils, request, name: str) -> np.ndarray | None:
    """The numpy value of input ``name`` or None when the request does not carry it."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def required_input(pb_utils, request, name: str) -> np.ndarray:
    """The numpy value of input ``name``; ValueError naming it when absent."""
    value = optional_input(pb_utils, request, name)
    if value is None:
        raise ValueError(f"missing required input {name!r}")
    return value


def per_row(value: np.ndarray | None, batch: int, name: str) -> list | None:
    """A ``[batch, 1]`` (or ``[batch]``) input as one Python scalar per row; None stays None."""
    if value is None:
        return None
    flat = value.reshape(value.shape[0], -1) if value.ndim else value.reshape(1, 1)
    if flat.shape[0] != batch or flat.shape[1] != 1:
        raise ValueError(f"input {name!r} must have shape [{batch}, 1], got {list(value.shape)}")
    return [row[0].item() for row in flat]


def error_response(pb_utils, message: str, *, invalid_argument: bool = False, cancelled: bool = False):
    """An InferenceResponse that carries ``message`` as its error (the server keeps serving).

    ``invalid_argument``: the client sent a bad request (HTTP 400 / gRPC INVALID_ARGUMENT) rather
    than the server failing (500 / INTERNAL); ``cancelled``: the request was cancelled or its timeout
    passed (``TritonError.CANCELLED``, python backend 23.10+).
    """
    name = "INVALID_ARG" if invalid_argument else "CANCELLED" if cancelled else "INTERNAL"
    code = getattr(pb_utils.TritonError, name, None)
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


def run_each(pb_utils, requests, handle) -> list:
    """``[handle(request)]`` with any exception turned into that request's error response;
    ValueError (bad input, e.g. ``InvalidRequestError``) is reported as an invalid argument."""
    responses = []
    for request in requests:
        try:
            responses.append(handle(request))
        except ValueError as exc:
            responses.append(error_response(pb_utils, f"{type(exc).__name__}: {exc}", invalid_argument=True))
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error response
            responses.append(error_response(pb_utils, f"{type(exc).__name__}: {exc}"))
    return responses
