"""Triton Python-backend ``preprocessing`` model: text_input -> token ids (TensorRT-LLM's names)."""

from __future__ import annotations

import numpy as np

from specbuild.triton_repo.models.common import (
    as_bool,
    model_parameters,
    optional_input,
    per_row,
    required_input,
    run_each,
)
from specbuild.triton_repo.models.tokenization import decode_queries, load_tokenizer, tokenize
from specbuild.triton_repo.request_log import RequestLog


class TritonPythonModel:
    """Inputs QUERY [1] BYTES, REQUEST_OUTPUT_LEN [1], END_ID/PAD_ID [1] (optional); outputs
    INPUT_ID [-1], REQUEST_INPUT_LEN [1], REQUEST_OUTPUT_LEN [1], OUT_END_ID [1], OUT_PAD_ID [1].

    Parameter ``request_log`` (a path; absent: off): each request's prompt text is appended there
    (:class:`~specbuild.triton_repo.request_log.RequestLog`; recipe ``serve.request_log``)."""

    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        self.pb_utils = pb_utils
        params = model_parameters(args)
        self.tokenizer = load_tokenizer(params["tokenizer_dir"])
        self.add_special_tokens = as_bool(params.get("add_special_tokens", "true"))
        self.end_id = int(params["end_id"])
        self.pad_id = int(params["pad_id"])
        self.request_log = RequestLog(params["request_log"]) if params.get("request_log") else None  # serve.request_log

    def execute(self, requests):
        return run_each(self.pb_utils, requests, self._one)

    def _one(self, request):
        pb = self.pb_utils
        query = required_input(pb, request, "QUERY")
        batch = query.shape[0]
        output_len = required_input(pb, request, "REQUEST_OUTPUT_LEN")
        end_ids = per_row(optional_input(pb, request, "END_ID"), batch, "end_id") or [self.end_id] * batch
        pad_ids = per_row(optional_input(pb, request, "PAD_ID"), batch, "pad_id") or [self.pad_id] * batch
        texts = decode_queries(query)
        tokens = tokenize(self.tokenizer, texts, pad_id=pad_ids[0], add_special_tokens=self.add_special_tokens)
        if self.request_log is not None:  # prompts only, once they were read as text
            self.request_log.write(texts)
        column = lambda values: np.array(values, dtype=np.int32).reshape(batch, 1)  # noqa: E731
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor("INPUT_ID", tokens.input_ids),
                pb.Tensor("REQUEST_INPUT_LEN", tokens.lengths),
                pb.Tensor("REQUEST_OUTPUT_LEN", output_len.astype(np.int32).reshape(batch, 1)),
                pb.Tensor("OUT_END_ID", column(end_ids)),
                pb.Tensor("OUT_PAD_ID", column(pad_ids)),
            ]
        )
