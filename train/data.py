"""Self-distillation data: the target writes the training responses, and its features are cached.

For each training prompt the target generates a greedy response of up to ``max_new_tokens`` tokens
(batched ``generate()``, left padding), and ``samples_per_prompt - 1`` more sampled at ``temperature``,
so the draft learns the target's own distribution; greedy verification accepts exactly the target's
argmax, which is the label at every position whichever response the tokens came from. With
``texts`` set, pieces of existing text (e.g. the Python standard library's sources) are added as
teacher-forced sequences: no generation, only the target's features and argmax on the text, which is
cheap data (one forward pass per token) the way EAGLE trains on fixed text. Their ``prompt_lens``
equal their lengths (nothing in them is target-generated). Per position ``j`` of each sequence
``c_0 .. c_{n-1}`` the data records what one teacher-forced pass over it gives::

    features[j]   [H]     the target's final-norm hidden state f_j (the lm_head input; EAGLE's feature)
    top1[j]               argmax lm_head(f_j): the target's greedy next token after c_0 .. c_j
    aux[j]        [3 Ht]  (EAGLE-3 only) the outputs of the captured target layers, concatenated

For the responses generated in this run those values are read from ``generate()``'s own forwards (the
prefill for the prompt, one decode step per response token, and one more step for the last token:
:class:`_Recorder`), which saves a second pass over the prompts and responses; saved responses reused
from an earlier run and the texts get the teacher-forced pass.

On disk (``$SPECBUILD_CACHE/train-data/<fingerprint>/``, fingerprint of the target checkpoint, prompts and
generation settings; reused while they are unchanged)::

    sequences.safetensors   tokens [N] int64 (all sequences concatenated), offsets [S + 1] int64,
                            prompt_lens [S] int64
    features.safetensors    features [N, H] float32, top1 [N] int64
    aux_<a>_<b>_<c>.safetensors   aux [N, 3 Ht] float32 (EAGLE-3: written with the features, in the same
                            forward; for data made without it, by a later pass on first use)
    meta.json               prompts used, token counts, timings

and beside it ``responses-<key>.json`` (:func:`~specbuild.train.sources.responses_cache_key`: the target and generation settings),
the target's responses as batches finish, each under its prompt's tokens: an interrupted run resumes from
it, data differing only in ``texts`` reuses it, and a prompt set sharing prompts with an earlier one
generates only its new prompts' responses.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specbuild.util.atomic import staging_dir, write_file_atomic
from specbuild.util.checkpoints import cache_keyword
from specbuild.cache import cache_dir
from specbuild.prompts import Prompt

from .config import TrainConfig
from .sources import DATA_FORMAT, TrainDataError


@dataclass(frozen=True)
class DistillData:
    """Target-generated sequences and the target's features at every position.

    Attributes:
        tokens: ``[N]`` int64, every sequence (prompt + response) concatenated.
        offsets: ``[S + 1]`` int64; sequence ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``.
        prompt_lens: ``[S]`` int64, prompt tokens at the start of each sequence.
        features: ``[N, H]`` float32 final-norm hidden states. top1: ``[N]`` int64 target argmax.
        path: the cache directory.
    """

    tokens: torch.Tensor
    offsets: torch.Tensor
    prompt_lens: torch.Tensor
    features: torch.Tensor
    top1: torch.Tensor
    path: Path

    @property
    def num_sequences(self) -> int:
        return len(self.prompt_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def span(self, i: int) -> tuple[int, int]:
        return int(self.offsets[i]), int(self.offsets[i + 1])

    def aux(self, layers: Sequence[int]) -> torch.Tensor:
        """``[N, 3 Ht]`` captured layer outputs (EAGLE-3); written by :func:`ensure_aux_features`."""
        return load_file(str(self.path / _aux_name(layers)))["aux"]


def text_chunks(tokenizer, texts: Sequence[tuple[str, str]], *, max_tokens: int, chunk_len: int, seed: int) -> list[list[int]]:
    """Token pieces of ``texts`` for teacher forcing: texts in an order seeded by ``seed``, each
    tokenized and cut into ``chunk_len``-token pieces (pieces under 16 tokens dropped), until
    ``max_tokens`` tokens are taken (the last piece is cut to fit)."""
    pieces: list[list[int]] = []
    taken = 0
    for k in torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist():
        ids = tokenizer(texts[k][1], add_special_tokens=True)["input_ids"]
        for a in range(0, len(ids), chunk_len):
            piece = ids[a : a + chunk_len][: max_tokens - taken]
            if len(piece) >= 16:
                pieces.append(piece)
                taken += len(piece)
            if taken >= max_tokens:
                return pieces
    return pieces


def build_distill_data(
    model,
    tokenizer,
    prompts: Sequence[Prompt],
    config: TrainConfig,
    *,
    fingerprint: str,
    root: Path | None = None,
    log: Callable[[str], None] = print,
    texts: Sequence[tuple[str, str]] = (),
    responses_key: str | None = None,
    aux_layers: Sequence[int] = (),
) -> DistillData:
    """Generate (or reuse) the self-distillation data for ``prompts``; see the module docstring.

    Args:
        model: the target (a transformers causal LM, eval mode). tokenizer: its tokenizer.
        texts: ``(name, text)`` pairs to add teacher-forced (:func:`~specbuild.train.sources.load_texts`).
        fingerprint: :func:`~specbuild.train.sources.data_fingerprint`; names the cache directory under ``root``
            (default ``$SPECBUILD_CACHE/train-data``).
        responses_key: :func:`~specbuild.train.sources.responses_cache_key` (default ``fingerprint``): the target's responses
            are kept in ``<root>/<responses_key>.json`` as batches finish, each under its prompt's tokens,
            so an interrupted run resumes, data that differs only in ``texts`` reuses them, and a prompt
            set that shares prompts with an earlier one generates only the prompts it adds.
        aux_layers: target layers whose outputs the method trains on (EAGLE-3's capture,
            ``Training.capture_layers``): written in the features' forward as ``aux_<layers>.safetensors``
            (:meth:`DistillData.aux`) instead of by a second pass over the data later.
    """
    out = (root or cache_dir() / "train-data") / fingerprint
    if not (out / "meta.json").is_file():
        if not prompts:
            raise TrainDataError("train.prompts: no training prompts")
        partial = out.with_name(f"{responses_key or fingerprint}.json")  # survives an interrupted run
        with staging_dir(out) as tmp:
            _write_data(model, tokenizer, prompts, config, tmp, partial=partial, log=log, texts=texts, aux_layers=aux_layers)
        log(f"training data written to {out}")
    else:
        log(f"training data: reusing {out}")
    return load_distill_data(out)


def load_distill_data(path: Path) -> DistillData:
    seq = load_file(str(path / "sequences.safetensors"))
    feats = load_file(str(path / "features.safetensors"))
    return DistillData(seq["tokens"], seq["offsets"], seq["prompt_lens"], feats["features"], feats["top1"], path)


def _write_data(model, tokenizer, prompts: Sequence[Prompt], config: TrainConfig, out: Path, *, partial: Path, log,
                texts: Sequence[tuple[str, str]], aux_layers: Sequence[int]) -> None:
    start = time.perf_counter()
    encoded = [tokenizer(p.text, add_special_tokens=True)["input_ids"] for p in prompts]
    samples = config.samples_per_prompt
    jobs = [ids for ids in encoded for _ in range(samples)]  # prompt i's responses at i*samples .. i*samples+samples-1
    sampled = [s > 0 for _ in encoded for s in range(samples)]
    responses, captured = _generate(model, jobs, config, eos_id=_eos_id(model, tokenizer), partial=partial, log=log,
                                    sampled=sampled, capture=aux_layers)
    generated_s = time.perf_counter() - start
    encoded = jobs
    sequences = [p + r for p, r in zip(encoded, responses)]
    pieces = text_chunks(tokenizer, texts, max_tokens=config.text_tokens, chunk_len=config.text_chunk_tokens, seed=config.seed)
    sequences += pieces
    encoded += pieces  # teacher-forced text: all "prompt", nothing generated
    lens = torch.tensor([len(s) for s in sequences])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    tokens = torch.tensor([t for s in sequences for t in s], dtype=torch.long)
    save_file({"tokens": tokens, "offsets": offsets, "prompt_lens": torch.tensor([len(p) for p in encoded])},
              str(out / "sequences.safetensors"))
    # the sequences generate() did not just write (saved responses, texts) get their teacher-forced pass
    rest = [i for i in range(len(sequences)) if i not in captured]
    if captured:
        log(f"target features: {len(captured)} sequences read from the generation's forwards, "
            f"{len(rest)} need a teacher-forced pass")
    forced = target_features(model, [sequences[i] for i in rest], batch_size=config.generation_batch_size,
                             layers=aux_layers, log=log) if rest else {}
    feats = _merge_features(captured, forced, rest, [len(s) for s in sequences], aux=bool(aux_layers))
    save_file({"features": feats["features"], "top1": feats["top1"]}, str(out / "features.safetensors"))
    if aux_layers:  # the captured layers from the same forward (EAGLE-3), not a second pass later
        _save_aux(out / _aux_name(aux_layers), feats["aux"])
    meta = {
        "format": DATA_FORMAT, "num_sequences": len(sequences), "num_tokens": int(offsets[-1]),
        "response_tokens": sum(len(r) for r in responses), "max_new_tokens": config.max_new_tokens,
        "samples_per_prompt": samples, "text_tokens": sum(map(len, pieces)), "text_sequences": len(pieces), "temperature": config.temperature if samples > 1 else None,
        "prompt_ids": [p.id for p in prompts], "generate_seconds": round(generated_s, 1),
        "features_from_generation": len(captured),
        "total_seconds": round(time.perf_counter() - start, 1),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    log(f"training data: {meta['num_sequences']} sequences, {meta['num_tokens']} tokens "
        f"({meta['response_tokens']} generated) in {meta['total_seconds']} s")


def _merge_features(captured: dict[int, dict[str, torch.Tensor]], forced: dict[str, torch.Tensor], rest: Sequence[int],
                    lens: Sequence[int], *, aux: bool) -> dict[str, torch.Tensor]:
    """Every sequence's rows in order: from ``captured`` (by index) or from ``forced``, the teacher-forced
    pass over the sequences ``rest`` (concatenated in that order)."""
    keys = ["features", "top1"] + (["aux"] if aux else [])
    starts, at = {}, 0
    for i in rest:
        starts[i] = at
        at += lens[i]
    return {key: torch.cat([captured[i][key] if i in captured else forced[key][starts[i]: starts[i] + lens[i]]
                            for i in range(len(lens))]) for key in keys}


def _eos_id(model, tokenizer) -> int | None:
    eos = model.generation_config.eos_token_id
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos if eos is not None else tokenizer.eos_token_id


@torch.inference_mode()
def generate_responses(
    model, prompts: Sequence[list[int]], config: TrainConfig, *, eos_id: int | None, partial: Path | None = None, log=print,
    sampled: Sequence[bool] | None = None,
) -> list[list[int]]:
    """Responses of the target, ``generation_batch_size`` prompts per left-padded ``generate()``.

    Prompts are greedy unless ``sampled[i]`` (then multinomial sampling at ``config.temperature``, the
    batch seeded from ``config.seed`` and its position, so the same settings give the same data).
    Greedy and sampled prompts are batched apart, each in length order (less padding); each response
    ends at its first ``eos_id`` (kept) or after ``max_new_tokens``. Returns responses in the order of
    ``prompts``. With ``partial`` (a JSON file) finished batches are saved as they complete; a later run
    batches only the prompts without a saved response (same tokens, greedy or sampled, same repeat:
    :func:`_entry_keys`), so an interrupted run resumes and a source added to ``train.prompts`` costs only
    its own responses.
    """
    return _generate(model, prompts, config, eos_id=eos_id, partial=partial, log=log, sampled=sampled)[0]


def _generate(
    model, prompts: Sequence[list[int]], config: TrainConfig, *, eos_id: int | None, partial: Path | None, log,
    sampled: Sequence[bool] | None, capture: Sequence[int] | None = None,
) -> tuple[list[list[int]], dict[int, dict[str, torch.Tensor]]]:
    """:func:`generate_responses`, and with ``capture`` (decoder layer ids, possibly none) the features of
    every newly generated ``prompt + response`` read from the generation's own forwards
    (:class:`_Recorder`): ``{index: {"features": [L, H], "top1": [L], "aux": [L, len(capture) * H]}}``,
    the values :func:`target_features` gives for that sequence (to float rounding), without a second pass.
    Responses reused from ``partial`` have no entry; neither has anything when the target's layers
    cannot be hooked (:func:`_capture_modules`)."""
    device = next(model.parameters()).device
    pad = eos_id if eos_id is not None else 0
    sampled = list(sampled) if sampled is not None else [False] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: (sampled[i], len(prompts[i]), i))
    keys = _entry_keys(prompts, sampled)
    saved = _read_partial(partial)
    responses: dict[int, list[int]] = {i: saved[k] for i, k in enumerate(keys) if k in saved}
    if responses:
        log(f"reusing {len(responses)}/{len(prompts)} saved responses (same prompt, same generation settings)")
    if capture is not None and _capture_modules(model) is None:
        capture = None  # not a decoder stack this can hook: the caller's teacher-forced pass does it all
    captured: dict[int, dict[str, torch.Tensor]] = {}
    bs = config.generation_batch_size
    batches = []  # a batch never mixes greedy and sampled prompts; only prompts without a saved response
    for kind in (False, True):
        part = [i for i in order if sampled[i] == kind and i not in responses]
        batches += [part[b : b + bs] for b in range(0, len(part), bs)]
    done = len(responses)
    for chunk in batches:
        done += len(chunk)
        width = max(len(prompts[i]) for i in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, i in enumerate(chunk):
            ids[r, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[r, width - len(prompts[i]):] = 1
        start = time.perf_counter()
        sampling = {"do_sample": False}
        if sampled[chunk[0]]:
            torch.manual_seed(config.seed * 1_000_003 + chunk[0])
            sampling = {"do_sample": True, "temperature": config.temperature, "top_k": 0, "top_p": 1.0}
        recorder = _Recorder(model, capture) if capture is not None else None
        try:
            out = model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=config.max_new_tokens,
                min_new_tokens=1, eos_token_id=eos_id, pad_token_id=pad, return_dict_in_generate=recorder is not None,
                **sampling,
            )
            if recorder is not None:
                recorder.feed_last(model, out, mask.to(device))
        finally:
            if recorder is not None:
                recorder.close()
        sequences = out.sequences if recorder is not None else out
        rows = sequences[:, width:].tolist()
        for r, i in enumerate(chunk):
            row = rows[r]
            if eos_id is not None and eos_id in row:
                row = row[: row.index(eos_id) + 1]
            responses[i] = row
        if recorder is not None:
            captured.update(recorder.sequences(model, chunk, [len(prompts[i]) for i in chunk],
                                               [len(responses[i]) for i in chunk], width))
        if partial is not None:
            _write_partial(partial, {keys[i]: responses[i] for i in chunk})
        log(f"generated {done}/{len(order)} responses ({time.perf_counter() - start:.1f} s for this batch)")
    return [responses[i] for i in range(len(prompts))], captured


def _capture_modules(model) -> tuple[Sequence[torch.nn.Module], torch.nn.Module] | None:
    """The target's decoder layers and final norm (``base_model.layers``, ``base_model.norm``: Llama,
    Mistral, Qwen, Gemma and the other decoder stacks transformers builds that way), or None."""
    base = model.base_model
    layers, norm = getattr(base, "layers", None), getattr(base, "norm", None)
    if not isinstance(layers, torch.nn.ModuleList) or not isinstance(norm, torch.nn.Module):
        return None
    return layers, norm


class _Recorder:
    """Forward hooks that keep what :func:`target_features` computes, from ``generate()``'s own forwards.

    Each forward of the target (the prefill ``[B, width]``, then one ``[B, 1]`` per decode step) leaves
    the final norm's output and the captured layers' outputs (``hidden_states[i + 1]`` as transformers
    numbers them: the last layer's is the final norm's output). ``generate()`` never feeds its last token,
    so :meth:`feed_last` runs one more ``[B, 1]`` forward on the returned cache; then forward ``k + 1``
    holds response token ``k`` of every row, and each ``prompt + response`` has its features at every
    position, as a teacher-forced pass over it would give them (the same positions; left padding masked).
    """

    def __init__(self, model, layers: Sequence[int]):
        decoder, norm = _capture_modules(model)
        # transformers' hidden_states[L] (the last layer's) is the final norm's output, not the layer's own
        self.keys = ["last" if j == len(decoder) - 1 else j for j in layers]
        self.calls: list[dict] = []  # one per forward: {"last": [B, T, H], layer id: [B, T, H]}
        self._pending: dict = {}
        self._handles = [norm.register_forward_hook(self._hook("last"))]
        self._handles += [decoder[j].register_forward_hook(self._hook(j)) for j in set(self.keys) - {"last"}]

    def _hook(self, key):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            self._pending[key] = out.detach()
            if key == "last":  # the norm runs after every layer: the forward is complete
                self.calls.append(self._pending)
                self._pending = {}
        return hook

    def feed_last(self, model, out, mask: torch.Tensor) -> None:
        """Feed the last generated token of every row through the cache ``generate()`` returned."""
        cache = getattr(out, "cache", None)
        if cache is None:
            cache = getattr(out, "past_key_values", None)
        if cache is None:
            raise RuntimeError("generate() returned no cache; cannot read the last token's features")
        n = out.sequences.shape[1] - mask.shape[1]
        full = torch.cat([mask, mask.new_ones((mask.shape[0], n))], 1)
        base = model.base_model
        base(input_ids=out.sequences[:, -1:], attention_mask=full, position_ids=full.sum(-1, keepdim=True) - 1,
             use_cache=True, **{cache_keyword(base): cache})

    def sequences(self, model, chunk: Sequence[int], prompt_lens: Sequence[int], response_lens: Sequence[int],
                  width: int) -> dict[int, dict[str, torch.Tensor]]:
        """Per row: its prompt's positions from the prefill, response token ``k``'s from forward ``k + 1``."""
        calls, need = self.calls, max(response_lens) + 1
        if len(calls) < need or calls[0]["last"].shape[1] != width or any(c["last"].shape[1] != 1 for c in calls[1:]):
            raise RuntimeError(f"generate() ran {len(calls)} forwards, not a prefill and {need - 1} single-token steps")
        steps = {key: torch.cat([c[key] for c in calls[1:need]], 1) for key in calls[0]}  # [B, need - 1, H]
        lm_head = model.get_output_embeddings()
        result = {}
        for r, (i, p, n) in enumerate(zip(chunk, prompt_lens, response_lens)):
            per = {key: torch.cat([calls[0][key][r, width - p:], steps[key][r, :n]]).float().cpu() for key in calls[0]}
            entry = {"features": per["last"],
                     "top1": lm_head(per["last"].to(lm_head.weight.device, lm_head.weight.dtype)).argmax(-1).cpu()}
            if self.keys:
                entry["aux"] = torch.cat([per[key] for key in self.keys], -1)
            result[i] = entry
        return result

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def _entry_keys(prompts: Sequence[list[int]], sampled: Sequence[bool]) -> list[str]:
    """A saved response's key: the prompt's tokens (hashed), greedy or sampled, and which repeat of that
    pair it is (a prompt's second sampled response is another entry than its first)."""
    seen: dict[tuple[str, bool], int] = {}
    keys = []
    for ids, s in zip(prompts, sampled):
        digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:32]
        k = seen[(digest, s)] = seen.get((digest, s), -1) + 1
        keys.append(f"{digest}:{'s' if s else 'g'}:{k}")
    return keys


