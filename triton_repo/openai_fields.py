"""Every request field the OpenAI front knows, and what it does with each: one table, checked and documented.

A field that would change the output and that the deployment cannot honour is refused with a 400 that
names the field, the value sent and what is accepted, never ignored. Three kinds:

- ``honoured``: the front or the engine does what the field asks (``temperature``, ``top_k``, ``stop``, ...).
- ``ignored``: accepted with any value, because it cannot change the output (``user``, ``metadata``).
- ``neutral``: accepted only at the values listed, those that ask for nothing (``frequency_penalty: 0``,
  ``response_format: {"type": "text"}``); any other value is refused.

A field the table does not name is refused as unknown (``extra="forbid"``, as trtllm-serve's request
models in ``tensorrt_llm/serve/openai_protocol.py``; vLLM's ``OpenAIBaseModel`` instead accepts and
ignores it with a logged warning, which here could change an answer unnoticed).

The field names are OpenAI's Completions and Chat Completions API and vLLM's extensions
(``vllm/entrypoints/openai/protocol.py``: ``CompletionRequest``, ``ChatCompletionRequest``). The engine's
sampling parameters are the ``ensemble`` inputs of ``docs/interface.md``: ``temperature``, ``top_k``,
``top_p``, ``seed``, ``end_id`` and ``num_draft_tokens``; there are no penalties, no minimum length, no
extra stop ids, no log probabilities and no guided decoding.

``python -m specbuild.triton_repo.openai_fields docs/openai.md`` rewrites the table in that file.
"""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Route = Literal["completions", "chat"]
BOTH: tuple[Route, ...] = ("completions", "chat")
CHAT: tuple[Route, ...] = ("chat",)
COMPLETIONS: tuple[Route, ...] = ("completions",)


@dataclass(frozen=True)
class RequestField:
    """One request field and what the front does with it.

    Attributes:
        name: the field's JSON name.
        handling: ``honoured``, ``ignored`` or ``neutral`` (see the module docstring).
        note: what the front does, or why a value other than the neutral ones is refused.
        accepted: for ``neutral``: the values accepted (``None`` = the field sent as null);
            booleans match only booleans, numbers match equal numbers (0 and 0.0).
        routes: the routes that take it.
    """

    name: str
    handling: Literal["honoured", "ignored", "neutral"]
    note: str
    accepted: tuple[Any, ...] = (None,)
    routes: tuple[Route, ...] = BOTH

    def allows(self, value: Any) -> bool:
        """Whether ``value`` is accepted (always, unless the field is ``neutral``)."""
        return self.handling != "neutral" or any(_same(value, ok) for ok in self.accepted)


