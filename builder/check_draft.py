"""``specbuild check-draft``: does a draft checkpoint (EAGLE-3 head, EAGLE head, Medusa heads, draft
model) fit a target, for the engine that will load it? A conformance check before serving, from the
two directories' config.json and safetensors headers (plus the few tensors whose values matter:
``d2t``, ``t2d``, ``embed_tokens``); no model is loaded and no pickle is opened.

What each engine's loader expects of an EAGLE-3 head (:data:`EAGLE3_LOADERS`; sources with commits in
``tests/data/eagle3_loaders.json``)::

    engine     architectures read            embed_tokens in the file   lm_head.weight absent   aux layer ids
    reference  LlamaForCausalLMEagle3 (+ Eagle3LlamaForCausalLM)  ignored  the target's         layer outputs
    trtllm     not read (eagle3_model_arch)  ignored: the target's      the target's            layer outputs
    vllm       Eagle3X / XEagle3 (X -> Eagle3X)  USED unless identical  the target's           layer inputs
    sglang     LlamaForCausalLMEagle3 only   ignored: the target's      the target's only if no  layer outputs
                                                                        draft_vocab_size

vLLM (0.32.0, observed) parses the head's config.json with transformers' ``AutoConfig`` and refuses one without
``model_type`` (``Unrecognized model in DIR. Should have a `model_type` key``); so does TensorRT-LLM
(``_torch/pyexecutor/config_utils.py`` ``load_pretrained_config`` hands configs outside its own registry to
``AutoConfig``). SGLang was not tried without it (a warning there).

Beyond the table: config.json values of the wrong JSON type fail first (:func:`~.draft_files.config_type_problems`);
``fc.weight`` is required (every engine builds ``fc`` for three captured layers); ``num_hidden_layers`` must be
present (LlamaConfig's default is 32 layers) and 1 for the reference engine and SGLang; the reference engine
and SGLang read ``eagle_config.eagle_aux_hidden_state_layer_ids`` only (SGLang ``model_runner.py``); a
head narrower than the target (``target_hidden_size``) needs its own ``embed_tokens``; TensorRT-LLM ignores
``d2t`` when ``draft_vocab_size == vocab_size`` and ties a ``tie_word_embeddings`` head's lm_head to
embeddings it does not have.

Every :class:`Finding` names the field, what the engine expects and the fix. Statuses: ``ok``,
``warn`` (loads, but check it), ``fail`` (the engine refuses it or drafts wrongly), ``skip`` (not
checkable here).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .draft_files import FLOAT_DTYPES, CheckpointFiles, DraftFileError, config_type_problems, torch_dtype_name

Engine = Literal["reference", "trtllm", "vllm", "sglang"]
ENGINES: tuple[str, ...] = ("reference", "trtllm", "vllm", "sglang")
Status = Literal["ok", "warn", "fail", "skip"]
METHODS: tuple[str, ...] = ("eagle3", "eagle", "medusa", "draft_target")
ENGINE_TITLES = {"reference": "the reference engine", "trtllm": "TensorRT-LLM", "vllm": "vLLM", "sglang": "SGLang"}
EAGLE3_NAMES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "EAGLE3LlamaForCausalLM")
EMBED_ROWS_PER_READ = 4096


@dataclass(frozen=True)
class Finding:
    """One check's result: ``check`` names the field (``"d2t"``, ``"lm_head"``, ...), ``detail`` what was
    found against what the engine expects, ``fix`` what to change (fail and warn)."""

    check: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class DraftCheck:
    """The findings of one draft against one target for one engine."""

    draft: Path
    target: Path
    engine: str
    method: str
    findings: tuple[Finding, ...]

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "fail"]

    @property
    def ok(self) -> bool:
        """No check failed (warnings allowed)."""
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        return {"draft": str(self.draft), "target": str(self.target), "engine": self.engine, "method": self.method,
                "ok": self.ok, "checks": [asdict(f) for f in self.findings]}

    def summary(self) -> str:
        """One line, e.g. ``"9 checks: 8 ok, 1 fail (d2t)"``."""
        counts = {s: sum(f.status == s for f in self.findings) for s in ("ok", "warn", "fail", "skip")}
        parts = [f"{n} {s}" for s, n in counts.items() if n]
        names = [f.check for f in self.findings if f.status == "fail"]
        return f"{len(self.findings)} checks: {', '.join(parts)}" + (f" ({', '.join(names)})" if names else "")


@dataclass(frozen=True)
class Eagle3Loader:
    """What one engine's EAGLE-3 loader reads (see the module docstring's table).

    Attributes:
        architectures: accepted ``architectures[0]`` values; None: the engine does not read them.
        uses_own_embed_tokens: a checkpoint ``embed_tokens.weight`` replaces the target's embeddings.
        lm_head_from_target: when the file has no ``lm_head.weight``: ``"always"`` the target's is used,
            ``"without_draft_vocab_size"`` only if config.json has no ``draft_vocab_size``, ``"never"``.
        aux_ids_count_inputs: ``eagle_aux_hidden_state_layer_ids`` name layer inputs (vLLM), not outputs.
        midlayer_only: the loader matches ``midlayer.*`` only (``layers.0.*`` is silently not loaded).
        source: where this was read.
        needs_model_type: config.json must carry ``model_type``: the head's config is parsed with
            transformers' ``AutoConfig``, which refuses a config without one (vLLM 0.32.0, observed).
    """

    architectures: tuple[str, ...] | None
    uses_own_embed_tokens: bool
    lm_head_from_target: Literal["always", "without_draft_vocab_size", "never"]
    aux_ids_count_inputs: bool
    midlayer_only: bool
    source: str
    needs_model_type: bool = False


EAGLE3_LOADERS: dict[str, Eagle3Loader] = {
    "reference": Eagle3Loader(EAGLE3_NAMES[:2], False, "always", False, True, "specbuild methods/eagle3/engine.py"),
    "trtllm": Eagle3Loader(None, False, "always", False, False,
                           "NVIDIA/TensorRT-LLM@00679c6 tensorrt_llm/_torch/models/modeling_speculative.py, "
                           "_torch/pyexecutor/config_utils.py (load_pretrained_config)", needs_model_type=True),
    "vllm": Eagle3Loader(("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "LlamaForCausalLM"), True, "always", True, False,
                         "vllm-project/vllm@00bd149 vllm/model_executor/models/llama_eagle3.py, @008603a v1/spec_decode/eagle.py, "
                         "v0.32.0 vllm/transformers_utils/config.py", needs_model_type=True),
    "sglang": Eagle3Loader(("LlamaForCausalLMEagle3",), False, "without_draft_vocab_size", False, True,
                           "sgl-project/sglang@03d5a77 python/sglang/srt/models/llama_eagle3.py"),
}

EAGLE3_LAYER_SHAPES = (  # name under midlayer. -> shape from (H, q, kv, I)
    ("self_attn.q_proj.weight", lambda h, q, kv, i: (q, 2 * h)),
    ("self_attn.k_proj.weight", lambda h, q, kv, i: (kv, 2 * h)),
    ("self_attn.v_proj.weight", lambda h, q, kv, i: (kv, 2 * h)),
    ("self_attn.o_proj.weight", lambda h, q, kv, i: (h, q)),
    ("mlp.gate_proj.weight", lambda h, q, kv, i: (i, h)),
    ("mlp.up_proj.weight", lambda h, q, kv, i: (i, h)),
    ("mlp.down_proj.weight", lambda h, q, kv, i: (h, i)),
    ("input_layernorm.weight", lambda h, q, kv, i: (h,)),
    ("hidden_norm.weight", lambda h, q, kv, i: (h,)),
    ("post_attention_layernorm.weight", lambda h, q, kv, i: (h,)),
)
REFERENCE_EAGLE3_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
                         "max_position_embeddings")  # methods/eagle3/engine.py Eagle3Config.REQUIRED (a test keeps them equal)
EAGLE3_KNOWN_EXTRA = ("d2t", "t2d", "embed_tokens.weight", "lm_head.weight")


# --- entry point ---------------------------------------------------------------------------------------


def check_draft(
    draft: Path, target: Path, *, engine: str = "reference", method: str | None = None, config_only: bool = False
) -> DraftCheck:
    """Check the draft directory ``draft`` against the target checkpoint directory ``target`` for ``engine``.

    Args:
        method: ``eagle3``, ``eagle``, ``medusa`` or ``draft_target``; None: told apart by
            :func:`detect_method` from config.json and tensor names.
        config_only: EAGLE-3: only the checks config.json answers (architecture, hidden size,
            vocabulary, auxiliary layers, rope), e.g. for a published head's config without its weights.

    Raises:
        DraftFileError: a directory missing or without a readable config.json (the CLI exits 2).
        ValueError: an unknown engine or method.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
    draft_files = CheckpointFiles.open(Path(draft), what="draft")
    target_files = CheckpointFiles.open(Path(target), what="target")
    method = method or detect_method(draft_files)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
    context = Context(draft_files, target_files, engine)
    malformed = _config_types(context)
    if malformed:  # the checks below would read them as numbers, lists and objects
        return DraftCheck(draft_files.path, target_files.path, engine, method, tuple(malformed))
    if config_only:
        if method != "eagle3":
            raise ValueError("config_only checks an EAGLE-3 head's config.json; give method eagle3")
        loader = EAGLE3_LOADERS[engine]
        findings = [f for check in EAGLE3_CONFIG_CHECKS for f in check(context, loader)]
    else:
        findings = [*_weights_readable(context), *CHECKS[method](context)]
    return DraftCheck(draft_files.path, target_files.path, engine, method, tuple(findings))