def _read_partial(partial: Path | None) -> dict[str, list[int]]:
    """Responses saved by earlier runs with the same generation settings, by :func:`_entry_keys` key."""
    if partial is None or not partial.is_file():
        return {}
    try:
        saved = json.loads(partial.read_text())
    except ValueError:
        return {}
    return {k: r for k, r in saved.items() if isinstance(r, list)} if isinstance(saved, dict) else {}


def _write_partial(partial: Path, new: dict[str, list[int]]) -> None:
    """Add ``new`` to the saved responses (re-read first: another run may share the file)."""
    write_file_atomic(partial, json.dumps(_read_partial(partial) | new).encode())


@torch.inference_mode()
def target_features(model, sequences: Sequence[list[int]], *, batch_size: int, layers: Sequence[int] = (), last: bool = True,
                    log=print) -> dict[str, torch.Tensor]:
    """Teacher-forced target pass over ``sequences`` (right-padded batches of similar length: the
    sequences are taken shortest first, so little of a batch is padding; the rows come back in the
    given order).

    Args:
        layers: decoder layers whose outputs to capture as well (EAGLE-3), in the same forward.
        last: return the final hidden state and the target's argmax (False: only ``aux``).

    Returns:
        ``features [N, H]`` float32 (after the final norm) and ``top1 [N]`` int64 when ``last``;
        ``aux [N, len(layers) * H]`` float32, the outputs of those decoder layers
        (``hidden_states[i + 1]``), when ``layers``. N is the sequences' total length, in concatenation order.
    """
    device = next(model.parameters()).device
    lm_head = model.get_output_embeddings()
    feats, top1, aux = {}, {}, {}
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    for b in range(0, len(order), batch_size):
        rows = order[b : b + batch_size]
        width = max(len(sequences[i]) for i in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, i in enumerate(rows):
            ids[r, : len(sequences[i])] = torch.tensor(sequences[i])
            mask[r, : len(sequences[i])] = 1
        out = model.base_model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=bool(layers))
        hidden = out.last_hidden_state.float()  # [B, T, H] after the final norm
        for r, i in enumerate(rows):
            n = len(sequences[i])
            if layers:
                aux[i] = torch.cat([out.hidden_states[j + 1][r, :n].float() for j in layers], -1).cpu()
            if last:
                h = hidden[r, :n]
                feats[i] = h.cpu()
                top1[i] = lm_head(h.to(lm_head.weight.dtype)).argmax(-1).cpu()
        log(f"target features {min(b + batch_size, len(order))}/{len(order)} sequences")
    result = {}
    if last:
        result["features"] = torch.cat([feats[i] for i in range(len(sequences))])
        result["top1"] = torch.cat([top1[i] for i in range(len(sequences))])
    if layers:
        result["aux"] = torch.cat([aux[i] for i in range(len(sequences))])
    return result


def ensure_aux_features(model, data: DistillData, layers: Sequence[int], *, batch_size: int, log=print) -> torch.Tensor:
    """Captured-layer features for EAGLE-3, cached beside the data (``aux_<layers>.safetensors``)."""
    path = data.path / _aux_name(layers)
    if not path.is_file():
        sequences = [data.tokens[a:b].tolist() for a, b in map(data.span, range(data.num_sequences))]
        aux = target_features(model, sequences, batch_size=batch_size, layers=layers, last=False, log=log)["aux"]
        _save_aux(path, aux)
    return data.aux(layers)


def _save_aux(path: Path, aux: torch.Tensor) -> None:
    tmp = path.with_suffix(".tmp")
    save_file({"aux": aux.contiguous()}, str(tmp))
    tmp.replace(path)


def _aux_name(layers: Sequence[int]) -> str:
    return "aux_" + "_".join(str(i) for i in layers) + ".safetensors"
