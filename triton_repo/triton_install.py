"""Where ``tritonserver`` is and what it needs to run: the NGC container's, or the one bundled in PyPI.

Two installations are supported:

- ``tritonserver`` on ``PATH`` (the NGC container), with its backends in ``/opt/tritonserver/backends``;
- the server bundled in the PyPI package ``nvidia-pytriton`` (``pip install 'specbuild[server]'``):
  Triton 2.51 with the Python backend, enough to serve Python-backend models on a CPU-only machine.

The bundled server needs some setup, which :func:`find_tritonserver` and :func:`server_environment` do:

- a backend directory ``python/`` holding ``libtriton_python.so`` and the stub built for this
  interpreter (``python_backend_stubs/<major.minor>/triton_python_backend_stub``), made once in
  ``~/.cache/specbuild/triton-backends/<key>/``;
- ``LD_LIBRARY_PATH`` = this interpreter's ``LIBDIR`` (else the stub links the system libpython),
  then ``nvidia_pytriton.libs``;
- ``PATH`` = this interpreter's ``bin/`` first. The stub embeds an *isolated* interpreter
  (``PYTHONPATH`` is ignored) that finds its prefix from the ``python3`` on ``PATH``; with the
  virtual environment's ``python3`` found first, ``sys.prefix`` is the environment, its
  site-packages (and ``.pth`` files: editable installs) are used, and the base interpreter's
  packages (perhaps numpy 2, which corrupts BYTES tensors) are not. ``PYTHONPATH`` is set to the
  site-packages as well, for stubs that honour it.

A model.py served this way imports installed packages, editable ones included, as usual. The process
itself is :class:`specbuild.triton_repo.tritonserver.TritonServer`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import site
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from specbuild.cache import cache_dir as specbuild_cache_dir

INSTALL_HINT = "pip install 'specbuild[server]'"
CONTAINER_BACKENDS = Path("/opt/tritonserver/backends")


# Progress bars off (Hugging Face hub and transformers' "Loading weights", any tqdm >= 4.66): in a
# log file each redraw is another carriage return on one ever-longer line.
QUIET_PROGRESS = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}


class ServerNotFoundError(RuntimeError):
    """No ``tritonserver`` binary on PATH and no ``nvidia-pytriton`` installed."""


@dataclass(frozen=True)
class TritonInstall:
    """Where a ``tritonserver`` binary is and what it needs to run.

    ``source`` is ``"PATH"`` or ``"nvidia-pytriton"``. ``bin_path``, ``library_path`` and
    ``python_path`` go first in ``PATH``, ``LD_LIBRARY_PATH`` and ``PYTHONPATH`` (see
    ``server_environment``).
    """

    binary: Path
    backend_directory: Path
    library_path: list[Path]
    source: str
    python_path: list[Path] = field(default_factory=list)
    bin_path: list[Path] = field(default_factory=list)


# nvidia-pytriton's wheel, which carries the tritonserver specbuild runs on a CPU, is
# manylinux_2_35_x86_64: Linux on x86-64 with glibc 2.35 or newer (Ubuntu 22.04, Debian 12, RHEL 10).
PYTRITON_PLATFORM = ("Linux", ("x86_64", "AMD64"), (2, 35))


def platform_problem(system: str | None = None, machine: str | None = None, libc: tuple[str, str] | None = None) -> str | None:
    """Why this machine cannot run the tritonserver bundled in nvidia-pytriton, or None when it can.
    Arguments default to this machine's (``platform.system()``, ``platform.machine()``,
    ``platform.libc_ver()``).

    Example: ``platform_problem("Darwin", "arm64", ("", ""))`` -> ``"this is Darwin on arm64; ..."``.
    """
    import platform

    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    lib, version = platform.libc_ver() if libc is None else libc
    want_system, want_machines, want_glibc = PYTRITON_PLATFORM
    where = (
        "tritonserver from PyPI (nvidia-pytriton) needs Linux on x86-64 with glibc 2.35 or newer; run specbuild "
        "on such a machine (a VM, WSL2, or a container such as nvcr.io/nvidia/tritonserver:<yy.mm>-py3), or put a "
        "tritonserver on PATH"
    )
    if system != want_system or machine not in want_machines:
        return f"this is {system} on {machine}; {where}"
    try:
        found = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        found = ()
    if lib != "glibc" or len(found) < 2 or found < want_glibc:
        return f"this Linux has {lib or 'no glibc'} {version}".rstrip() + f"; {where}"
    return None


def find_tritonserver(*, cache_dir: Path | None = None) -> TritonInstall:
    """Locate ``tritonserver``: on PATH first, else the one bundled in ``nvidia-pytriton``.

    For the bundled server, makes its backend directory under ``cache_dir`` (default
    ``specbuild.cache.cache_dir() / "triton-backends"``) once.

    Raises:
        ServerNotFoundError: neither is installed, or the bundled one has no stub for this Python.
    """
    on_path = shutil.which("tritonserver")
    if on_path is not None:
        return _container_install(Path(on_path))
    spec = importlib.util.find_spec("pytriton")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        problem = platform_problem()
        raise ServerNotFoundError(
            "tritonserver not found: it is not on PATH and nvidia-pytriton is not installed. "
            + (problem if problem else f"Install a CPU-capable server with: {INSTALL_HINT}")
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    return _pytriton_install(package_dir, cache_dir or specbuild_cache_dir() / "triton-backends")


def _container_install(binary: Path) -> TritonInstall:
    # /opt/tritonserver/bin/tritonserver -> /opt/tritonserver/backends
    sibling = binary.resolve().parent.parent / "backends"
    backends = sibling if sibling.is_dir() else CONTAINER_BACKENDS
    return TritonInstall(binary=binary, backend_directory=backends, library_path=[], source="PATH")


def _pytriton_install(package_dir: Path, cache_dir: Path) -> TritonInstall:
    root = package_dir / "tritonserver"
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / python_version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerNotFoundError(
            f"nvidia-pytriton at {package_dir} has no Python backend stub for Python {python_version} "
            f"({stub} is missing); use a Python it supports, or a tritonserver on PATH"
        )
    backends = _ensure_backend_directory(root / "backends" / "python", stub, cache_dir)
    libdir = sysconfig.get_config_var("LIBDIR")
    library_path = ([Path(libdir)] if libdir else []) + [package_dir.parent / "nvidia_pytriton.libs"]
    return TritonInstall(
        binary=root / "bin" / "tritonserver",
        backend_directory=backends,
        library_path=library_path,
        source="nvidia-pytriton",
        python_path=[Path(p) for p in site.getsitepackages()],
        bin_path=[Path(sys.executable).parent],
    )


def _ensure_backend_directory(python_backend: Path, stub: Path, cache_dir: Path) -> Path:
    """Return ``cache_dir/<key>`` holding ``python/`` = the bundled Python backend plus ``stub``.

    The key hashes the Python version and the files' contents, so an upgrade gets a new directory. The
    directory is built in a temporary sibling and renamed into place: concurrent or interrupted runs
    never leave a half-made one.
    """
    sources = sorted(p for p in python_backend.iterdir() if p.is_file()) + [stub]
    target = cache_dir / _backend_key(sources)
    if (target / "python" / stub.name).is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=cache_dir))
    try:
        staging.chmod(0o755)  # mkdtemp makes it 0700
        (staging / "python").mkdir()
        for source in sources:
            shutil.copy2(source, staging / "python" / source.name)
        os.replace(staging, target)
    except OSError:
        if not (target / "python" / stub.name).is_file():  # else another run finished it first
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _backend_key(files: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return f"py{sys.version_info.major}.{sys.version_info.minor}-{digest.hexdigest()[:16]}"


def server_environment(install: TritonInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ``tritonserver`` runs with: ``base`` (default ``os.environ``) plus the install's
    ``PATH``, ``LD_LIBRARY_PATH`` and ``PYTHONPATH`` entries in front of any existing value, and no
    progress bars (:data:`QUIET_PROGRESS`: the server's output is a log file) unless ``base`` sets them."""
    env = dict(os.environ if base is None else base)
    for name, value in QUIET_PROGRESS.items():
        env.setdefault(name, value)
    prepend = {"PATH": install.bin_path, "LD_LIBRARY_PATH": install.library_path, "PYTHONPATH": install.python_path}
    for name, entries in prepend.items():
        parts = [str(p) for p in entries] + ([env[name]] if env.get(name) else [])
        if parts:
            env[name] = os.pathsep.join(parts)
    return env