def detect_method(files: CheckpointFiles) -> str:
    """``medusa`` (``medusa_num_heads`` in config.json), ``eagle3`` (an EAGLE-3 architecture name, or
    ``midlayer.*`` / ``d2t`` tensors), ``eagle`` (``fc.weight`` of a head), else ``draft_target``."""
    config, names = files.config, files.tensors
    arch = _architecture(config) or ""
    if "medusa_num_heads" in config or arch.startswith("Medusa"):
        return "medusa"
    if "eagle3" in arch.lower() or any(n.startswith("midlayer.") or n == "d2t" for n in names):
        return "eagle3"
    if "fc.weight" in names:
        fc = names["fc.weight"].shape
        return "eagle3" if len(fc) == 2 and fc[1] == 3 * fc[0] else "eagle"
    return "draft_target"


@dataclass(frozen=True)
class Context:
    """The two checkpoints and the engine; ``target_*`` read from the target's config.json."""

    draft: CheckpointFiles
    target: CheckpointFiles
    engine: str
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return ENGINE_TITLES[self.engine]

    @property
    def target_hidden(self) -> int | None:
        return self.target.config.get("hidden_size")

    @property
    def target_vocab(self) -> int | None:
        return self.target.config.get("vocab_size")

    @property
    def target_layers(self) -> int | None:
        return self.target.config.get("num_hidden_layers")


def _architecture(config: dict[str, Any]) -> str | None:
    names = config.get("architectures")
    return names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None


def _config_types(c: Context) -> list[Finding]:
    """A fail finding per config.json whose keys have the wrong JSON type (:func:`config_type_problems`)."""
    findings = []
    for files, what in ((c.draft, "draft"), (c.target, "target")):
        problems = config_type_problems(files.config)
        if problems:
            findings.append(Finding("config.json", "fail", f"{what} {files.path / 'config.json'}: {'; '.join(problems)}",
                                    "write each value with the JSON type named (an engine's config class reads them so); "
                                    "then check again"))
    return findings


def _weights_readable(c: Context) -> list[Finding]:
    if c.draft.tensors:
        return [Finding("weights", "ok", f"{len(c.draft.tensors)} tensors in {', '.join(sorted({t.file.name for t in c.draft.tensors.values()}))}")]
    if c.draft.pickles:
        return [Finding("weights", "fail", f"only PyTorch pickles ({', '.join(c.draft.pickles)}); check-draft never unpickles",
                        "convert them to model.safetensors (safetensors.torch.save_file of the tensors loaded with "
                        "torch.load(weights_only=True)), then check again")]
    files = sorted(f.name for f in c.draft.path.glob("*.safetensors"))
    if files:
        return [Finding("weights", "fail", f"{', '.join(files)} hold(s) no tensors", "write the draft's weights into model.safetensors")]
    return [Finding("weights", "fail", "no *.safetensors file", "write the weights as model.safetensors")]


# --- EAGLE-3 ---------------------------------------------------------------------------------------------


def _eagle3(c: Context) -> list[Finding]:
    loader = EAGLE3_LOADERS[c.engine]
    checks: list[Callable[[Context, Eagle3Loader], list[Finding]]] = [
        _e3_architecture, _e3_model_type, _e3_hidden, _e3_vocab, _e3_draft_vocab, _e3_lm_head, _e3_d2t, _e3_layers,
        _e3_num_layers, _e3_tensors, _e3_norm, _e3_reference_keys, _rope, _embed_tokens, _dtype,
    ]
    return [f for check in checks for f in check(c, loader)]


