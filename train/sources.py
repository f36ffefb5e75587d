"""Where the training data comes from, without torch: the prompt sources of ``train.prompts`` (weighted,
held-out prompts kept out), the teacher-forced texts of ``train.texts``, and the fingerprints that name the
cached data and responses (:mod:`specbuild.train.data` makes the data). ``plan`` and ``recipes`` read
these to estimate and check a recipe's training before anything heavy is imported.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from specbuild.prompts import Prompt, load_prompts

from .config import HUMANEVAL_TRAIN, HUMANEVAL_TRAIN_START, TrainConfig, magpie_count

DATA_FORMAT = 1


class TrainDataError(ValueError):
    """Training prompts that cannot be used (missing, empty, or overlapping the held-out set).

    ``item``: the position in ``train.prompts`` of the source that failed, where one did (else None),
    so a recipe error can point at that list item's line.
    """

    def __init__(self, message: str, *, item: int | None = None):
        super().__init__(message)
        self.item = item


def training_prompts(
    config: TrainConfig, *, base_dir: Path | None = None, generated: dict[str, list[Prompt]] | None = None,
) -> tuple[list[Prompt], list[Prompt]]:
    """``(training prompts, held-out prompts)`` for ``config``.

    Each source of ``train.prompts`` is loaded (:func:`load_source`; a ``magpie:N`` source from
    ``generated``, source -> the prompts :mod:`specbuild.train.magpie` made) and weighted
    (:func:`weighted`), in order. Prompts meant for the chat template (chat logs, and the bundled user-message sets such as
    ``mixed``) carry ``Prompt.messages``; :func:`~specbuild.prompts.render_messages` turns them into the
    target's chat-template text once its tokenizer is loaded.

    Raises:
        TrainDataError: a source cannot be read, a ``magpie:N`` source is not in ``generated``, or a held-out
            prompt's text is also a training prompt.
    """
    from specbuild.prompts import PromptSourceError

    def source_prompts(source: str) -> list[Prompt]:
        if magpie_count(source) is None:
            return load_source(source, base_dir=base_dir)
        if generated is None or source not in generated:
            raise TrainDataError(f"train.prompts: {source!r} is written by the target; it is made when the draft trains")
        return generated[source]

    train = []
    for item, source in enumerate(config.prompt_sources):
        try:
            train += weighted(source_prompts(source.source), source.weight)
        except (PromptSourceError, TrainDataError) as exc:
            message = str(exc) if isinstance(exc, TrainDataError) else f"train.prompts: {exc}"
            raise TrainDataError(message, item=item if isinstance(config.prompts, list) else None) from None
    try:
        held_out = load_source(config.held_out, base_dir=base_dir)
    except PromptSourceError as exc:
        raise TrainDataError(f"train.held_out: {exc}") from None
    if config.max_prompts is not None:
        train = train[: config.max_prompts]
    trained_texts = {t.text for t in train}
    overlap = sorted({p.id for p in held_out if p.text in trained_texts})
    if overlap:
        fix = (f"humaneval-train starts at HumanEval/{HUMANEVAL_TRAIN_START}: use humaneval:N with N <= {HUMANEVAL_TRAIN_START}"
               if all(i.startswith("HumanEval/") for i in overlap) else
               "take them out of train.prompts, or hold out another prompt set")
        raise TrainDataError(
            f"train.held_out: {len(overlap)} held-out prompt(s) are also training prompts (e.g. {overlap[:3]}); "
            f"held-out acceptance must come from prompts never trained on ({fix})"
        )
    return train, held_out


def load_source(source: str, *, base_dir: Path | None = None) -> list[Prompt]:
    """One prompt source's prompts, those meant for the chat template as one-user-turn conversations.

    ``humaneval-train`` is HumanEval 40..163 (raw code); sources whose prompts verify and bench put inside
    the chat template (:func:`~specbuild.prompts.wants_chat_template`: ``mixed``, ``chat``, ``summarize``,
    ``specbench:...``) get ``messages``; a file's ``messages`` lines keep theirs; other lines stay raw text.

    Raises:
        PromptSourceError: as :func:`~specbuild.prompts.load_prompts`.
    """
    from specbuild.prompts import as_user_messages, wants_chat_template

    if source == HUMANEVAL_TRAIN:
        return load_prompts("humaneval")[HUMANEVAL_TRAIN_START:]
    prompts = load_prompts(source, base_dir=base_dir)
    return as_user_messages(prompts) if wants_chat_template(source, "auto") else prompts


def weighted(prompts: Sequence[Prompt], weight: float) -> list[Prompt]:
    """The first ``round(weight * len(prompts))`` prompts (at least one), cycling through them when
    ``weight > 1``; repeats get ids ``<id>#2``, ``<id>#3``, ... Example: 4 prompts, weight 1.5 -> p0..p3, p0#2, p1#2."""
    import dataclasses

    count = weighted_count(len(prompts), weight)
    return [p if k < len(prompts) else dataclasses.replace(p, id=f"{p.id}#{k // len(prompts) + 1}")
            for k, p in ((k, prompts[k % len(prompts)]) for k in range(count))]


