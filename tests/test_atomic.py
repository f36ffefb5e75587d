"""Interrupted writes leave nothing half-written that looks finished."""

import os
import subprocess
import sys

import pytest

from specbuild.builder.atomic import staging_dir


def test_success_replaces_the_old_directory(tmp_path):
    final = tmp_path / "engine"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with staging_dir(final) as tmp:
        (tmp / "config.json").write_text("{}")
    assert sorted(p.name for p in final.iterdir()) == ["config.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["engine"]


def test_failure_keeps_the_old_directory_and_no_staging(tmp_path):
    final = tmp_path / "engine"
    final.mkdir()
    (final / "config.json").write_text("old")
    with pytest.raises(RuntimeError):
        with staging_dir(final) as tmp:
            (tmp / "config.json").write_text("half")
            raise RuntimeError("interrupted")
    assert (final / "config.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["engine"]


def test_killed_writer_leaves_only_a_hidden_staging_dir_that_is_cleaned_later(tmp_path):
    final = tmp_path / "engine"
    code = (
        "import os, sys; from pathlib import Path; from specbuild.builder.atomic import staging_dir\n"
        f"with staging_dir(Path({str(final)!r})) as tmp:\n"
        "    (tmp / 'weights').write_text('partial'); os._exit(9)\n"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 9
    leftovers = list(tmp_path.iterdir())
    assert not final.exists() and len(leftovers) == 1 and leftovers[0].name.startswith(".engine.tmp-")
    live = tmp_path / f".engine.tmp-{os.getpid()}-busy"  # a concurrent writer that is still running
    live.mkdir()
    with staging_dir(final) as tmp:
        (tmp / "config.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "engine"]