def _e3_draft_vocab(c: Context, loader: Eagle3Loader) -> list[Finding]:
    del loader
    declared, vocab = c.draft.config.get("draft_vocab_size"), c.target_vocab
    if declared is not None and vocab is not None and not 0 < declared <= vocab:
        return [Finding("draft_vocab_size", "fail", f"draft_vocab_size={declared}, the target's vocabulary {vocab}",
                        f"a draft vocabulary is a subset of the target's: 1 .. {vocab} ids")]
    return [Finding("draft_vocab_size", "ok", f"{declared or vocab}" + ("" if declared in (None, vocab) else f" of {vocab}, mapped by d2t"))]


def _e3_architecture(c: Context, loader: Eagle3Loader) -> list[Finding]:
    arch = _architecture(c.draft.config)
    if loader.architectures is None:
        return [Finding("architecture", "ok", f"{arch}: {c.title} picks the draft class from eagle3_model_arch, not from config.json")]
    if arch in loader.architectures:
        return [Finding("architecture", "ok", f"{arch}")]
    return [Finding("architecture", "fail", f"config.json architectures {[arch] if arch else 'missing'}; {c.title} loads EAGLE-3 "
                    f"heads named {' or '.join(loader.architectures)}",
                    'set "architectures": ["LlamaForCausalLMEagle3"] in config.json')]


def _e3_model_type(c: Context, loader: Eagle3Loader) -> list[Finding]:
    model_type = c.draft.config.get("model_type")
    if model_type is not None or "speculators_config" in c.draft.config:
        return [Finding("model_type", "ok", f"{model_type}" if model_type else "none; speculators_config names the format")]
    if not loader.needs_model_type:
        fix = 'add "model_type": "llama" to config.json: vLLM refuses a head without it'
        if c.engine == "reference":
            return [Finding("model_type", "ok", f"absent: {c.title} does not read it")]
        return [Finding("model_type", "warn", f"absent: not tried with {c.title}; vLLM refuses such a config", fix)]
    return [Finding("model_type", "fail", f"config.json has no model_type: {c.title} parses the head's config with "
                    "transformers' AutoConfig, which refuses it (\"Unrecognized model in DIR. Should have a `model_type` "
                    "key in its config.json\")",
                    'add "model_type": "llama" to config.json (specbuild check-draft DRAFT --target TARGET --export DIR writes it)')]


def _e3_hidden(c: Context, loader: Eagle3Loader) -> list[Finding]:
    del loader
    hidden, target = c.draft.config.get("hidden_size"), c.target_hidden
    target_hidden = c.draft.config.get("target_hidden_size", hidden)
    fc = c.draft.tensors.get("fc.weight")
    problems = []
    narrower = c.engine != "reference" and "target_hidden_size" in c.draft.config and hidden != target_hidden
    if hidden is None:
        problems.append("config.json has no hidden_size")
    elif target is not None and hidden != target and not narrower:
        problems.append(f"hidden_size={hidden} but the target's is {target}" + (
            " (the reference engine runs heads of the target's width)" if c.engine == "reference" and target_hidden == target else ""))
    if target is not None and target_hidden is not None and target_hidden != target:
        problems.append(f"target_hidden_size={target_hidden} but the target's hidden_size is {target}")
    if fc is not None and hidden is not None and target_hidden is not None and fc.shape != (hidden, 3 * target_hidden):
        problems.append(f"fc.weight is {list(fc.shape)}, expected [{hidden}, {3 * target_hidden}] = [hidden, 3 * target hidden]")
    if problems:
        return [Finding("hidden size", "fail", "; ".join(problems), "train the head on this target (its hidden_size), or "
                        "check it against the target it was trained for")]
    detail = f"{hidden}" + (f" (fc.weight [{hidden}, {3 * target_hidden}])" if fc is not None else "")
    if narrower:
        detail += f": a head narrower than the target, fed {target_hidden}-wide target layers (target_hidden_size), with embed_tokens of its own"
    return [Finding("hidden size", "ok", detail)]


def _e3_vocab(c: Context, loader: Eagle3Loader) -> list[Finding]:
    del loader
    vocab, target = c.draft.config.get("vocab_size"), c.target_vocab
    if vocab is None:
        status = "ok" if c.engine == "reference" else "fail"
        return [Finding("vocab_size", status, f"config.json has no vocab_size; {c.title} "
                        + ("takes the target's" if status == "ok" else "falls back to LlamaConfig's 32000"),
                        "" if status == "ok" else f"add \"vocab_size\": {target} (the target's) to config.json")]
    if target is not None and vocab != target:
        return [Finding("vocab_size", "fail", f"vocab_size={vocab} but the target's is {target}",
                        f"set vocab_size to {target}; a smaller draft vocabulary is draft_vocab_size + d2t, not vocab_size")]
    return [Finding("vocab_size", "ok", f"{vocab}, as the target")]


def _draft_vocab(c: Context) -> int | None:
    """Rows of the draft's lm_head as config.json declares them: draft_vocab_size, else vocab_size."""
    return c.draft.config.get("draft_vocab_size") or c.draft.config.get("vocab_size") or c.target_vocab


def _e3_lm_head(c: Context, loader: Eagle3Loader) -> list[Finding]:
    head, hidden = c.draft.tensors.get("lm_head.weight"), c.draft.config.get("hidden_size")
    declared = c.draft.config.get("draft_vocab_size")
    expected = _draft_vocab(c)
    if c.engine == "sglang" and c.draft.config.get("tie_word_embeddings"):
        return [Finding("lm_head", "fail", "tie_word_embeddings is true: SGLang then uses the draft's embed_tokens "
                        "(vocab_size rows) as lm_head", 'set "tie_word_embeddings": false in config.json')]
    if c.engine == "trtllm" and c.draft.config.get("tie_word_embeddings"):
        return [Finding("lm_head", "fail", "tie_word_embeddings is true: TensorRT-LLM ties lm_head to the head's embed_tokens, "
                        "which an EAGLE-3 head shares with the target (None in the draft model), and skips loading lm_head "
                        "(modeling_utils.py DecoderModelForCausalLM)", 'set "tie_word_embeddings": false in config.json')]
    if head is None:
        return [_missing_lm_head(c, loader, declared)]
    rows, cols = head.shape if len(head.shape) == 2 else (None, None)
    if cols != hidden:
        return [Finding("lm_head", "fail", f"lm_head.weight is {list(head.shape)}, expected [draft vocab, {hidden}]",
                        "write lm_head.weight as [draft_vocab_size, hidden_size]")]
    if rows != expected:
        said = f"draft_vocab_size={declared}" if declared else f"no draft_vocab_size, so vocab_size={expected}"
        return [Finding("lm_head", "fail", f"lm_head.weight has {rows} rows but config.json says {said}: {c.title} "
                        f"builds a {expected}-row lm_head and the load fails (EAGLE#249)",
                        f'set "draft_vocab_size": {rows} in config.json (with d2t mapping its {rows} ids to target ids)')]
    return [Finding("lm_head", "ok", f"[{rows}, {cols}]" + ("" if rows == c.target_vocab else f": a draft vocabulary of {rows}"))]