class RefusedField(ValueError):
    """A field the front refuses; ``param`` names it (the 400's ``param``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


NO_LOGPROBS = ("specbuild's deployments return no log probabilities (the interface has no output_log_probs "
               "tensor); per token this server returns the ids (return_token_ids: true)")
NO_PENALTY = "the engine has no penalties (docs/interface.md: temperature, top_k, top_p, seed only)"
NO_GUIDED = "the engine has no guided (structured) decoding"
NO_TOOLS = "the front parses no tool calls"

_H, _I, _N = "honoured", "ignored", "neutral"

FIELDS: tuple[RequestField, ...] = (
    # --- what the request is -----------------------------------------------------------------------
    RequestField("model", _H, "must be the served name (404 otherwise); omitted = the served model"),
    RequestField("prompt", _H, "a string, a list of one string, or token ids (a list of ints, or a list of one such list): "
                 "the ids are decoded and sent as text, and refused when the deployment's tokenizer would not split "
                 "that text into the same ids", routes=COMPLETIONS),
    RequestField("messages", _H, "through the tokenizer's chat template; text content parts only", routes=CHAT),
    RequestField("max_tokens", _H, "most tokens to generate (default: chat the rest of the context, as OpenAI and vLLM; completions 16)"),
    RequestField("max_completion_tokens", _H, "chat's newer name for max_tokens; wins when both are sent", routes=CHAT),
    RequestField("stream", _H, "server-sent events; one per decoding step on a decoupled deployment, else one"),
    RequestField("stream_options", _H, "include_usage honoured; continuous_usage_stats: false only"),
    RequestField("stop", _H, "a string or a list: the text is cut before the first one (the front applies them)"),
    RequestField("n", _N, "one choice per request: send one request per choice", (None, 1)),
    # --- sampling (the engine's ensemble inputs) -----------------------------------------------------
    RequestField("temperature", _H, "default 1.0 as OpenAI; 0 = greedy (then top_k, top_p and seed have no effect)"),
    RequestField("top_p", _H, "nucleus sampling, in (0, 1]"),
    RequestField("top_k", _H, "vLLM's: top-k sampling; 0 or -1 = off"),
    RequestField("seed", _H, "the engine's sampling seed: the same seed gives the same tokens; omitted = a fresh random "
                 "seed per request, as OpenAI and vLLM (sampled answers differ); the Triton interface keeps TensorRT-LLM's "
                 "default there"),
    RequestField("ignore_eos", _H, "vLLM's: generate max_tokens tokens (Triton end_id = -1)"),
    RequestField("return_token_ids", _H, "vLLM's (>= 0.10.2): token_ids per choice, prompt_token_ids"),
    RequestField("num_draft_tokens", _H, "specbuild's: draft length of this request; 0 = speculation off"),
    RequestField("frequency_penalty", _N, NO_PENALTY, (None, 0)),
    RequestField("presence_penalty", _N, NO_PENALTY, (None, 0)),
    RequestField("repetition_penalty", _N, NO_PENALTY, (None, 1)),
    RequestField("length_penalty", _N, "no beam search", (None, 1)),
    RequestField("min_p", _N, "the engine samples with top_k and top_p only", (None, 0)),
    RequestField("min_tokens", _N, "the engine has no minimum length; accepted at any value <= max_tokens with ignore_eos: true "
                 "(then every answer is exactly max_tokens long)", (None, 0)),
    RequestField("logit_bias", _N, "the engine takes no logit bias", (None, {})),
    RequestField("allowed_token_ids", _N, "the engine takes no token restriction", (None,)),
    RequestField("bad_words", _N, "the engine takes no banned words", (None, [])),
    RequestField("stop_token_ids", _N, "the engine stops on one end token, the tokenizer's (use stop strings, or "
                 "ignore_eos)", (None, [])),
    RequestField("include_stop_str_in_output", _N, "the stop string is never returned (OpenAI's rule)", (None, False)),
    RequestField("skip_special_tokens", _N, "the deployment's postprocessing always skips special tokens", (None, True)),
    RequestField("spaces_between_special_tokens", _N, "special tokens are skipped", (None, True)),
    RequestField("use_beam_search", _N, "no beam search", (None, False)),
    RequestField("best_of", _N, "one sequence per request", (None, 1)),
    RequestField("logits_processors", _N, "the engine runs no custom logits processors", (None, [])),
    RequestField("truncate_prompt_tokens", _N, "prompts are never truncated (a prompt over the limit is refused)", (None,)),
    RequestField("priority", _N, "requests are served in arrival order", (None, 0)),
    # --- output extras --------------------------------------------------------------------------------
    RequestField("logprobs", _N, NO_LOGPROBS, (None, False)),
    RequestField("top_logprobs", _N, NO_LOGPROBS, (None, 0)),
    RequestField("prompt_logprobs", _N, NO_LOGPROBS, (None,)),
    RequestField("return_tokens_as_token_ids", _N, "send return_token_ids: true for the ids", (None, False)),
    RequestField("echo", _N, "the prompt is never repeated in the answer", (None, False)),
    RequestField("suffix", _N, "no insertion (fill-in-the-middle)", (None, ""), COMPLETIONS),
    RequestField("add_special_tokens", _N, "the deployment's preprocessing model decides", (None,)),
    # --- structured output and tools ------------------------------------------------------------------
    RequestField("response_format", _N, NO_GUIDED, (None, {"type": "text"})),
    RequestField("structured_outputs", _N, NO_GUIDED, (None,)),
    RequestField("guided_json", _N, NO_GUIDED, (None,)),
    RequestField("guided_regex", _N, NO_GUIDED, (None,)),
    RequestField("guided_choice", _N, NO_GUIDED, (None,)),
    RequestField("guided_grammar", _N, NO_GUIDED, (None,)),
    RequestField("guided_decoding_backend", _I, "no guided decoding to configure"),
    RequestField("guided_whitespace_pattern", _I, "no guided decoding to configure"),
    RequestField("tools", _N, NO_TOOLS, (None, []), CHAT),
    RequestField("tool_choice", _N, NO_TOOLS + "; without tools \"auto\" and \"none\" ask for nothing", (None, "none", "auto"), CHAT),
    RequestField("parallel_tool_calls", _I, "without tools it asks for nothing", routes=CHAT),
    RequestField("functions", _N, NO_TOOLS, (None, []), CHAT),
    RequestField("function_call", _N, NO_TOOLS, (None, "none", "auto"), CHAT),
    # --- chat templating --------------------------------------------------------------------------------
    RequestField("add_generation_prompt", _N, "the assistant turn is always opened", (None, True), CHAT),
    RequestField("continue_final_message", _N, "the assistant turn is always a new one", (None, False), CHAT),
    RequestField("chat_template", _N, "the tokenizer's own template is used", (None,), CHAT),
    RequestField("chat_template_kwargs", _N, "the template gets messages and add_generation_prompt only", (None, {}), CHAT),
    RequestField("documents", _N, "the template gets messages only", (None, []), CHAT),
    RequestField("modalities", _N, "text only", (None, ["text"]), CHAT),
    RequestField("audio", _N, "text only", (None,), CHAT),
    RequestField("prediction", _N, "no predicted outputs", (None,), CHAT),
    RequestField("reasoning_effort", _N, "no reasoning controls", (None,), CHAT),
    RequestField("verbosity", _N, "no verbosity control", (None,), CHAT),
    RequestField("web_search_options", _N, "no web search", (None,), CHAT),
    RequestField("store", _N, "this server stores nothing", (None, False), CHAT),
    # --- bookkeeping that cannot change the output ------------------------------------------------
    RequestField("user", _I, "not used"),
    RequestField("metadata", _I, "not used", routes=CHAT),
    RequestField("safety_identifier", _I, "not used", routes=CHAT),
    RequestField("prompt_cache_key", _I, "not used (no prefix cache)", routes=CHAT),
    RequestField("cache_salt", _I, "not used (no prefix cache)"),
    RequestField("request_id", _I, "not used (responses carry their own id)"),
    RequestField("service_tier", _N, "one tier", (None, "auto", "default")),
)

BY_NAME: dict[str, RequestField] = {f.name: f for f in FIELDS}
STREAM_OPTIONS: dict[str, tuple[Any, ...] | None] = {"include_usage": None, "continuous_usage_stats": (None, False)}


def check_fields(body: dict[str, Any], route: Route) -> None:
    """Refuse what ``body`` asks that the front would not do.

    Raises :class:`RefusedField` for a field this route does not know (with a "did you mean" when a
    known name is close), a ``neutral`` field at another value than its accepted ones, and an unknown
    or unsupported ``stream_options`` key. Example: ``{"frequency_penalty": 1.5}`` -> "frequency_penalty=1.5
    is not supported: the engine has no penalties (...); send frequency_penalty 0 or null, or leave it out".
    """
    for name, value in body.items():
        rule = BY_NAME.get(name)
        if rule is None or route not in rule.routes:
            raise RefusedField(_unknown(name, route, rule), param=name)
        if name == "min_tokens" and _min_tokens_met(body):
            continue
        if not rule.allows(value):
            raise RefusedField(f"{name}={_show(value)} is not supported: {rule.note}; send {name} "
                               f"{_alternatives(rule.accepted)}, or leave it out", param=name)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise RefusedField(f"stream_options={_show(options)} must be an object such as {{\"include_usage\": true}}",
                               param="stream_options")
        for key, value in options.items():
            if key not in STREAM_OPTIONS:
                raise RefusedField(f"stream_options.{key} is not known; known: {', '.join(STREAM_OPTIONS)}",
                                   param="stream_options")
            accepted = STREAM_OPTIONS[key]
            if accepted is not None and not any(_same(value, ok) for ok in accepted):
                raise RefusedField(f"stream_options.{key}={_show(value)} is not supported (usage is sent once, at the "
                                   f"end); send {_alternatives(accepted)}", param="stream_options")


def _min_tokens_met(body: dict[str, Any]) -> bool:
    """``min_tokens`` asks for nothing more when ``ignore_eos`` makes every answer exactly ``max_tokens`` long
    and ``min_tokens <= max_tokens``: how benchmark clients fix the output length (NVIDIA AIPerf's and
    GenAI-Perf's ``--extra-inputs min_tokens:N --extra-inputs ignore_eos:true``)."""
    limit = body.get("max_completion_tokens", body.get("max_tokens", 16))  # unsent: at least the completions default
    value = body.get("min_tokens")
    return (body.get("ignore_eos") is True and all(isinstance(v, int) and not isinstance(v, bool) for v in (value, limit))
            and 0 <= value <= limit)


def _unknown(name: str, route: Route, rule: RequestField | None) -> str:
    path = "/v1/completions" if route == "completions" else "/v1/chat/completions"
    if rule is not None:
        other = "/v1/chat/completions" if route == "completions" else "/v1/completions"
        return f"{name!r} is a field of {other}, not of {path}"
    known = [f.name for f in FIELDS if route in f.routes]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return (f"unknown field {name!r} for {path}{hint} (unknown fields are refused rather than ignored; the fields "
            "this server takes are listed in docs/openai.md)")


def _same(value: Any, accepted: Any) -> bool:
    if isinstance(value, bool) or isinstance(accepted, bool):
        return type(value) is type(accepted) and value == accepted
    if accepted is None or value is None:
        return value is accepted
    if isinstance(accepted, (int, float)):
        return isinstance(value, (int, float)) and value == accepted
    return type(value) is type(accepted) and value == accepted


def _show(value: Any) -> str:
    text = json.dumps(value, allow_nan=False, default=str) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _alternatives(values: Iterable[Any]) -> str:
    shown = [json.dumps(v) for v in values]
    return " or ".join(shown)


# --- the table in docs/openai.md -------------------------------------------------------------------

BEGIN = "<!-- request fields: generated by `python -m specbuild.triton_repo.openai_fields docs/openai.md` -->"
END = "<!-- end of request fields -->"


def fields_markdown() -> str:
    """The Markdown table of :data:`FIELDS` (field, routes, handling, what is accepted and why)."""
    rows = ["| field | route | handling | accepted | note |", "|---|---|---|---|---|"]
    for f in FIELDS:
        routes = "both" if f.routes == BOTH else "chat" if f.routes == CHAT else "completions"
        accepted = {"honoured": "its valid values", "ignored": "any"}.get(f.handling) if f.handling != "neutral" else ", ".join(f"`{json.dumps(v)}`" for v in f.accepted) + " (else 400)"
        rows.append(f"| `{f.name}` | {routes} | {f.handling} | {accepted} | {f.note.replace('|', '/')} |")
    return "\n".join(rows)


def write_docs(path: Path) -> bool:
    """Replace the table between :data:`BEGIN` and :data:`END` in ``path``; True when the file changed.
    Raises ``ValueError`` when the markers are missing."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path} has no {BEGIN!r} ... {END!r} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{fields_markdown()}\n{END}{tail}"
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["docs/openai.md"]:
        print(f"{arg}: {'rewritten' if write_docs(Path(arg)) else 'up to date'}")
