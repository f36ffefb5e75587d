"""Where specbuild keeps what it makes once and reuses (converted checkpoints, Triton backend dirs)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SPECBUILD_CACHE``, else ``$XDG_CACHE_HOME/specbuild``, else ``~/.cache/specbuild``."""
    explicit = os.environ.get("SPECBUILD_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specbuild"
