"""Write a directory so that it is either absent, the old one, or complete: never half-written.

``with staging_dir(final) as tmp:`` yields an empty sibling directory ``.<name>.tmp-<pid>-<random>``;
when the block ends without an exception it replaces ``final`` by renaming (``os.replace``), and on
an exception it is deleted. A process killed outright leaves only its hidden staging directory,
which the next ``staging_dir`` for the same ``final`` removes once its process is gone.

``write_file_atomic(final, data)`` does the same for one file: a hidden sibling written and fsynced,
then renamed over ``final``; on any error (a full disk: ``OSError`` ENOSPC) the sibling is removed
and ``final`` is left as it was; ``write_json_atomic(final, obj)`` writes a JSON report that way.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def save_safetensors(tensors: dict, path: Path | str) -> Path:
    """safetensors' ``save_file``, readable as any file this process writes (``0o666 & ~umask``): the
    library creates its files ``0600``, which another user (a serving container) cannot read.
    ``tensors``: name -> contiguous CPU tensor. Raises as ``save_file``."""
    from safetensors.torch import save_file

    save_file(tensors, str(path))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
    return Path(path)


@contextmanager
def staging_dir(final: Path) -> Iterator[Path]:
    """Stage ``final``'s new contents in a temporary sibling and publish them atomically."""
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(final)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()  # unlike mkdtemp's 0700, the umask's usual permissions
    try:
        yield tmp
        publish_dir(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_file_atomic(final: Path, data: bytes) -> Path:
    """Replace ``final`` by a file holding ``data``, or leave it untouched: a reader sees the old file
    or the whole new one, never part. Raises the ``OSError`` of a failed write (ENOSPC) after removing
    the hidden ``.<name>.tmp-<pid>-<random>`` sibling it wrote to."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def write_json_atomic(final: Path | str, obj: Any, *, indent: int = 2, default: Callable[[Any], Any] | None = None) -> Path:
    """Write ``obj`` as JSON (``indent``, one trailing newline, UTF-8) with :func:`write_file_atomic`;
    returns the path. Reports (``report.json``, ``load_report.json``, ...) go through here, so a reader
    never sees half a report. Raises ``TypeError`` for an object JSON cannot hold (``default`` may
    convert it) and the ``OSError`` of a failed write."""
    text = json.dumps(obj, indent=indent, default=default) + "\n"
    return write_file_atomic(Path(final), text.encode("utf-8"))


def publish_dir(tmp: Path, final: Path) -> None:
    """Make ``tmp`` appear as ``final`` by rename, replacing an existing ``final``."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_abandoned(final: Path) -> None:
    """Delete staging (``.tmp-<pid>-*``) and replaced (``.old-<pid>``) siblings of dead processes."""
    owner = re.compile(rf"^\.{re.escape(final.name)}\.(?:tmp|old)-(\d+)")
    for path in final.parent.iterdir():
        match = owner.match(path.name)
        if match and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
