"""The environment block of ``bench.json``: what ran the benchmark, so two results can be compared.

Everything is read without importing heavy packages (versions come from package metadata) and
without a network: package versions, Python, OS, CPU model and core count, load average, GPUs
(``nvidia-smi`` when on PATH, else none), and the specbuild source's git commit when it runs from
a git checkout.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
from pathlib import Path

PACKAGES = ("specbuild", "torch", "transformers", "tokenizers", "numpy", "scipy", "tritonclient", "nvidia-pytriton",
            "httpx", "fastapi", "uvicorn", "tensorrt_llm", "vllm", "sglang")


def package_versions(names=PACKAGES) -> dict[str, str | None]:
    """Installed version of each package (``None``: not installed)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str:
    """The CPU model name (/proc/cpuinfo on Linux, else platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus() -> list[dict[str, str]]:
    """``[{name, memory, driver}]`` from ``nvidia-smi``; ``[]`` without NVIDIA GPUs."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [dict(zip(("name", "memory", "driver"), (p.strip() for p in line.split(",")))) for line in text.splitlines() if line.strip()]


def git_commit(path: Path | None = None) -> dict[str, object] | None:
    """``{commit, dirty}`` of the git checkout holding ``path`` (default: specbuild's source); None if none."""
    where = path or Path(__file__).resolve().parent
    if shutil.which("git") is None:
        return None
    try:
        commit = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())}


def environment() -> dict[str, object]:
    """The whole block (JSON-ready)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": {"model": cpu_model(), "logical_cores": os.cpu_count(), "load_average_1_5_15": list(load) if load else None},
        "gpus": gpus(),
        "packages": package_versions(),
        "git": git_commit(),
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES") if k in os.environ},
    }
