"""Training prompts the target writes itself: ``train.prompts: magpie:N``.

An instruct model given only its chat template's opening of a user turn (for SmolLM2,
``<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n``) writes a user message, as aligned models do
(Magpie: Xu et al. 2025, "Magpie: Alignment Data Synthesis from Scratch by Prompting Aligned LLMs with
Nothing", ICLR 2025, §2.1). Sampled at temperature 1, the messages are as varied as the requests the
model was aligned on: travel plans, recipes, business advice, stories, science questions. Nothing
third-party is bundled or downloaded, and no licence but the target's applies.

Kept: messages that end where the template's user turn ends (the first token of the text the template
puts after the message, e.g. ``<|im_end|>``) within :data:`MAX_TOKENS`, of :data:`MIN_TOKENS` tokens or
more, with no special token inside, distinct (case and spacing ignored), and not a near duplicate of
any evaluation prompt (:func:`specbuild.prompts.near_duplicates` against
:func:`specbuild.prompts.evaluation_prompts`). Their responses are then generated like any other
prompt's (``samples_per_prompt``).

The messages are cached as ``$SPECBUILD_CACHE/train-data/magpie-<key>.jsonl`` (key: the target's
fingerprint, N, ``train.seed``, ``train.generation_batch_size`` and this module's settings), one OpenAI-style ``messages`` line each, so
later runs, plans and fingerprints read them without loading the target.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from specbuild.cache import cache_dir
from specbuild.prompts import Prompt, evaluation_prompts, near_duplicates
from specbuild.util.atomic import write_file_atomic

from .config import TrainConfig

TEMPERATURE = 1.0  # Magpie §2.1 samples the query at temperature 1 (top-p 1)
MAX_TOKENS = 96  # a message not ended within this many tokens is dropped
MIN_TOKENS = 4
ROUNDS = 4  # sampling rounds before giving up on reaching N
FORMAT = 1
_SENTINEL = "\x00specbuild-magpie\x00"


class MagpieError(ValueError):
    """A ``magpie:N`` source that cannot be made: a target without a chat template, or no usable message
    (``N`` itself is checked with the recipe: :func:`specbuild.train.config.magpie_count`)."""


def magpie_path(target_fingerprint: str, count: int, config: TrainConfig) -> Path:
    """Where the ``magpie:count`` prompts of this target, ``config.seed`` and ``config.generation_batch_size``
    (each batch is seeded by its position) are cached."""
    key = (f"{FORMAT}:{target_fingerprint}:{count}:{config.seed}:{config.generation_batch_size}:"
           f"{TEMPERATURE}:{MAX_TOKENS}:{MIN_TOKENS}")
    return cache_dir() / "train-data" / f"magpie-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsonl"


def load_magpie(path: Path) -> list[Prompt]:
    """The cached messages at ``path`` as one-user-turn conversations (ids ``magpie/<n>``).

    Raises:
        MagpieError: the file cannot be read as :func:`save_magpie` writes it (the message says to delete it).
    """
    prompts = []
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            (turn,) = row["messages"]
            content, prompt_id = turn["content"], row["id"]
            if not isinstance(content, str) or not isinstance(prompt_id, str):
                raise TypeError(f"line {len(prompts) + 1}: content and id must be strings")
            content.encode("utf-8"), prompt_id.encode("utf-8")  # no lone surrogates (UnicodeEncodeError)
            prompts.append(Prompt(prompt_id, content, messages=(("user", content),)))
    except (ValueError, KeyError, TypeError) as exc:  # written atomically by save_magpie: damaged by hand
        raise MagpieError(f"train.prompts: the cached Magpie prompts {path} cannot be read ({type(exc).__name__}: {exc}); "
                          "delete the file and the next run writes them again") from None
    return prompts


def user_turn_template(tokenizer) -> tuple[list[int], int]:
    """``(prefix ids, stop id)``: the chat template's tokens up to a user message's first token, and the
    first token of what it puts after the message (the end of the user turn).

    Raises:
        MagpieError: the tokenizer has no chat template (a base model: it was aligned on no user turns).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise MagpieError("prompt source 'magpie:N' needs an instruct target with a chat template: the target writes "
                          "user messages from the template's user turn; give your own prompts (a .jsonl file) instead")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=True)
    prefix, _, after = text.partition(_SENTINEL)
    prefix_ids = tokenizer(prefix, add_special_tokens=True)["input_ids"]  # as the data's prompts are tokenized
    after_ids = tokenizer(after, add_special_tokens=False)["input_ids"]
    stop = after_ids[0] if after_ids else tokenizer.eos_token_id
    if stop is None:
        raise MagpieError("prompt source 'magpie:N': the chat template ends a user turn with nothing the target can emit")
    return prefix_ids, stop