def _missing_lm_head(c: Context, loader: Eagle3Loader, declared: int | None) -> Finding:
    shares = loader.lm_head_from_target == "always" or (loader.lm_head_from_target == "without_draft_vocab_size" and declared is None)
    if shares and (declared is None or declared == c.target_vocab):
        return Finding("lm_head", "ok", f"no lm_head.weight: {c.title} uses the target's")
    if shares:
        return Finding("lm_head", "fail", f"no lm_head.weight but draft_vocab_size={declared}: the target's lm_head has "
                       f"{c.target_vocab} rows", "write the head's own lm_head.weight, or remove draft_vocab_size")
    why = f"{c.title} leaves lm_head unloaded" + (" when config.json has draft_vocab_size" if declared is not None else "")
    return Finding("lm_head", "fail", f"no lm_head.weight: {why}",
                   "export the portable layout: specbuild check-draft DRAFT --target TARGET --export DIR "
                   "(writes the target's lm_head as lm_head.weight)")


def _e3_d2t(c: Context, loader: Eagle3Loader) -> list[Finding]:
    del loader
    head = c.draft.tensors.get("lm_head.weight")
    rows = head.shape[0] if head is not None and head.shape else _draft_vocab(c)
    vocab = c.target_vocab
    info = c.draft.tensors.get("d2t")
    findings = _t2d(c, rows)
    if info is None:
        if rows is not None and vocab is not None and rows != vocab:
            return [Finding("d2t", "fail", f"no d2t but the draft vocabulary has {rows} ids and the target {vocab}: "
                            "draft id i would be read as target id i", f"add d2t [{rows}] int64 with target_id = i + d2t[i]"), *findings]
        return [Finding("d2t", "ok", "none needed: the draft vocabulary is the target's"), *findings]
    if info.dtype in FLOAT_DTYPES or len(info.shape) != 1 or info.shape[0] != rows:
        return [Finding("d2t", "fail", f"d2t is {info.dtype} {list(info.shape)}, expected an integer tensor of length {rows} "
                        "(draft_vocab_size)", f"write d2t as int64 [{rows}] with target_id = i + d2t[i]"), *findings]
    targets = np.arange(rows) + c.draft.read("d2t")  # [Vd] target ids
    low, high = int(targets.min()), int(targets.max())
    if vocab is not None and (low < 0 or high >= vocab):
        bad = int(np.sum((targets < 0) | (targets >= vocab)))
        return [Finding("d2t", "fail", f"{bad} of {rows} draft ids map outside the target vocabulary [0, {vocab}) "
                        f"(i + d2t[i] spans [{low}, {high}])",
                        "d2t holds offsets: d2t[i] = target_id - i; rebuild it from the target ids of the draft vocabulary"), *findings]
    if len(np.unique(targets)) != rows:
        return [Finding("d2t", "warn", f"i + d2t[i] repeats target ids ({rows - len(np.unique(targets))} duplicates)",
                        "each draft id should map to its own target id"), *findings]
    if rows == vocab and np.any(targets != np.arange(rows)):
        moved = int(np.count_nonzero(targets != np.arange(rows)))
        detail = (f"the draft vocabulary is the target's ({rows}) but d2t moves {moved} ids: vLLM and SGLang apply it, "
                  "TensorRT-LLM creates d2t only when draft_vocab_size != vocab_size and reads draft id i as target id i")
        return [Finding("d2t", "fail" if c.engine == "trtllm" else "warn", detail,
                        "reorder lm_head.weight's rows into target order and drop d2t (or set all of it to 0)"), *findings]
    return [Finding("d2t", "ok", f"{rows} draft ids -> distinct target ids in [{low}, {high}]"), *findings]


def _t2d(c: Context, rows: int | None) -> list[Finding]:
    info = c.draft.tensors.get("t2d")
    if info is None:
        return []
    if info.shape != (c.target_vocab,) or rows is None:
        return [Finding("t2d", "warn", f"t2d is {list(info.shape)}, expected [{c.target_vocab}] (engines skip it)", "drop t2d or rewrite it")]
    marked = c.draft.read("t2d") != 0  # [V] bool
    count = int(np.count_nonzero(marked))
    if count != rows:
        return [Finding("t2d", "warn", f"t2d marks {count} target ids, the draft vocabulary has {rows} (engines skip t2d)",
                        "rewrite t2d from d2t: t2d[i + d2t[i]] = True")]
    d2t = c.draft.tensors.get("d2t")
    if d2t is not None and d2t.shape == (rows,) and d2t.dtype not in FLOAT_DTYPES:
        targets = np.arange(rows) + c.draft.read("d2t")
        inside = (targets >= 0) & (targets < len(marked))
        unmarked = int(np.count_nonzero(~inside)) + int(np.count_nonzero(~marked[targets[inside]]))
        if unmarked:
            return [Finding("t2d", "warn", f"{unmarked} of the {rows} target ids i + d2t[i] are not marked in t2d: d2t and "
                            "t2d disagree, and engines read d2t (does d2t hold target ids instead of offsets target_id - i?)",
                            "d2t[i] = target_id - i; then t2d[i + d2t[i]] = True")]
    return [Finding("t2d", "ok", f"marks {count} target ids (skipped by every engine)")]


NESTED_AUX_ONLY = ("reference", "sglang")  # read eagle_config.eagle_aux_hidden_state_layer_ids, not the top-level key


def _aux_ids(config: dict[str, Any], engine: str | None = None) -> list[int] | None:
    """The head's auxiliary layer ids as ``engine`` reads them: the reference engine and SGLang
    (``model_runner.py``) read ``eagle_config.eagle_aux_hidden_state_layer_ids`` only; otherwise the
    top-level key first. None: not given (the engine's default)."""
    top = config.get("eagle_aux_hidden_state_layer_ids")
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    ids = nested if engine in NESTED_AUX_ONLY else (top if top is not None else nested)
    return list(ids) if isinstance(ids, (list, tuple)) else None


def _e3_layers(c: Context, loader: Eagle3Loader) -> list[Finding]:
    return _aux_placement(c) + _e3_layer_ids(c, loader)


