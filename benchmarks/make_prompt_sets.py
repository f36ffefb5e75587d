"""Rebuild the bundled chat and summarisation prompt sets (``specbuild/data/*.jsonl``) from their sources.

Not needed at run time: the JSONL files are committed and shipped as package data. This script records
exactly how they were made, so anyone can check or regenerate them:

    chat.jsonl       the first turn of each of the 80 MT-Bench questions (Zheng et al. 2023,
                     "Judging LLM-as-a-judge with MT-Bench and Chatbot Arena"), file
                     fastchat/llm_judge/data/mt_bench/question.jsonl of github.com/lm-sys/FastChat
                     (Apache-2.0).
    summarize.jsonl  "Summarize ..." instructions over real long documents: the Abstract and the
                     Motivation / Rationale sections of Python Enhancement Proposals (github.com/python/peps,
                     peps/pep-NNNN.rst), each PEP placed in the public domain or under CC0-1.0 by its
                     authors (its "Copyright" section says so; PEPs without that statement are skipped).

Usage (each argument is a git directory, bare or not, holding a checkout of that repository)::

    python benchmarks/make_prompt_sets.py --fastchat /path/to/FastChat --peps /path/to/peps

Writes specbuild/data/chat.jsonl and specbuild/data/summarize.jsonl, and prints the commits used (record
them in specbuild/data/SOURCES.md).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "specbuild" / "data"
MT_BENCH_PATH = "fastchat/llm_judge/data/mt_bench/question.jsonl"
# Well-known PEPs with prose Abstract/Motivation sections, in this order.
PEP_NUMBERS = [
    8, 257, 282, 318, 343, 380, 435, 484, 492, 498, 517, 518, 557, 572, 584, 585, 604, 617, 618, 634,
    636, 3107, 3119, 3156, 3333,
]
# Sections that are not the document's prose, left out of the text to summarise.
SKIPPED_SECTIONS = ("Copyright", "References", "Footnotes", "Acknowledgements", "Acknowledgments", "Reference Implementation", "Implementation", "Open Issues", "Resolved Issues")
MIN_CHARS = 1500  # shorter documents are not "long input"
MAX_CHARS = 3200  # ~700 SmolLM2 tokens: fits max_input_len 1024 with the instruction and chat template
INSTRUCTION = "Summarize the following document in a few sentences.\n\n"
PUBLIC_DOMAIN = re.compile(r"placed in the public domain|CC0-1\.0", re.IGNORECASE)


def git_show(repo: Path, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(_git_dir(repo)), "show", f"HEAD:{path}"], check=True, capture_output=True, text=True
    ).stdout


def git_head(repo: Path) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(_git_dir(repo)), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def _git_dir(repo: Path) -> Path:
    return repo / ".git" if (repo / ".git").is_dir() else repo


def chat_records(fastchat: Path) -> list[dict]:
    records = []
    for line in git_show(fastchat, MT_BENCH_PATH).splitlines():
        if line.strip():
            q = json.loads(line)
            records.append({"id": f"mt-bench/{q['question_id']}", "category": q["category"], "prompt": q["turns"][0]})
    return records


def rst_sections(text: str) -> dict[str, str]:
    """Top-level RST sections (title underlined with '=') -> body text."""
    lines = text.splitlines()
    sections: dict[str, list[str]] = {}
    current = None
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and re.fullmatch(r"=+", lines[i + 1]) and line.strip() and len(lines[i + 1]) >= len(line.strip()):
            current = line.strip()
            sections[current] = []
            continue
        if current is not None and not re.fullmatch(r"=+", line):
            sections[current].append(line)
    return {name: "\n".join(body).strip() for name, body in sections.items()}


def plain(text: str) -> str:
    """Light RST clean-up: inline markup and directives out, paragraphs kept."""
    text = re.sub(r"^\.\. [\w-]+::.*$", "", text, flags=re.MULTILINE)
    text = re.sub(r":\w+:`([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", text)  # :pep:`8` -> 8, :ref:`x <y>` -> x
    text = re.sub(r"`([^`<]+?)\s*<[^>]+>`_+", r"\1", text)  # `text <url>`_ -> text
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"`([^`]+)`_*", r"\1", text)
    text = re.sub(r"\[\d+\]_", "", text)
    text = re.sub(r"\b([A-Za-z][\w-]*[A-Za-z0-9])_(?=[\s.,;:)])", r"\1", text)  # Docutils_ -> Docutils
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def truncate_at_paragraph(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind("\n\n", 0, limit)
    return text[: cut if cut > limit // 2 else limit].rstrip()


def summarize_records(peps: Path) -> list[dict]:
    records = []
    for number in PEP_NUMBERS:
        source = git_show(peps, f"peps/pep-{number:04d}.rst")
        sections = rst_sections(source)
        if not PUBLIC_DOMAIN.search(sections.get("Copyright", "")):
            continue
        title = re.search(r"^Title: (.+)$", source, re.MULTILINE).group(1).strip()
        body = "\n\n".join(plain(text) for name, text in sections.items() if name not in SKIPPED_SECTIONS and text)
        if len(body) < MIN_CHARS:
            continue
        document = f"PEP {number}: {title}\n\n{truncate_at_paragraph(body, MAX_CHARS)}"
        records.append({"id": f"pep-{number}", "prompt": INSTRUCTION + document})
    return records


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fastchat", type=Path, required=True, help="git dir of lm-sys/FastChat")
    parser.add_argument("--peps", type=Path, required=True, help="git dir of python/peps")
    args = parser.parse_args()
    DATA_DIR.mkdir(exist_ok=True)
    chat = chat_records(args.fastchat)
    summaries = summarize_records(args.peps)
    write_jsonl(DATA_DIR / "chat.jsonl", chat)
    write_jsonl(DATA_DIR / "summarize.jsonl", summaries)
    print(f"chat.jsonl: {len(chat)} prompts from lm-sys/FastChat@{git_head(args.fastchat)}")
    print(f"summarize.jsonl: {len(summaries)} prompts from python/peps@{git_head(args.peps)}")


if __name__ == "__main__":
    main()
