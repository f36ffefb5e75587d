"""A stand-in for TensorRT-LLM's ``tensorrtllm`` backend model, for tests on machines without a GPU.

It serves the same tensors as the generated ``tensorrt_llm`` config (that config, with backend
``python``) over a toy greedy language model over a 384-token vocabulary, and verifies
``draft_input_ids`` the way a ``draft_tokens_external`` engine does: the matching draft prefix, then
one target token. Parameter ``role``: ``target`` or ``draft`` (a draft that disagrees with the
target at every third position).
"""

from __future__ import annotations

import json

import numpy as np

VOCAB = 384


def target_next(ids: list[int]) -> int:
    return (sum(ids) * 31 + len(ids) * 7) % VOCAB


def draft_next(ids: list[int]) -> int:
    token = target_next(ids)
    return token if len(ids) % 3 else (token + 1) % VOCAB


def run(next_token, ids: list[int], n: int, end_id: int) -> list[int]:
    out = []
    for _ in range(n):
        out.append(next_token(ids + out))
        if out[-1] == end_id:
            break
    return out


def verify(ids: list[int], draft: list[int], n: int, end_id: int) -> tuple[list[int], int]:
    out, accepted = [], 0
    for d in draft:
        t = target_next(ids + out)
        out.append(t)
        if t != d or t == end_id:
            return out[:n], accepted
        accepted += 1
    out.append(target_next(ids + out))
    return out[:n], accepted


class TritonPythonModel:
    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.role = params.get("role", "target")

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _get(self, request, name):
        return self.pb.get_input_tensor_by_name(request, name)

    def _scalar(self, request, name, default):
        tensor = self._get(request, name)
        return default if tensor is None else int(tensor.as_numpy().reshape(-1)[0])

    def _one(self, request):
        pb = self.pb
        ids = self._get(request, "input_ids").as_numpy().reshape(-1)[: self._scalar(request, "input_lengths", 0)].tolist()
        n = self._scalar(request, "request_output_len", 1)
        end_id = self._scalar(request, "end_id", -1)
        draft = self._get(request, "draft_input_ids")
        accepted = drafted = 0
        if self.role == "draft":
            out = run(draft_next, ids, n, end_id)
        elif draft is not None:
            draft_ids = draft.as_numpy().reshape(-1).tolist()
            out, accepted = verify(ids, draft_ids, n, end_id)
            drafted = len(draft_ids)
        else:
            out = run(target_next, ids, n, end_id)
        tokens = out if self._scalar(request, "exclude_input_in_output", 0) else ids + out
        return pb.InferenceResponse(output_tensors=[
            pb.Tensor("output_ids", np.array(tokens, dtype=np.int32).reshape(1, 1, -1)),
            pb.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
            pb.Tensor("total_accepted_draft_tokens", np.array([[accepted]], dtype=np.int32)),
            pb.Tensor("total_draft_tokens", np.array([[drafted]], dtype=np.int32)),
            pb.Tensor("acceptance_rate", np.array([[accepted / drafted if drafted else 0.0]], dtype=np.float32)),
        ])
