"""Where specbuild keeps what it makes once and reuses (converted checkpoints, trained drafts, Triton
backend dirs)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SPECBUILD_CACHE``, else ``$XDG_CACHE_HOME/specbuild``, else ``~/.cache/specbuild``."""
    explicit = os.environ.get("SPECBUILD_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specbuild"


CACHE_VARIABLE = "SPECBUILD_CACHE"


def expand_cache_path(value: str) -> str:
    """A recipe path with a leading ``$SPECBUILD_CACHE`` or ``${SPECBUILD_CACHE}`` replaced by
    :func:`cache_dir` (its default when the variable is unset), then ``~`` expanded.

    Example: ``"$SPECBUILD_CACHE/trained/smollm2-eagle"`` -> ``"/home/me/.cache/specbuild/trained/smollm2-eagle"``.
    """
    for prefix in ("${" + CACHE_VARIABLE + "}", "$" + CACHE_VARIABLE):
        rest = value.removeprefix(prefix)
        if rest != value and (not rest or rest[0] in "/\\"):
            return str(cache_dir()) + rest
    return os.path.expanduser(value)