def _aux_placement(c: Context) -> list[Finding]:
    """A warning where the layer ids sit where this engine does not read them, or the two keys disagree."""
    top = c.draft.config.get("eagle_aux_hidden_state_layer_ids")
    nested = (c.draft.config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if top is not None and nested is None and c.engine in NESTED_AUX_ONLY:
        return [Finding("aux layer ids", "warn", f"eagle_aux_hidden_state_layer_ids {top} is at the top level: {c.title} reads "
                        "eagle_config.eagle_aux_hidden_state_layer_ids only and captures its default layers",
                        f'add "eagle_config": {{"eagle_aux_hidden_state_layer_ids": {top}}} to config.json')]
    if top is not None and nested is not None and list(top) != list(nested):
        return [Finding("aux layer ids", "warn", f"eagle_aux_hidden_state_layer_ids {top} at the top level, {nested} in eagle_config: "
                        f"{c.title} reads {_aux_ids(c.draft.config, c.engine)}; other engines read the other",
                        "keep one set of layer ids (the layers the head was trained on) in both places")]
    return []


def _e3_layer_ids(c: Context, loader: Eagle3Loader) -> list[Finding]:
    ids, layers = _aux_ids(c.draft.config, c.engine), c.target_layers
    if layers is None:
        return [Finding("aux layer ids", "skip", "the target's config.json has no num_hidden_layers")]
    if ids is None:
        if layers <= 5 and c.engine in ("reference", "trtllm"):
            return [Finding("aux layer ids", "fail", f"none given and the target has {layers} layers: the default "
                            "(1, L//2 - 1, L - 4) needs more than 5", "name three layers in eagle_config.eagle_aux_hidden_state_layer_ids")]
        return [Finding("aux layer ids", "ok", f"{c.title}'s default for {layers} layers")]
    if len(ids) != 3 or not all(isinstance(i, int) and 0 <= i < layers for i in ids):
        return [Finding("aux layer ids", "fail", f"eagle_aux_hidden_state_layer_ids {ids} are not three layers of a "
                        f"{layers}-layer target", f"name three layer ids in [0, {layers})")]
    if loader.aux_ids_count_inputs:
        return [Finding("aux layer ids", "warn", f"{ids} (layer outputs, as TensorRT-LLM and SGLang count them); vLLM passes "
                        "them unchanged to a target that captures layer inputs",
                        f"for vLLM write \"eagle_aux_hidden_state_layer_ids\": {[i + 1 for i in ids]} at the top level of config.json")]
    if c.engine == "trtllm":
        return [Finding("aux layer ids", "warn", f"{ids}: TensorRT-LLM captures speculative_config.eagle3_layers_to_capture",
                        f"set eagle3_layers_to_capture: {ids} in the LLM API options")]
    return [Finding("aux layer ids", "ok", f"{ids} of {layers} layers")]


def _e3_num_layers(c: Context, loader: Eagle3Loader) -> list[Finding]:
    del loader
    layers = c.draft.config.get("num_hidden_layers")
    if layers is None:
        if c.engine == "reference":
            return [Finding("num_hidden_layers", "ok", f"absent: {c.title} reads one decoder layer")]
        return [Finding("num_hidden_layers", "fail", f"config.json has no num_hidden_layers: {c.title} builds the head from "
                        "LlamaConfig, whose default is 32 decoder layers, and loads one", 'add "num_hidden_layers": 1 to config.json')]
    if layers == 1:
        return [Finding("num_hidden_layers", "ok", "1 decoder layer")]
    if c.engine in ("reference", "sglang"):
        return [Finding("num_hidden_layers", "fail", f"num_hidden_layers={layers}: {c.title} runs EAGLE-3 heads of one decoder layer",
                        "use a one-layer head (EAGLE-3's layout), or serve this one with TensorRT-LLM or vLLM")]
    return [Finding("num_hidden_layers", "warn", f"num_hidden_layers={layers}: {c.title} builds {layers} decoder layers; "
                    "check-draft checks the tensors of one-layer heads only", "check the layers' names against the engine's loader")]


def _e3_norm(c: Context, loader: Eagle3Loader) -> list[Finding]:
    del loader
    if not c.draft.config.get("norm_before_residual"):
        return []
    if c.engine == "vllm":
        return [Finding("norm_before_residual", "ok", "true: vLLM takes the residual after hidden_norm, as the head was trained")]
    status = "fail" if c.engine == "reference" else "warn"
    return [Finding("norm_before_residual", status, f"true, but {c.title} takes the residual before hidden_norm whatever the "
                    "config says: the head drafts other tokens than it was trained to (lossless, lower acceptance)",
                    "serve this head with vLLM, or retrain it without norm_before_residual")]


def _e3_reference_keys(c: Context, loader: Eagle3Loader) -> list[Finding]:
    del loader
    if c.engine != "reference":
        return []
    missing = [k for k in REFERENCE_EAGLE3_KEYS if c.draft.config.get(k) is None]
    if missing:
        values = {k: c.target.config.get(k) for k in missing if c.target.config.get(k) is not None}
        return [Finding("config keys", "fail", f"config.json lacks {', '.join(missing)}: {c.title} reads them from the head's config",
                        f"add {json.dumps(values)[1:-1] or ', '.join(missing)} (the target's values) to config.json")]
    return []


def _e3_tensors(c: Context, loader: Eagle3Loader) -> list[Finding]:
    cfg = c.draft.config
    hidden, inter = cfg.get("hidden_size"), cfg.get("intermediate_size")
    heads, kv_heads = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads", cfg.get("num_attention_heads"))
    if None in (hidden, inter, heads):
        return [Finding("tensors", "fail", "config.json lacks hidden_size, intermediate_size or num_attention_heads",
                        "write a LlamaConfig-style config.json")]
    if cfg.get("num_hidden_layers", 1) != 1 and c.engine in ("trtllm", "vllm"):
        return [Finding("tensors", "skip", f"a {cfg['num_hidden_layers']}-layer head: names and shapes not checked")]
    head_dim = cfg.get("head_dim") or hidden // heads
    names = set(c.draft.tensors)
    prefix = "midlayer." if any(n.startswith("midlayer.") for n in names) or not any(n.startswith("layers.0.") for n in names) else "layers.0."
    expected = {f"{prefix}{name}": shape(hidden, heads * head_dim, kv_heads * head_dim, inter) for name, shape in EAGLE3_LAYER_SHAPES}
    expected["norm.weight"] = (hidden,)
    expected["fc.weight"] = (hidden, 3 * (cfg.get("target_hidden_size") or hidden))  # built by every engine for 3 captured layers
    biases = {f"{prefix}self_attn.{p}_proj.bias": (n,) for p, n in
              (("q", heads * head_dim), ("k", kv_heads * head_dim), ("v", kv_heads * head_dim), ("o", hidden))}
    if cfg.get("attention_bias") and c.engine != "reference":  # LlamaConfig.attention_bias: loaders build and load them
        expected |= {n: shape for n, shape in biases.items() if n in names}
    unknown = sorted(names - set(expected) - set(EAGLE3_KNOWN_EXTRA))
    if unknown and cfg.get("attention_bias") and c.engine == "reference" and set(unknown) <= set(biases):
        return [Finding("tensors", "fail", f"attention biases ({_few(unknown)}): {c.title}'s EAGLE-3 head has none",
                        "serve this head with TensorRT-LLM, vLLM or SGLang (they load attention_bias heads)")]
    problems = _tensor_problems(c, expected, EAGLE3_KNOWN_EXTRA)
    if problems:
        return [Finding("tensors", "fail", problems,
                        "write fc, midlayer.* (one decoder layer over [2 * hidden]), norm, lm_head, d2t as EAGLE-3 names them")]
    if prefix == "layers.0." and loader.midlayer_only:
        return [Finding("tensors", "fail", f"layers.0.* names: {c.title} loads midlayer.* only",
                        "rename layers.0.* to midlayer.* (specbuild check-draft --export DIR does)")]
    return [Finding("tensors", "ok", f"fc, {prefix}* (10), norm: names and shapes")]


def _tensor_problems(c: Context, expected: dict[str, tuple[int, ...]], extra: tuple[str, ...]) -> str:
    """The draft's tensors against ``expected`` (name -> shape), ``extra`` names allowed besides: ``"missing ..;
    shapes ..; unexpected .."``, or ``""`` when they agree."""
    names = set(c.draft.tensors)
    missing = sorted(set(expected) - names)
    wrong = sorted(f"{n} {list(c.draft.tensors[n].shape)} != {list(s)}" for n, s in expected.items() if n in names and c.draft.tensors[n].shape != s)
    unknown = sorted(names - set(expected) - set(extra))
    parts = [f"missing {_few(missing)}" if missing else "", f"shapes {_few(wrong)}" if wrong else "",
             f"unexpected {_few(unknown)}" if unknown else ""]
    return "; ".join(p for p in parts if p)


def _few(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" (+{len(items) - n} more)" if len(items) > n else "")


# --- shared checks -------------------------------------------------------------------------------------


def _rope_settings(config: dict[str, Any]) -> dict[str, Any]:
    """``rope_theta``, ``rope_scaling`` (None for the default rope; transformers 5's ``rope_parameters``
    read as the same) and ``max_position_embeddings`` of a config.json."""
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or None
    theta = config.get("rope_theta") or (scaling or {}).get("rope_theta") or 10000.0
    if scaling is not None:
        scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
        if scaling.get("rope_type", scaling.get("type", "default")) == "default":
            scaling = None
    return {"rope_theta": float(theta), "rope_scaling": scaling, "max_position_embeddings": config.get("max_position_embeddings")}


def _rope(c: Context, loader: Any = None) -> list[Finding]:
    del loader
    draft, target = _rope_settings(c.draft.config), _rope_settings(c.target.config)
    differ = [k for k in draft if draft[k] != target[k]]
    if not differ:
        return [Finding("rope", "ok", f"rope_theta={draft['rope_theta']:g}, rope_scaling and max_position_embeddings as the target")]
    detail = "; ".join(f"{k}: draft {draft[k]!r}, target {target[k]!r}" for k in differ)
    return [Finding("rope", "warn", f"{detail}. Every engine runs the draft's attention with the draft's own settings",
                    "fine if the draft was trained with them (EAGLE's public heads are); otherwise copy the target's values")]


def _embed_tokens(c: Context, loader: Eagle3Loader | None = None) -> list[Finding]:
    name = c.draft.find("embed_tokens.weight")
    hidden, vocab = c.draft.config.get("hidden_size"), c.target_vocab
    if (loader is not None and c.engine != "reference" and "target_hidden_size" in c.draft.config
            and hidden is not None and hidden != c.target_hidden):  # a narrower head embeds tokens itself
        shape = None if name is None else c.draft.tensors[name].shape
        if shape == (vocab, hidden):
            return [Finding("embed_tokens", "ok", f"{name} {list(shape)}: the head's own, {c.title} uses it (narrower than the target)")]
        found = "no embed_tokens.weight" if name is None else f"{name} is {list(shape)}"
        return [Finding("embed_tokens", "fail", f"{found}: a head of hidden_size {hidden}, narrower than the target's "
                        f"{c.target_hidden}, embeds tokens with its own [{vocab}, {hidden}] embed_tokens, which {c.title} "
                        "otherwise leaves random", f"write the head's trained embed_tokens.weight [{vocab}, {hidden}]")]
    if name is None:
        return [Finding("embed_tokens", "ok", "absent: the target's are used")]
    own = loader.uses_own_embed_tokens if loader is not None else c.engine == "vllm"
    hidden_in = c.draft.config.get("target_hidden_size", c.draft.config.get("hidden_size"))
    own = own or (loader is not None and c.engine in ("trtllm", "sglang") and hidden_in != c.draft.config.get("hidden_size"))
    target_name = c.target.find("embed_tokens.weight", "wte.weight")
    shape = c.draft.tensors[name].shape
    if target_name is None:
        return [Finding("embed_tokens", "skip", "the target has no safetensors embed_tokens to compare with")]
    target_shape = c.target.tensors[target_name].shape
    if shape != target_shape:
        status = "fail" if own else "warn"
        return [Finding("embed_tokens", status, f"{name} is {list(shape)}, the target's {list(target_shape)}"
                        + ("" if own else f" (ignored by {c.title})"), f"remove {name}, or write the target's {list(target_shape)}")]
    equal, max_diff = _same_rows(c.draft, name, c.target, target_name)
    if equal:
        return [Finding("embed_tokens", "ok", f"equal to the target's ({name})")]
    detail = f"{name} differs from the target's embeddings (max |diff| {max_diff:.3g}): random or retrained"
    if own:
        return [Finding("embed_tokens", "fail", f"{detail}; {c.title} uses the draft's own when the file has them (TorchSpec#38)",
                        f"remove {name} from the checkpoint, or write the target's embed_tokens there")]
    return [Finding("embed_tokens", "warn", f"{detail}; ignored by {c.title} (it uses the target's), used by vLLM",
                    f"remove {name} before serving with vLLM")]


def _same_rows(a: CheckpointFiles, a_name: str, b: CheckpointFiles, b_name: str) -> tuple[bool, float]:
    """Whether two ``[V, H]`` tensors are equal up to the coarser dtype's rounding, read in row blocks;
    and the largest absolute difference."""
    rows = a.tensors[a_name].shape[0]
    coarse = {a.tensors[a_name].dtype, b.tensors[b_name].dtype} & {"F16", "BF16", "F8_E4M3", "F8_E5M2"}
    rtol = 1e-2 if coarse else 1e-6
    worst, equal = 0.0, True
    for start in range(0, rows, EMBED_ROWS_PER_READ):
        block = slice(start, min(rows, start + EMBED_ROWS_PER_READ))
        x, y = a.read(a_name, block), b.read(b_name, block)  # [rows, H] float32 each
        diff = np.abs(x - y)
        worst = max(worst, float(diff.max(initial=0.0)))
        equal = equal and bool(np.all(diff <= rtol * np.abs(y) + rtol * 1e-3))
    return equal, worst


def _dtype(c: Context, loader: Any = None) -> list[Finding]:
    del loader
    weights = {n: t.dtype for n, t in c.draft.tensors.items() if n not in ("d2t", "t2d")}
    if not weights:
        return []
    not_float = sorted(n for n, d in weights.items() if d not in FLOAT_DTYPES)
    if not_float:
        return [Finding("dtype", "fail", f"non-float weights: {_few([f'{n} {weights[n]}' for n in not_float])}",
                        "write floating-point weights (quantized drafts need the engine's quantization config)")]
    kinds = sorted({torch_dtype_name(d) for d in weights.values()})
    target = c.target.config.get("torch_dtype") or c.target.config.get("dtype")
    declared = c.draft.config.get("torch_dtype") or c.draft.config.get("dtype")
    notes = []
    if len(kinds) > 1:
        notes.append(f"mixed weight dtypes {kinds}")
    if target and kinds != [target]:
        notes.append(f"weights {'/'.join(kinds)}, target {target}: the engine casts the draft to the serving dtype")
    if declared and kinds != [declared]:
        notes.append(f"config.json torch_dtype {declared} but the weights are {'/'.join(kinds)}")
    if notes:
        return [Finding("dtype", "warn", "; ".join(notes), "write the draft in the target's dtype")]
    return [Finding("dtype", "ok", f"{kinds[0]}, as the target")]


# --- EAGLE-1/2, Medusa, draft model ----------------------------------------------------------------------


EAGLE3_CONFIG_CHECKS = (_e3_architecture, _e3_model_type, _e3_hidden, _e3_vocab, _e3_draft_vocab, _e3_layers, _e3_num_layers,
                        _e3_norm, _rope)  # config.json only
EAGLE_NAMES = ("LlamaForCausalLM", "EagleLlamaForCausalLM", "LlamaForCausalLMEagle")


def _eagle(c: Context) -> list[Finding]:
    arch = _architecture(c.draft.config)
    findings = [Finding("architecture", "ok", f"{arch}") if arch in EAGLE_NAMES else
                Finding("architecture", "fail", f"architectures {[arch] if arch else 'missing'}; EAGLE-1/2 heads are named "
                        f"{' or '.join(EAGLE_NAMES)}", 'set "architectures": ["LlamaForCausalLM"] (an EAGLE-3 head: --method eagle3)')]
    hidden, target = c.draft.config.get("hidden_size"), c.target_hidden
    fc = c.draft.tensors.get("fc.weight")
    problems = [f"hidden_size={hidden} but the target's is {target}"] if hidden != target else []
    if fc is not None and hidden is not None and fc.shape != (hidden, 2 * hidden):
        problems.append(f"fc.weight is {list(fc.shape)}, expected [{hidden}, {2 * hidden}]")
    if fc is None:
        problems.append("no fc.weight")
    findings.append(Finding("hidden size", "fail", "; ".join(problems), "train the head on this target") if problems
                    else Finding("hidden size", "ok", f"{hidden} (fc.weight [{hidden}, {2 * hidden}])"))
    findings += _eagle_tensors(c) + _vocab_size(c) + _rope(c) + _embed_tokens(c) + _dtype(c)
    return findings


EAGLE_LAYER_SHAPES = (  # name under layers.{n}. -> shape from (H, q, kv, I); input_layernorm from the second layer on
    ("self_attn.q_proj.weight", lambda h, q, kv, i: (q, h)), ("self_attn.k_proj.weight", lambda h, q, kv, i: (kv, h)),
    ("self_attn.v_proj.weight", lambda h, q, kv, i: (kv, h)), ("self_attn.o_proj.weight", lambda h, q, kv, i: (h, q)),
    ("mlp.gate_proj.weight", lambda h, q, kv, i: (i, h)), ("mlp.up_proj.weight", lambda h, q, kv, i: (i, h)),
    ("mlp.down_proj.weight", lambda h, q, kv, i: (h, i)), ("post_attention_layernorm.weight", lambda h, q, kv, i: (h,)),
)


def _eagle_tensors(c: Context) -> list[Finding]:
    """EAGLE-1/2 tensor names and shapes as the format holds them (methods/eagle/engine.py
    ``EagleConfig.expected_shapes``: fc, then ``num_hidden_layers`` decoder layers ``layers.{n}.*``)."""
    cfg = c.draft.config
    if not c.draft.tensors:
        return []  # the weights check names what is there instead
    hidden, inter, heads, layers = (cfg.get(k) for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers"))
    if None in (hidden, inter, heads, layers):
        absent = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers") if cfg.get(k) is None]
        return [Finding("tensors", "fail", f"config.json lacks {', '.join(absent)}", "write a LlamaConfig-style config.json")]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    expected = {"fc.weight": (hidden, 2 * hidden)}
    for n in range(layers):
        expected |= {f"layers.{n}.{name}": shape(hidden, heads * head_dim, kv_heads * head_dim, inter) for name, shape in EAGLE_LAYER_SHAPES}
        if n > 0:
            expected[f"layers.{n}.input_layernorm.weight"] = (hidden,)
    names = set(c.draft.tensors)
    if "fc.bias" in names:
        expected["fc.bias"] = (hidden,)
    problems = _tensor_problems(c, expected, ("embed_tokens.weight", "model.embed_tokens.weight"))
    if problems:
        return [Finding("tensors", "fail", f"{problems} (num_hidden_layers={layers})",
                        "write fc and layers.{n}.* (num_hidden_layers decoder layers over hidden_size) as EAGLE names them")]
    return [Finding("tensors", "ok", f"fc, layers.0..{layers - 1}.*: names and shapes")]


def _vocab_size(c: Context) -> list[Finding]:
    vocab, target = c.draft.config.get("vocab_size"), c.target_vocab
    head = c.draft.tensors.get(c.draft.find("lm_head.weight") or "")
    if vocab is not None and target is not None and vocab != target:
        return [Finding("vocab_size", "fail", f"vocab_size={vocab} but the target's is {target}",
                        "the draft must use the target's vocabulary (same tokenizer)")]
    if head is not None and target is not None and head.shape[0] != target:
        return [Finding("lm_head", "fail", f"lm_head.weight has {head.shape[0]} rows, the target's vocabulary {target}",
                        "the draft must predict over the target's vocabulary")]
    return [Finding("vocab_size", "ok", f"{vocab or target}, as the target")]


def _medusa(c: Context) -> list[Finding]:
    if c.engine in ("vllm", "sglang"):
        return [Finding("layout", "skip", f"specbuild knows the TensorRT-LLM / FasterDecoding Medusa layout only; "
                        f"{c.title}'s Medusa loader was not checked")]
    heads = c.draft.config.get("medusa_num_heads")
    layers = c.draft.config.get("medusa_num_layers", 1)
    hidden, vocab = c.target_hidden, c.target_vocab
    findings = []
    missing = [f"{h}.{layers}.weight" for h in range(heads or 0) if f"{h}.{layers}.weight" not in c.draft.tensors]
    findings.append(Finding("heads", "fail" if not heads or missing else "ok",
                            f"medusa_num_heads={heads}, medusa_num_layers={layers}" + (f"; missing {_few(missing)}" if missing else ""),
                            "" if heads and not missing else "write medusa_num_heads and one {h}.{L}.weight per head"))
    bad = [f"{n} {list(t.shape)}" for n, t in c.draft.tensors.items()
           if (n.endswith(".linear.weight") and t.shape != (hidden, hidden))
           or (n.count(".") == 2 and n.endswith(f".{layers}.weight") and t.shape != (vocab, hidden))]
    findings.append(Finding("hidden size", "fail", f"shapes {_few(bad)}; target hidden {hidden}, vocabulary {vocab}",
                            "train the heads on this target") if bad else
                    Finding("hidden size", "ok", f"{hidden}; lm heads [{vocab}, {hidden}]"))
    return findings + _dtype(c)


def _draft_model(c: Context) -> list[Finding]:
    arch = _architecture(c.draft.config) or ""
    findings = [Finding("architecture", "ok", arch) if arch.endswith("ForCausalLM") else
                Finding("architecture", "fail", f"architectures {[arch] if arch else 'missing'}: a draft model is a *ForCausalLM",
                        "give a causal language model checkpoint")]
    findings += _whole_model(c) + _vocab_size(c) + _tokenizer(c) + _dtype(c)
    return findings


def _whole_model(c: Context) -> list[Finding]:
    """A draft model is a whole causal LM: token embeddings and num_hidden_layers decoder layers (a head's
    files, e.g. an EAGLE head checked with --method draft_target, have neither)."""
    names = set(c.draft.tensors)
    if not names:
        return []  # the weights check names what is there instead
    embeds = any(n.endswith(("embed_tokens.weight", "wte.weight", "embed_in.weight", "word_embeddings.weight", "tok_embeddings.weight"))
                 for n in names)
    layers = next((c.draft.config[k] for k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
                   if isinstance(c.draft.config.get(k), int)), None)
    found = {int(m.group(1)) for n in names for m in [re.search(r"\.(\d+)\.", n)] if m}  # model.decoder.layers.3.x -> 3
    if not embeds or not found or (layers is not None and len(found) < layers):
        looks = detect_method(c.draft)
        return [Finding("weights", "fail", f"not a whole causal LM: token embeddings {'present' if embeds else 'missing'}, "
                        f"{len(found)} of num_hidden_layers={layers} decoder layers" + (f"; the files look like {looks} weights" if looks != "draft_target" else ""),
                        "give a complete draft model checkpoint" + (f", or check this one with --method {looks}" if looks != "draft_target" else ""))]
    return [Finding("layers", "ok", f"embeddings and {len(found)} decoder layers")]


def _tokenizer(c: Context) -> list[Finding]:
    from specbuild.util.tokenizer_identity import read_token_table, token_table_difference

    draft, target = read_token_table(c.draft.path), read_token_table(c.target.path)
    if draft is None or target is None:
        return [Finding("tokenizer", "skip", "no tokenizer.json on one side")]
    difference = token_table_difference(target, draft)
    if difference is not None:
        return [Finding("tokenizer", "fail", f"differs from the target's: {difference}", "use a draft trained with the target's tokenizer")]
    return [Finding("tokenizer", "ok", "same tokens at the same ids")]


CHECKS: dict[str, Callable[[Context], list[Finding]]] = {
    "eagle3": _eagle3, "eagle": _eagle, "medusa": _medusa, "draft_target": _draft_model,
}


def plan_line(draft: Path, target: Path, engine: str, method: str) -> str:
    """One plan line: ``check     draft <dir> for <engine>: 9 checks: 9 ok`` (the failures named), or why not.

    Never raises: an unreadable directory is reported in the line.
    """
    try:
        result = check_draft(draft, target, engine=engine, method=method)
    except Exception as exc:  # noqa: BLE001 - a plan line reports any failure instead of stopping the plan
        return f"check     draft {draft}: not checked ({exc})"
    return f"check     draft {draft} for {ENGINE_TITLES[engine]}: {result.summary()}" + (
        "" if result.ok else f"; run: specbuild check-draft {draft} --target {target} --engine {engine}")


def dumps(result: DraftCheck) -> str:
    return json.dumps(result.to_json(), indent=2)


# --- the plan's line -----------------------------------------------------------------------------------


def recipe_check_line(loaded) -> str | None:
    """``specbuild plan``'s line for a recipe with a draft: the check's summary for the engine the recipe
    builds (``reference``, else ``trtllm``) when the draft and the target are local directories, else
    when and how it runs. None for a recipe without draft files. Well under a second (a recipe that
    trains reads its training sources: :func:`~specbuild.builder.train_stage.reuses_draft`); never raises."""
    from specbuild.builder.train_stage import reuses_draft

    spec = loaded.recipe.speculation
    value = spec.weights_path
    if value is None or spec.method not in METHODS:
        return None
    engine = "reference" if loaded.recipe.build.backend == "reference" else "trtllm"
    draft = loaded.resolve_path(value)
    command = f"specbuild check-draft DIR --target {loaded.recipe.target.checkpoint} --engine {engine}"
    if loaded.recipe.train is not None and not reuses_draft(loaded):  # the train stage writes it first
        return f"check     draft: runs after training (train-draft): {command.replace('DIR', str(draft))}"
    if not draft.is_dir():
        return f"check     draft: runs once {value} is a local directory: {command}"
    target = _local_target(loaded)
    if target is None:
        return f"check     draft {draft}: runs once the target is a local directory (converted or downloaded): {command.replace('DIR', str(draft))}"
    return plan_line(draft, target, engine, spec.method)


def _local_target(loaded) -> Path | None:
    """The target's checkpoint directory if it is on disk already (a packaged model once converted)."""
    from specbuild.util.checkpoints import CheckpointError, locate_checkpoint
    from specbuild.cache import cache_dir

    target = loaded.recipe.target
    try:
        source = locate_checkpoint(target.checkpoint, base_dir=loaded.path.parent, revision=target.revision)
    except CheckpointError:
        return None
    if source.kind != "packaged":
        return source.path
    converted = cache_dir() / "checkpoints" / f"{source.packaged.name}-{source.fingerprint()}"
    return converted if (converted / "config.json").is_file() else None
