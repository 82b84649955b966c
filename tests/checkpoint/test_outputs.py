"""Writing outputs whole or not at all: links, '.', existing folders, failures midway, leftovers of killed runs.

The mechanism (gated_qwen.checkpoint.outputs) on its own, then through `gated-qwen convert` in the situations users
reported: DST a link to an empty folder, DST '.', a convert killed with SIGKILL while writing shards, and DST
on another file system than SRC (tmpfs at /dev/shm, where there is one).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_tiny_tokenizer

from gated_qwen.checkpoint import outputs
from gated_qwen.checkpoint.outputs import (
    OutputError,
    OutputFolder,
    find_leftovers,
    output_file,
    remove_stale,
    scratch_folder,
    write_text,
)


REPO = Path(__file__).resolve().parents[2]


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def leftover(folder: Path, name: str, state: str = "partial") -> Path:
    """A folder named as a staging folder whose writer is gone: nothing holds its lock."""
    path = folder / f".{name}.abcdef12.gated-qwen.{state}"
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"half")
    return path


def held(path: Path) -> int:
    """Lock ``path`` as a running writer does (another open file description, as another process has)."""
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


# ---------------------------------------------------------------------------------------------- the mechanism


def test_a_new_folder_appears_only_when_whole(tmp_path):
    output = OutputFolder(tmp_path / "a" / "b" / "dst")
    with output as staging:
        (staging / "x.txt").write_text("x")
        assert staging.parent == tmp_path / "a" / "b" and not (tmp_path / "a" / "b" / "dst").exists()
    assert listing(tmp_path / "a" / "b") == ["dst"]
    assert listing(tmp_path / "a" / "b" / "dst") == ["x.txt"]


def test_a_failure_leaves_nothing_not_even_the_parents_it_made(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with OutputFolder(tmp_path / "a" / "b" / "dst") as staging:
            (staging / "x.txt").write_text("x")
            1 / 0
    assert listing(tmp_path) == []


def test_an_existing_folder_keeps_its_inode_and_loses_its_old_entries_on_overwrite(tmp_path):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "old.txt").write_text("old")
    (dst / "sub").mkdir()
    inode = dst.stat().st_ino
    with pytest.raises(OutputError, match="is not empty; choose another folder or pass --overwrite"):
        OutputFolder(dst)
    with OutputFolder(dst, overwrite=True) as staging:
        assert staging.parent == dst  # staged inside: same file system as DST, whatever is mounted where
        (staging / "new.txt").write_text("new")
    assert listing(dst) == ["new.txt"] and dst.stat().st_ino == inode
    assert listing(tmp_path) == ["dst"]


def test_a_failing_move_is_undone_and_the_old_contents_stay(tmp_path, monkeypatch):
    dst = tmp_path / "dst"
    dst.mkdir()
    for name in ("a", "b", "c"):
        (dst / name).write_text(f"old {name}")
    output = OutputFolder(dst, overwrite=True)
    staging = output.open()
    for name in ("a", "d"):
        (staging / name).write_text(f"new {name}")

    real_rename, calls = os.rename, []

    def failing_rename(source, target):
        calls.append((source, target))
        if len(calls) == 5:  # three old entries moved aside, one new one moved in, then the disk fails
            raise OSError(5, "Input/output error")
        real_rename(source, target)

    monkeypatch.setattr(outputs.os, "rename", failing_rename)
    with pytest.raises(OSError, match="Input/output error"):
        output.commit()
    monkeypatch.undo()
    assert listing(dst) == ["a", "b", "c"]
    assert [(dst / name).read_text() for name in ("a", "b", "c")] == ["old a", "old b", "old c"]
    assert listing(tmp_path) == ["dst"]


def test_a_link_is_followed_and_kept(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with OutputFolder(tmp_path / "link") as staging:
        (staging / "x.txt").write_text("x")
    assert (tmp_path / "link").is_symlink() and listing(target) == ["x.txt"]
    assert listing(tmp_path) == ["link", "target"]

    (tmp_path / "dangling").symlink_to(tmp_path / "later")  # points nowhere yet: the folder is made there
    with OutputFolder(tmp_path / "dangling") as staging:
        (staging / "y.txt").write_text("y")
    assert (tmp_path / "dangling").is_symlink() and listing(tmp_path / "later") == ["y.txt"]


def test_refusals_come_before_anything_is_written(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("a file")
    with pytest.raises(OutputError, match="exists and is not a folder"):
        OutputFolder(tmp_path / "file", overwrite=True)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(OutputError, match="points to itself"):
        OutputFolder(tmp_path / "loop")
    work = tmp_path / "work"
    (work / "inner").mkdir(parents=True)
    (work / "mine.txt").write_text("mine")
    monkeypatch.chdir(work / "inner")
    with pytest.raises(OutputError, match="never replaced"):
        OutputFolder("..", overwrite=True)
    assert listing(tmp_path) == ["file", "loop", "work"] and listing(work) == ["inner", "mine.txt"]


def test_merge_replaces_only_its_own_entries(tmp_path):
    dst = tmp_path / "results"
    dst.mkdir()
    (dst / "notes.txt").write_text("mine")
    (dst / "benchmark.md").write_text("earlier")
    with pytest.raises(OutputError, match="already holds benchmark.md"):
        OutputFolder(dst, merge=True, names=["benchmark.md", "benchmark.json"])
    with OutputFolder(dst, merge=True, overwrite=True, names=["benchmark.md", "benchmark.json"]) as staging:
        (staging / "benchmark.md").write_text("new")
        (staging / "benchmark.json").write_text("{}")
    assert listing(dst) == ["benchmark.json", "benchmark.md", "notes.txt"]
    assert (dst / "benchmark.md").read_text() == "new" and (dst / "notes.txt").read_text() == "mine"


def test_a_folder_filled_by_someone_else_meanwhile_is_not_replaced(tmp_path):
    dst = tmp_path / "dst"
    dst.mkdir()
    first, second = OutputFolder(dst), OutputFolder(dst)  # two concurrent runs: both saw an empty folder
    (first.open() / "first.txt").write_text("1")
    (second.open() / "second.txt").write_text("2")
    assert [found.status for found in find_leftovers(dst)] == ["alive", "alive"]
    assert remove_stale(dst) == []  # a live run's staging folder is never removed
    first.commit()
    with pytest.raises(OutputError, match="filled by someone else"):
        second.commit()
    assert listing(dst) == ["first.txt"]


def test_leftovers_of_dead_runs_are_removed_and_the_rest_reported(tmp_path, caplog):
    stale = leftover(tmp_path, "dst")
    deleting = leftover(tmp_path, "dst", state="deleting")
    replaced = leftover(tmp_path, "dst", state="old")
    alive = leftover(tmp_path, "other")
    lock = held(alive)
    (tmp_path / ".not-ours.partial").mkdir()
    try:
        with caplog.at_level(logging.WARNING):
            with OutputFolder(tmp_path / "dst") as staging:
                (staging / "x").write_text("x")
    finally:
        os.close(lock)
    assert not stale.exists() and not deleting.exists()
    assert replaced.exists() and alive.exists()  # data, a live run's work
    assert (tmp_path / ".not-ours.partial").exists()
    assert listing(tmp_path / "dst") == ["x"]
    messages = caplog.text
    assert f"removed {stale}" in messages and "stopped while writing" in messages
    assert f"{replaced} holds what {tmp_path} held before" in messages


def test_a_staging_folder_has_the_mode_a_plain_folder_gets(tmp_path):
    os.umask(previous := os.umask(0o022))
    try:
        with OutputFolder(tmp_path / "dst") as staging:
            assert staging.stat().st_mode & 0o777 == 0o755  # not mkdtemp's 0700, which DST would keep
        with output_file(tmp_path / "f.json") as partial:
            partial.write_text("{}")
        assert (tmp_path / "f.json").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(previous)


def test_output_file_replaces_whole_and_keeps_a_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    (tmp_path / "link.json").symlink_to(real)
    with pytest.raises(RuntimeError):
        with output_file(tmp_path / "link.json") as partial:
            partial.write_text("half")
            raise RuntimeError("killed")
    assert real.read_text() == "old" and listing(tmp_path) == ["link.json", "real.json"]
    write_text(tmp_path / "link.json", "new")
    assert (tmp_path / "link.json").is_symlink() and real.read_text() == "new"
    assert listing(tmp_path) == ["link.json", "real.json"]


def test_scratch_folders_of_killed_runs_are_removed_by_the_next(tmp_path):
    stale = leftover(tmp_path, "gated-qwen-bench")
    with scratch_folder(tmp_path, name="gated-qwen-bench") as scratch:
        assert not stale.exists() and scratch.parent == tmp_path
    assert listing(tmp_path) == []


# ---------------------------------------------------------------------------------------------- through convert


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = tmp_path_factory.mktemp("stock") / "qwen3"
    config = Qwen3Config(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    Qwen3ForCausalLM(config).save_pretrained(folder)
    write_tiny_tokenizer(folder)
    return folder


def test_convert_into_a_link_to_an_empty_folder_writes_where_it_points(stock, tmp_path, capsys):
    from gated_qwen.cli import main

    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    assert main(["convert", str(stock), str(tmp_path / "link"), "--quiet"]) == 0
    assert (tmp_path / "link").is_symlink()
    assert "model.safetensors" in listing(target) and "config.json" in listing(target)
    assert listing(tmp_path) == ["link", "target"]  # no stray .link.XXXX.old
    capsys.readouterr()
    assert main(["convert", str(stock), str(tmp_path / "link"), "--quiet"]) == 2  # now not empty: refused, once
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'link'} (a link to {target}) is not empty" in err


def test_convert_into_dot_from_inside_an_empty_folder(stock, tmp_path, monkeypatch):
    from gated_qwen.cli import main

    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)  # the process's own working folder: it cannot be renamed (EBUSY), nor need it be
    assert main(["convert", str(stock), ".", "--quiet"]) == 0
    assert "model.safetensors" in listing(here) and not [p for p in listing(here) if p.startswith(".")]
    assert Path.cwd() == here and listing(tmp_path) == ["here"]


@pytest.mark.slow
def test_a_convert_killed_while_writing_shards_is_cleaned_up_by_the_next(stock, tmp_path, caplog):
    from gated_qwen.cli import main

    killed = (
        "import os, signal, sys\n"
        "import gated_qwen.checkpoint.formats as checkpoint\n"
        "def write_then_die(path, specs, tensors, **kwargs):\n"
        "    path.write_bytes(b'half a shard')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "checkpoint.write_safetensors = write_then_die\n"
        "from gated_qwen.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", killed, "convert", str(stock), str(tmp_path / "dst"), "--quiet"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == -9
    [left] = find_leftovers(tmp_path)
    assert left.status == "gone" and not (tmp_path / "dst").exists()

    with caplog.at_level(logging.WARNING):
        assert main(["convert", str(stock), str(tmp_path / "dst"), "--quiet"]) == 0
    assert listing(tmp_path) == ["dst"]
    assert f"removed {left.path}" in caplog.text


def another_file_system(tmp_path: Path) -> Path:
    """A fresh folder on a file system other than ``tmp_path``'s (tmpfs at /dev/shm), or skip."""
    import tempfile

    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)) or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no writable file system other than the test folder's (/dev/shm)")
    return Path(tempfile.mkdtemp(dir=shm, prefix="gated-qwen-test-"))


@pytest.mark.parametrize("dst_kind", ["missing", "empty folder", "link from the source's file system"])
def test_convert_onto_another_file_system_gives_the_same_files(stock, tmp_path, dst_kind):
    """SRC on one file system, DST on another: the unchanged tensors cross by copy_file_range or its fallback,
    the staging folder lies on DST's side, and the files equal those of a convert on SRC's own file system."""
    import shutil

    from gated_qwen.cli import main

    assert main(["convert", str(stock), str(tmp_path / "here"), "--quiet"]) == 0
    other = another_file_system(tmp_path)
    try:
        target = other / "gated"
        dst = target
        if dst_kind == "empty folder":
            target.mkdir()
        elif dst_kind == "link from the source's file system":
            target.mkdir()
            dst = tmp_path / "link"
            dst.symlink_to(target)
        assert main(["convert", str(stock), str(dst), "--quiet"]) == 0
        assert listing(target) == listing(tmp_path / "here")
        for name in listing(target):
            assert (target / name).read_bytes() == (tmp_path / "here" / name).read_bytes(), name
        assert listing(other) == ["gated"]  # no staging folder left on either side
        assert dst_kind != "link from the source's file system" or dst.is_symlink()
    finally:
        shutil.rmtree(other, ignore_errors=True)
