"""Interrupted writes leave nothing half-written that looks finished."""

import os
import subprocess
import sys

import pytest

from specbuild.util.atomic import staging_dir


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
        "import os, sys; from pathlib import Path; from specbuild.util.atomic import staging_dir\n"
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


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_specbuild_build_stopped_mid_build_exits_130_and_leaves_no_engine(tmp_path, tiny_checkpoint, signum):
    """`specbuild build` asked to stop while it writes the engine (Ctrl-C, `kill`, `timeout`): exit code
    INTERRUPTED (130), no engine directory and no staging directory left behind."""
    import signal
    import time

    from conftest import write_recipe

    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint)
    out, marker = tmp_path / "out", tmp_path / "writing"
    script = (
        "import pathlib, sys, time\n"
        "import specbuild.builder.reference as reference\n"
        "def stall(*args, **kwargs):\n"
        f"    pathlib.Path({str(marker)!r}).touch()\n"
        "    time.sleep(120)\n"
        "reference._write_token_map = stall  # the last step before the engine's config.json\n"
        "from specbuild.cli import main\n"
        f"main(['build', {str(recipe)!r}, '-o', {str(out)!r}])\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.1)
        process.send_signal(getattr(signal, signum))
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "interrupted" in err
    assert not (out / "engine").exists() and not any(p.name.startswith(".") for p in out.iterdir()), sorted(out.iterdir())
