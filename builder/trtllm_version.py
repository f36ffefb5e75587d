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
        return f"method {method!r} is not available on build.backend {path!r}: {why}{hint}"
    if version is None:
        return None
    v = parse_version(version)
    if path == "tensorrt" and v > ENGINE_PATH_LAST:
        return (
            f"build.backend 'tensorrt' needs TensorRT-LLM <= 1.2.x (trtllm-build and the engine path were "
            f"removed in 1.3); {source}: {version}. Install tensorrt-llm==1.2.1 (NGC container "
            f"tritonserver:<yy.mm>-trtllm-python-py3 with TensorRT-LLM 1.2) or use build.backend: pytorch"
            + ("" if "pytorch" in supported_paths(method) else f" (not available for method {method!r})")
        )
    if path == "pytorch" and v < PYTORCH_PATH_FIRST:
        return f"build.backend 'pytorch' needs TensorRT-LLM >= 1.0; {source}: {version}. Upgrade, or use build.backend: tensorrt"
    from specbuild.methods import method_named

    since = method_named(method).trtllm.since
    if since is not None and v < parse_version(since):
        return f"method {method!r} needs TensorRT-LLM >= {since} (its LLM API has no such decoding_type before); {source}: {version}. Upgrade"
    return None


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
# One version per LLM-API line whose YAML differs (decoding_type "Eagle" vs "Eagle3"): a PyTorch-path
# plan whose output is the same for all of them needs no version.
LLM_API_LINES = ("1.2.1", "1.3.0")


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