def weighted_count(count: int, weight: float) -> int:
    """How many prompts :func:`weighted` takes from a source of ``count``: ``round(weight * count)``, at
    least 1 (0 for an empty source)."""
    return max(1, round(weight * count)) if count else 0


STDLIB_TEXTS = "python-stdlib"
DOCS_TEXTS = "python-docs"
_STDLIB_SKIP = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib2to3", "idlelib"}


def load_texts(source: str | None, *, base_dir: Path | None = None) -> list[tuple[str, str]]:
    """``(name, text)`` pairs of ``train.texts``: ``python-stdlib`` (every ``.py`` of the running
    Python's standard library outside test suites, sorted by path), ``python-docs`` (English prose: the
    running Python's ``pydoc_data.topics``, the language reference and library sections ``help()``
    shows, PSF licence; about 110k SmolLM2 tokens on 3.11), a ``.jsonl`` file (objects with
    ``text``, read as :func:`~specbuild.prompts.load_prompts` reads prompt files) or a ``.txt``
    file (one text). None gives ``[]``.

    Raises:
        TrainDataError: a missing or unreadable file, a bad line, or no text at all.
    """
    if source is None:
        return []
    if source == STDLIB_TEXTS:
        import sysconfig

        root = Path(sysconfig.get_paths()["stdlib"])
        files = []  # every *.py below root outside _STDLIB_SKIP, symlinked directories not followed (as rglob)
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = [d for d in subfolders if d not in _STDLIB_SKIP]  # not walked at all: site-packages is big
            files += [Path(folder, name) for name in names if name.endswith(".py")]
        files.sort()  # as paths (by their parts), the order the data's fingerprint hashes them in
        texts = [(str(p.relative_to(root)), p.read_text(encoding="utf-8", errors="replace")) for p in files]
    elif source == DOCS_TEXTS:
        from pydoc_data.topics import topics

        texts = sorted(topics.items())
    else:
        path = Path(source) if base_dir is None or Path(source).is_absolute() else base_dir / source
        use = f"use {STDLIB_TEXTS!r}, {DOCS_TEXTS!r}, a .jsonl or a .txt file"
        if not source.strip():
            raise TrainDataError(f"train.texts: empty; {use}, or leave train.texts out")
        if path.is_dir():
            raise TrainDataError(f"train.texts: {path} is a directory; {use}")
        if not path.is_file():
            raise TrainDataError(f"train.texts: no such file {path} ({use})")
        if path.suffix == ".jsonl":  # the prompt files' format: objects with "text" (or "prompt")
            from specbuild.prompts import PromptSourceError

            try:
                texts = [(p.id, p.text) for p in load_prompts(str(path))]
            except PromptSourceError as exc:
                raise TrainDataError(f"train.texts: {exc}") from None
        elif path.suffix == ".txt":
            try:
                texts = [(path.name, path.read_text(encoding="utf-8"))]
            except UnicodeDecodeError as exc:
                raise TrainDataError(f"train.texts: {path} is not UTF-8 text (byte offset {exc.start}); "
                                     "save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
        else:
            raise TrainDataError(f"train.texts: {path} is neither .jsonl nor .txt")
    texts = [(name, text) for name, text in texts if text.strip()]
    if not texts:
        raise TrainDataError(f"train.texts: {source} holds no text")
    return texts


def responses_fingerprint(target_fingerprint: str, prompts: Sequence[Prompt], config: TrainConfig) -> str:
    """Hash of what determines the target's responses: target, prompt texts, generation settings, format."""
    h = hashlib.sha256(f"{DATA_FORMAT}:{target_fingerprint}:{config.max_new_tokens}".encode())
    if config.samples_per_prompt > 1:
        h.update(f":{config.samples_per_prompt}:{config.temperature}:{config.seed}".encode())
    for p in prompts:
        h.update(hashlib.sha256(p.text.encode()).digest())
        if p.messages is not None:  # a conversation: its turns, which the chat template renders
            h.update(hashlib.sha256(json.dumps(p.messages).encode()).digest())
    return h.hexdigest()[:16]


def responses_cache_key(target_fingerprint: str, config: TrainConfig) -> str:
    """Names the file of saved responses (``responses-<key>.json``): the target and the generation settings,
    not the prompts, so every prompt set made with the same settings reuses the responses it shares."""
    key = f"{DATA_FORMAT}:{target_fingerprint}:{config.max_new_tokens}:{config.temperature}:{config.seed}"
    return "responses-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def data_fingerprint(
    target_fingerprint: str, prompts: Sequence[Prompt], config: TrainConfig, texts: Sequence[tuple[str, str]] = (),
) -> str:
    """Hash of what determines the data: the responses' fingerprint, then the teacher-forced texts."""
    responses = responses_fingerprint(target_fingerprint, prompts, config)
    if not texts:
        return responses
    h = hashlib.sha256(f"{responses}:texts:{config.text_tokens}:{config.text_chunk_tokens}:{config.seed}".encode())
    for name, text in texts:
        h.update(hashlib.sha256(f"{name}\0{text}".encode()).digest())
    return h.hexdigest()[:16]
