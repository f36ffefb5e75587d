"""Triton Python-backend ``tensorrt_llm`` model served by specbuild's reference engine.

It takes and returns the tensors of TensorRT-LLM's ``tensorrt_llm`` model (``input_ids``,
``input_lengths``, ``request_output_len``, ``end_id``, ``pad_id`` -> ``output_ids`` [beam, len],
``sequence_length``, and with ``return_perf_metrics`` the speculative-decoding metrics
``acceptance_rate``, ``total_accepted_draft_tokens``, ``total_draft_tokens``), plus the BLS
model's ``num_draft_tokens`` (0 = plain decoding on the same engine: the non-speculative baseline)
and, for a Lookahead engine, the request's ``(w, n, g)`` as TensorRT-LLM's ``lookahead_window_size``,
``lookahead_ngram_size``, ``lookahead_verification_set_size``. specbuild's own
``return_logit_margin`` asks for ``logit_margin`` / ``runner_up_ids``: the target's top-two logit
margin and second choice at each generated position (see :class:`Margins`), so a client can tell a
numerical near-tie from a real divergence.

The Triton glue (:class:`TritonPythonModel`) only converts tensors; :func:`parse_batch` and
:func:`pack_outputs` are plain numpy functions that the tests call directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specbuild.engine.types import GenerationRequest, GenerationResult
from specbuild.triton_repo.models.common import (
    as_bool,
    model_parameters,
    optional_input,
    per_row,
    required_input,
    run_each,
)

LOOKAHEAD_INPUTS = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")  # (w, n, g)
INPUTS = (
    "input_ids",
    "input_lengths",
    "request_output_len",
    "end_id",
    "pad_id",
    "num_draft_tokens",
    "return_perf_metrics",
    "exclude_input_in_output",
    "temperature",
    "runtime_top_k",
    "runtime_top_p",
    "seed",
    *LOOKAHEAD_INPUTS,
    "return_logit_margin",
)


@dataclass(frozen=True)
class Row:
    """One sequence of a batch: the engine request and how to shape its outputs."""

    request: GenerationRequest
    pad_id: int
    exclude_input_in_output: bool
    return_perf_metrics: bool
    return_logit_margin: bool = False


def parse_batch(inputs: dict[str, np.ndarray | None], *, default_pad_id: int, default_exclude_input: bool) -> list[Row]:
    """Requests from TensorRT-LLM-named tensors.

    Args:
        inputs: ``input_ids`` [batch, max_len] int32 (right-padded), ``input_lengths`` [batch, 1],
            ``request_output_len`` [batch, 1]; optional (None when absent) ``end_id``, ``pad_id``,
            ``num_draft_tokens`` [batch, 1] int32, ``return_perf_metrics``,
            ``exclude_input_in_output`` [batch, 1] bool, and the sampling parameters ``temperature``,
            ``runtime_top_p`` [batch, 1] fp32, ``runtime_top_k`` [batch, 1] int32, ``seed`` [batch, 1]
            uint64 (absent temperature: greedy), and ``lookahead_window_size``, ``lookahead_ngram_size``,
            ``lookahead_verification_set_size`` [batch, 1] int32 (all three or none),
            ``return_logit_margin`` [batch, 1] bool.

    Raises:
        ValueError: a required tensor is missing, a shape does not match the batch, or only some of
            the three lookahead tensors are given.
    """
    ids = inputs.get("input_ids")
    if ids is None or inputs.get("request_output_len") is None:
        raise ValueError("input_ids and request_output_len are required")
    ids = ids.reshape(ids.shape[0], -1) if ids.ndim != 2 else ids
    batch = ids.shape[0]
    lengths = per_row(inputs.get("input_lengths"), batch, "input_lengths") or [ids.shape[1]] * batch
    column = {name: per_row(inputs.get(name), batch, name) for name in INPUTS[2:]}
    lookahead = [column[name] for name in LOOKAHEAD_INPUTS]
    if any(c is None for c in lookahead) and any(c is not None for c in lookahead):
        raise ValueError(f"{', '.join(LOOKAHEAD_INPUTS)} go together: send all three or none")
    rows = []
    for b in range(batch):
        pick = lambda name, default, b=b: default if column[name] is None else column[name][b]  # noqa: E731
        if not 0 <= lengths[b] <= ids.shape[1]:
            raise ValueError(f"input_lengths[{b}] = {lengths[b]} is outside [0, {ids.shape[1]}]")
        request = GenerationRequest(
            input_ids=ids[b, : lengths[b]].tolist(),
            max_tokens=int(column["request_output_len"][b]),
            end_id=pick("end_id", None),
            num_draft_tokens=pick("num_draft_tokens", None),
            temperature=pick("temperature", None),
            top_k=pick("runtime_top_k", None),
            top_p=pick("runtime_top_p", None),
            seed=pick("seed", None),
            lookahead_config=None if lookahead[0] is None else tuple(int(c[b]) for c in lookahead),
        )
        rows.append(
            Row(
                request=request,
                pad_id=int(pick("pad_id", default_pad_id)),
                exclude_input_in_output=bool(pick("exclude_input_in_output", default_exclude_input)),
                return_perf_metrics=bool(pick("return_perf_metrics", False)),
                return_logit_margin=bool(pick("return_logit_margin", False)),
            )
        )
    return rows


def pack_outputs(
    rows: list[Row], results: list[GenerationResult], margins: list[Margins | None] | None = None
) -> dict[str, np.ndarray]:
    """Output tensors for a batch: ``output_ids`` [batch, 1, max_len] int32 padded with each row's
    pad_id, ``sequence_length`` [batch, 1] int32, the three perf-metric tensors [batch, 1]
    (zeros for rows that did not ask for ``return_perf_metrics``), and ``logit_margin`` [batch, n]
    fp32 / ``runner_up_ids`` [batch, n] int32 (``margins[b]`` of the rows that asked for
    ``return_logit_margin``, NaN / -1 elsewhere; n = the longest generated output, at least 1)."""
    sequences = [
        (r.output_ids if row.exclude_input_in_output else row.request.input_ids + r.output_ids)
        for row, r in zip(rows, results)
    ]
    width = max(1, max(len(s) for s in sequences))
    output_ids = np.empty((len(rows), 1, width), dtype=np.int32)
    for b, (row, seq) in enumerate(zip(rows, sequences)):
        output_ids[b, 0, :] = row.pad_id
        output_ids[b, 0, : len(seq)] = seq
    perf = [row.return_perf_metrics for row in rows]
    metric = lambda values, dtype: np.array([[v if p else 0] for v, p in zip(values, perf)], dtype=dtype)  # noqa: E731
    return {
        "output_ids": output_ids,
        "sequence_length": np.array([[len(s)] for s in sequences], dtype=np.int32),
        "acceptance_rate": metric([r.acceptance_rate for r in results], np.float32),
        "total_accepted_draft_tokens": metric([r.total_accepted_draft_tokens for r in results], np.int32),
        "total_draft_tokens": metric([r.total_draft_tokens for r in results], np.int32),
        **_pack_margins(margins or [None] * len(rows)),
    }


@dataclass(frozen=True)
class Margins:
    """The target's top-two logits at each generated position (specbuild's ``return_logit_margin``).

    ``margin[i]`` = largest - second-largest target logit (logit units, >= 0) when the target scored
    generated token ``i``; ``runner_up_ids[i]`` = the token with the second-largest logit. A greedy
    divergence at position ``i`` where the other side chose ``runner_up_ids[i]`` and ``margin[i]`` is
    tiny is a numerical near-tie, not a bug in the acceptance logic.
    """

    margin: list[float]
    runner_up_ids: list[int]


def logit_margins(model, prompt_ids: list[int], output_ids: list[int]) -> Margins:
    """Teacher-forced target pass over ``prompt_ids + output_ids[:-1]`` (one forward, fresh KV cache).

    Row ``i`` of the ``[n, vocab]`` logits (n = len(output_ids)) scores generated position ``i``.
    Example: prompt [5, 6], output [7, 8] -> one pass over [5, 6, 7]; rows after 6 and after 7.
    It scores the sequence in one pass, so it can differ from the incremental decode's logits by
    floating-point rounding only (fp32 CPU: ~1e-6). Empty output -> empty Margins.
    """
    import torch

    from specbuild.engine import target as target_model

    if not output_ids:
        return Margins([], [])
    tokens = [*prompt_ids, *output_ids[:-1]]
    with torch.inference_mode():
        logits = target_model.forward_logits(model, tokens, target_model.new_cache(model), num_logits=len(output_ids))
    top = logits.float().topk(2, dim=-1)  # values, indices: [n, 2]
    margin = (top.values[:, 0] - top.values[:, 1]).tolist()
    return Margins(margin=margin, runner_up_ids=top.indices[:, 1].tolist())


def _pack_margins(margins: list[Margins | None]) -> dict[str, np.ndarray]:
    width = max([1] + [len(m.margin) for m in margins if m is not None])
    margin = np.full((len(margins), width), np.nan, dtype=np.float32)
    runner_up = np.full((len(margins), width), -1, dtype=np.int32)
    for b, m in enumerate(margins):
        if m is not None:
            margin[b, : len(m.margin)] = m.margin
            runner_up[b, : len(m.runner_up_ids)] = m.runner_up_ids
    return {"logit_margin": margin, "runner_up_ids": runner_up}


class TritonPythonModel:
    """Loads the engine directory named by parameter ``engine_dir`` (TensorRT-LLM: gpt_model_path)."""

    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        from specbuild.engine.runtime import ReferenceEngine

        self.pb_utils = pb_utils
        params = model_parameters(args)
        device = params.get("device") or "cpu"
        self.engine = ReferenceEngine.from_engine_dir(params["engine_dir"], device=device)
        self.exclude_input = as_bool(params.get("exclude_input_in_output", "true"))
        self.pad_id = int(params.get("pad_id", self.engine.end_id))
        self.metrics = _Counters(pb_utils, args["model_name"])

    def execute(self, requests):
        return run_each(self.pb_utils, requests, self._one)

    def _one(self, request):
        pb = self.pb_utils
        inputs = {name: optional_input(pb, request, name) for name in INPUTS}
        required_input(pb, request, "input_ids")
        rows = parse_batch(inputs, default_pad_id=self.pad_id, default_exclude_input=self.exclude_input)
        results = [self.engine.generate(row.request) for row in rows]
        self.metrics.record(results)
        margins = [
            logit_margins(self.engine._model, row.request.input_ids, r.output_ids) if row.return_logit_margin else None
            for row, r in zip(rows, results)
        ]
        outputs = pack_outputs(rows, results, margins)
        return pb.InferenceResponse(output_tensors=[pb.Tensor(k, v) for k, v in outputs.items()])


class _Counters:
    """Prometheus counters on Triton's metrics port, like TensorRT-LLM's backend publishes its own."""

    def __init__(self, pb_utils, model_name: str):
        labels = {"model": model_name}
        # The families must outlive their metrics (Triton refuses to update an orphaned metric).
        self.families = [
            pb_utils.MetricFamily(name=name, description=text, kind=pb_utils.MetricFamily.COUNTER)
            for name, text in (
                ("specbuild_draft_tokens_total", "Draft tokens sent to verification"),
                ("specbuild_accepted_draft_tokens_total", "Draft tokens accepted"),
                ("specbuild_generated_tokens_total", "Tokens generated"),
            )
        ]
        self.draft, self.accepted, self.generated = (f.Metric(labels=labels) for f in self.families)

    def record(self, results: list[GenerationResult]) -> None:
        for r in results:
            self.draft.increment(r.total_draft_tokens)
            self.accepted.increment(r.total_accepted_draft_tokens)
            self.generated.increment(len(r.output_ids))
