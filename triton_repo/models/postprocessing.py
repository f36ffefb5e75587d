"""Triton Python-backend ``postprocessing`` model: token ids -> text (TensorRT-LLM's names)."""

from __future__ import annotations

import numpy as np

from specbuild.triton_repo.models.common import model_parameters, optional_input, required_input, run_each
from specbuild.triton_repo.models.tokenization import detokenize, detokenize_step, load_tokenizer


class TritonPythonModel:
    """Inputs TOKENS_BATCH [-1, -1] INT32 (beam, len), SEQUENCE_LENGTH [-1]; outputs OUTPUT [-1] BYTES
    and the ids passed through unchanged as OUT_OUTPUT_IDS / OUT_SEQUENCE_LENGTH.

    A streamed step (optional STREAM_PREFIX_IDS [-1]: the ids earlier responses carried, and
    STREAM_FINAL [1]: the last response; a step is streamed unless the prefix is empty and it is
    final) gets exactly the text it adds (:func:`detokenize_step`)."""

    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        self.pb_utils = pb_utils
        self.tokenizer = load_tokenizer(model_parameters(args)["tokenizer_dir"])

    def execute(self, requests):
        return run_each(self.pb_utils, requests, self._one)

    def _one(self, request):
        pb = self.pb_utils
        tokens = required_input(pb, request, "TOKENS_BATCH")
        lengths = required_input(pb, request, "SEQUENCE_LENGTH")
        prefix = optional_input(pb, request, "STREAM_PREFIX_IDS")
        final = optional_input(pb, request, "STREAM_FINAL")
        prefix = [] if prefix is None else prefix.reshape(-1).tolist()
        is_final = True if final is None else bool(final.all())
        if prefix or not is_final:  # a streamed step (batch 1)
            new = tokens.reshape(-1)[: int(lengths.reshape(-1)[0])].tolist()
            text = detokenize_step(self.tokenizer, prefix, new, final=is_final)
            output = np.array([[text.encode("utf-8")]], dtype=object)
        else:
            output = detokenize(self.tokenizer, tokens, lengths)
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor("OUTPUT", output),
                pb.Tensor("OUT_OUTPUT_IDS", tokens),
                pb.Tensor("OUT_SEQUENCE_LENGTH", lengths),
            ]
        )
