"""Which TensorRT-LLM is installed, and which (method, build path) pairs a version supports.

Nothing here imports ``tensorrt_llm``: importing it needs the CUDA driver library, and a recipe must
fail validation in well under a second on any machine. Detection uses
``importlib.util.find_spec`` + ``importlib.metadata.version``.

Which build path runs which method is the method's own mapping (:mod:`specbuild.methods`,
``TrtllmMapping.unavailable``, from TensorRT-LLM's tensorrt_llm/llmapi/llm_args.py ``supports_backend``
and tensorrt_llm/commands/build.py ``--speculative_decoding_mode``): the engine path (<= 1.2.x) runs
none, draft_target, ngram, lookahead, medusa, eagle and redrafter; the PyTorch path (>= 1.0) none,
draft_target, ngram, eagle3 and mtp.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from typing import Literal

BuildPath = Literal["tensorrt", "pytorch"]
DISTRIBUTION = "tensorrt_llm"  # PyPI "tensorrt-llm"; importlib.metadata normalizes the name


@dataclass(frozen=True, order=True)
class TrtllmVersion:
    """A TensorRT-LLM release number; pre-releases (``1.3.0rc2``) compare equal to their release
    for capability purposes, because the engine path was already removed on the 1.3 branch."""

    major: int
    minor: int
    patch: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


ENGINE_PATH_LAST = TrtllmVersion(1, 2, 99)  # the engine path ships in <= 1.2.x
PYTORCH_PATH_FIRST = TrtllmVersion(1, 0, 0)


def parse_version(text: str) -> TrtllmVersion:
    """``"1.2.1"`` / ``"1.3.0rc2"`` / ``"0.21.0"`` -> :class:`TrtllmVersion`.

    Raises:
        ValueError: not a ``MAJOR.MINOR[.PATCH]`` version string.
    """
    match = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        raise ValueError(f"not a TensorRT-LLM version: {text!r} (expected e.g. 1.2.1)")
    return TrtllmVersion(int(match[1]), int(match[2]), int(match[3] or 0))


def installed_version() -> str | None:
    """The installed TensorRT-LLM version string, or ``None`` when it is not installed.

    Never imports ``tensorrt_llm``.
    """
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


BUILD_PATHS: tuple[BuildPath, ...] = ("tensorrt", "pytorch")


def supported_paths(method: str) -> tuple[BuildPath, ...]:
    """The build paths that run ``method`` (its :attr:`~specbuild.methods.TrtllmMapping.unavailable`),
    e.g. ``("tensorrt",)`` for ``"medusa"``."""
    from specbuild.methods import method_named

    unavailable = method_named(method).trtllm.unavailable
    return tuple(path for path in BUILD_PATHS if path not in unavailable)


def capability_error(method: str, path: BuildPath, version: str | None, source: str = "installed") -> str | None:
    """Why ``method`` cannot be built on ``path`` with TensorRT-LLM ``version`` (``None``: unknown,
    only the method/path pair is checked); ``None`` when it can. ``source`` says where ``version``
    came from (``installed``, ``build.trtllm_version``), for the message.

    The message names the path or version to use instead.
    """
    if path not in supported_paths(method):
        other = [p for p in supported_paths(method) if p != path]
        hint = f"; use build.backend: {other[0]}" if other else ""
        from specbuild.methods import method_named

        why = method_named(method).trtllm.unavailable.get(path, "unsupported")
        from specbuild.builder.migrate import replacement

        instead = replacement(method) if path == "pytorch" else None
        move = f"; or move it to the PyTorch path as {instead}: `specbuild migrate RECIPE -o NEW.yaml`" if instead else ""
        return f"method {method!r} is not available on build.backend {path!r}: {why}{hint}{move}"
    if version is None:
        return None
    v = parse_version(version)
    if path == "tensorrt" and v > ENGINE_PATH_LAST:
        from specbuild.builder.migrate import replacement

        instead = replacement(method)
        move = (f"on the PyTorch path method {method!r} is replaced by {instead}" if instead
                else "set build.backend: pytorch")
        return (
            f"build.backend 'tensorrt' needs TensorRT-LLM <= 1.2.x (trtllm-build and the engine path were "
            f"removed in 1.3); {source}: {version}. Either plan for 1.2.1 (image nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3), "
            f"or move to the PyTorch path: {move}; `specbuild migrate RECIPE -o NEW.yaml` writes that recipe"
        )
    if path == "pytorch" and v < PYTORCH_PATH_FIRST:
        return f"build.backend 'pytorch' needs TensorRT-LLM >= 1.0; {source}: {version}. Upgrade, or use build.backend: tensorrt"
    if path == "pytorch":
        return decoding_type_error(method, version, source)
    return None


# --- the LLM-API lines specbuild writes for -----------------------------------------------------
# Read from NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py: the 1.2 line (DecodingBaseConfig.from_dict's
# registry), the 1.3 line (main at 0004396720054fd8e205cbf616f21f0b57c6b412, in the 1.3 pre-release series,
# and the 1.3.0rc27 API reference) and the 1.4 line (the 1.4.0rc1 and 1.4.0rc4 API references); the
# names and fields, with the commits that could be pinned, are test data in tests/upstream_trtllm.py,
# which checks every plan against them.
NEWEST_VERIFIED = TrtllmVersion(1, 4, 99)  # the newest line whose llm_args.py fields were read: 1.4.x
NEWEST_VERIFIED_LINE = "1.4"
# decoding_type -> first line that has it (absent: every LLM-API line since 1.0).
DECODING_TYPE_SINCE = {"Eagle3": "1.3", "Draft_Target": "1.3", "User_Provided": "1.3", "PARD": "1.3", "SA": "1.3",
                       "DFlash": "1.4", "DSpark": "1.4"}
# speculative_config keys by line: renamed to the field (from an alias), or dropped (removed).
SPECULATIVE_MODEL_FIELD = ("1.3", "speculative_model_dir", "speculative_model")  # the alias -> the field, from 1.3
# EagleDecodingConfig fields a line no longer has. eagle3_one_model: gone by 1.3.0rc27 (its default,
# the one-model path, is the only path), so it is never written from 1.3 on; 1.4 also drops the static
# tree (eagle_choices, "will be removed in release 1.4"), greedy_sampling, posterior_threshold and
# num_eagle_layers (absent from the 1.4.0rc4 reference).
REMOVED_FIELDS = (("1.3", frozenset({"eagle3_one_model", "greedy_sampling", "posterior_threshold"})),
                  ("1.4", frozenset({"eagle_choices", "num_eagle_layers"})))
# speculative_config keys a line must have (SAEnhancerConfig: 1.4 line; use_rejection_sampling: on main at
# tests/upstream_trtllm.py's MAIN_COMMIT, not in 1.2.1, and planned for the newest verified line only)
FIELD_SINCE = {"sa_config": "1.4", "use_rejection_sampling": "1.4"}
# MTPDecodingConfig 1.4: num_nextn_predict_layers is init=False, a deprecated key remapped to max_draft_len.
MTP_DRAFT_LEN_FIELD = ("1.4", "num_nextn_predict_layers", "max_draft_len")


def _at_least(version: str, line: str) -> bool:
    return parse_version(version) >= parse_version(line)


def decoding_type_error(method: str, version: str, source: str = "installed") -> str | None:
    """Why TensorRT-LLM ``version``'s LLM API has no ``decoding_type`` for ``method`` (``None``: it has).

    Example: ``SA`` on 1.2.1 -> "... needs TensorRT-LLM >= 1.3 ...".
    """
    from specbuild.methods import method_named

    decoding_type = method_named(method).trtllm.decoding_type
    if decoding_type is None:
        return None
    spelled = llm_api_decoding_type(decoding_type, version)
    first = DECODING_TYPE_SINCE.get(spelled)
    if first is not None and not _at_least(version, first):
        return (f"method {method!r} (LLM API decoding_type {decoding_type}) needs TensorRT-LLM >= {first}; {source}: {version}. "
                f"Set build.trtllm_version to {first} or later (the newest verified line is {NEWEST_VERIFIED_LINE})")
    return None


def unverified_error(version: str, source: str = "installed") -> str | None:
    """A message when ``version`` is newer than the newest line whose sources specbuild was checked
    against (``None``: it is not); the plan then needs an explicit override."""
    if parse_version(version) <= NEWEST_VERIFIED:
        return None
    return (f"TensorRT-LLM {version} ({source}) is newer than the newest verified line, {NEWEST_VERIFIED_LINE}.x "
            f"(fields read from the 1.4.0rc1 / 1.4.0rc4 llm_args.py): its speculative_config names may differ. "
            f"Plan for {NEWEST_VERIFIED_LINE} (build.trtllm_version / --trtllm-version), or pass --allow-unverified-trtllm "
            f"to write the {NEWEST_VERIFIED_LINE} files anyway")


def llm_api_config(config: dict, version: str) -> dict:
    """A method's ``speculative_config`` (:meth:`~specbuild.methods.MethodParams.to_llm_api`) as
    TensorRT-LLM ``version`` spells it: its ``decoding_type``, ``speculative_model`` (the field)
    instead of the alias ``speculative_model_dir`` from 1.3, fields a line no longer has dropped
    (:data:`REMOVED_FIELDS`: ``eagle3_one_model`` from 1.3, ``eagle_choices`` from 1.4), MTP's
    ``num_nextn_predict_layers`` as ``max_draft_len`` (1.4).

    Example: ``{"decoding_type": "Eagle3", "speculative_model_dir": "h", "eagle3_one_model": True}`` for
    ``1.4.0`` -> ``{"decoding_type": "Eagle3", "speculative_model": "h"}``.
    """
    out = {**config, "decoding_type": llm_api_decoding_type(config["decoding_type"], version)}
    first, alias, name = SPECULATIVE_MODEL_FIELD
    if alias in out and _at_least(version, first):
        out = {(name if k == alias else k): v for k, v in out.items()}
    for line, removed in REMOVED_FIELDS:
        if _at_least(version, line):
            out = {k: v for k, v in out.items() if k not in removed}
    first, old, new = MTP_DRAFT_LEN_FIELD
    if out["decoding_type"] == "MTP" and old in out and _at_least(version, first):
        out = {(new if k == old else k): v for k, v in out.items()}
    return out


def llm_api_decoding_type(decoding_type: str, version: str) -> str:
    """The ``decoding_type`` string the LLM API of ``version`` accepts (the method's
    :attr:`~specbuild.methods.TrtllmMapping.renamed`).

    Example: ``"Eagle3"`` -> ``"Eagle"`` for 1.0-1.2 (``DecodingBaseConfig.from_dict`` has no
    ``Eagle3`` key there; its PyTorch backend treats ``Eagle`` as EAGLE-3), ``"Eagle3"`` from 1.3;
    ``"DraftTarget"`` -> ``"Draft_Target"`` from 1.3 (that line's ``decoding_type`` literal).
    """
    from specbuild.methods import method_for_decoding_type

    method = method_for_decoding_type(decoding_type)
    v = parse_version(version)
    names = [name for first, name in (method.trtllm.renamed if method else ()) if parse_version(first) <= v]
    return names[-1] if names else decoding_type


VersionSource = Literal["installed", "build.trtllm_version", "path default", "unknown"]
ENGINE_PATH_DEFAULT = "1.2"  # the engine path's last line: plan for it when nothing says otherwise
# One version per LLM-API line whose YAML differs (decoding_type "Eagle" vs "Eagle3", removed fields): a PyTorch-path
# plan whose output is the same for all of them needs no version.
LLM_API_LINES = ("1.2.1", "1.3.0", "1.4.0")


@dataclass(frozen=True)
class PlannedVersion:
    """The TensorRT-LLM version a plan is written for, and where that came from.

    ``version`` ``None`` (``source`` ``unknown``): no version known, allowed only when the plan's
    output is the same for every version of its path.
    """

    version: str | None
    source: VersionSource

    def describe(self, path: BuildPath) -> str:
        """For the plan header, e.g. ``TensorRT-LLM 1.2.x (engine path default; not installed here)``."""
        if self.source == "installed":
            return f"TensorRT-LLM {self.version} (installed)"
        if self.source == "build.trtllm_version":
            return f"TensorRT-LLM {self.version} (build.trtllm_version / --trtllm-version; not installed here)"
        if self.source == "path default":
            return f"TensorRT-LLM {self.version}.x (engine path default; not installed here)"
        return f"TensorRT-LLM >= {PYTORCH_PATH_FIRST.major}.{PYTORCH_PATH_FIRST.minor} (not installed here, no build.trtllm_version; this plan's files are the same for every version)"


def planned_version(path: BuildPath, *, installed: str | None, requested: str | None) -> PlannedVersion:
    """The installed version, else ``requested`` (``build.trtllm_version`` / ``--trtllm-version``),
    else the path's default: 1.2 for the engine path; none for the PyTorch path, whose plan must
    then not depend on the version (:data:`LLM_API_LINES`).

    Example: ``("tensorrt", installed=None, requested=None)`` -> ``PlannedVersion("1.2", "path default")``.
    """
    if installed is not None:
        return PlannedVersion(installed, "installed")
    if requested is not None:
        return PlannedVersion(requested, "build.trtllm_version")
    if path == "tensorrt":
        return PlannedVersion(ENGINE_PATH_DEFAULT, "path default")
    return PlannedVersion(None, "unknown")
