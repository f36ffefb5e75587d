"""Triton Python-backend ``postprocessing`` model: token ids -> text (TensorRT-LLM's names)."""

from __future__ import annotations

from specbuild.triton_repo.models.common import model_parameters, required_input, run_each
from specbuild.triton_repo.models.tokenization import detokenize, load_tokenizer


class TritonPythonModel:
    """Inputs TOKENS_BATCH [-1, -1] INT32 (beam, len), SEQUENCE_LENGTH [-1]; outputs OUTPUT [-1] BYTES
    and the ids passed through unchanged as OUT_OUTPUT_IDS / OUT_SEQUENCE_LENGTH."""

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
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor("OUTPUT", detokenize(self.tokenizer, tokens, lengths)),
                pb.Tensor("OUT_OUTPUT_IDS", tokens),
                pb.Tensor("OUT_SEQUENCE_LENGTH", lengths),
            ]
        )