def generate_magpie(model, tokenizer, count: int, config: TrainConfig, *, log: Callable[[str], None] = print) -> list[Prompt]:
    """``count`` user messages written by the target (see the module docstring), fewer when
    :data:`ROUNDS` sampling rounds do not yield that many usable ones.

    Each round samples ``1.5 x`` the messages still missing (at least one ``generation_batch_size``)
    with :func:`~specbuild.train.data.generate_responses`, seeded by ``config.seed`` and the round.

    Raises:
        MagpieError: no chat template, or not one usable message in any round.
    """
    from .data import generate_responses

    prefix, stop = user_turn_template(tokenizer)
    evaluation = evaluation_prompts()
    seen = {" ".join(p.text.lower().split()) for p in evaluation}
    kept: list[str] = []
    for round_ in range(ROUNDS):
        missing = count - len(kept)
        if missing <= 0:
            break
        batch = config.generation_batch_size
        n = max(batch, -(-int(missing * 1.5) // batch) * batch)
        settings = config.model_copy(update={"max_new_tokens": MAX_TOKENS, "temperature": TEMPERATURE,
                                             "seed": config.seed * 7919 + round_})
        rows = generate_responses(model, [prefix] * n, settings, eos_id=stop, log=lambda _: None, sampled=[True] * n)
        fresh = usable_messages(rows, tokenizer, stop, evaluation, seen)
        kept += fresh[:missing]
        log(f"magpie: round {round_ + 1}: {len(fresh)} usable of {n} sampled; {len(kept)}/{count}")
    if not kept:
        raise MagpieError("prompt source 'magpie:N': the target wrote no usable user message (none ended its user turn "
                          f"within {MAX_TOKENS} tokens); is it an instruct model? Give your own prompts (a .jsonl file) instead")
    return [Prompt(f"magpie/{k}", t, messages=(("user", t),)) for k, t in enumerate(kept)]


def usable_messages(rows: list[list[int]], tokenizer, stop: int, evaluation: list[Prompt], seen: set[str]) -> list[str]:
    """The messages of ``rows`` (sampled token ids, each ending at ``stop`` when the message ended) worth
    training on: ended at ``stop``, :data:`MIN_TOKENS` tokens or more, no special token inside, not in
    ``seen`` (normalised text; each kept one is added) and not a near duplicate of an ``evaluation`` prompt."""
    special = set(tokenizer.all_special_ids) | {stop}
    fresh = []
    for row in rows:
        if not row or row[-1] != stop or len(row) - 1 < MIN_TOKENS or special & set(row[:-1]):
            continue
        text = tokenizer.decode(row[:-1]).strip()
        norm = " ".join(text.lower().split())
        if text and norm not in seen:
            seen.add(norm)
            fresh.append(text)
    near = {int(tid) for tid, _, _ in near_duplicates([(str(k), t) for k, t in enumerate(fresh)],
                                                       [(p.id, p.text) for p in evaluation])}
    return [t for k, t in enumerate(fresh) if k not in near]


def save_magpie(path: Path, prompts: list[Prompt]) -> Path:
    """Write ``prompts`` (from :func:`generate_magpie`) to ``path`` atomically, one ``messages`` line each."""
    lines = [json.dumps({"id": p.id, "messages": [{"role": "user", "content": p.text}]}) for p in prompts]
    return write_file_atomic(path, ("\n".join(lines) + "\n").encode("utf-8"))
