"""Atomic writes against what is already in the target folder: planted links, killed writes, a second writer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from lit_rlvr.atomic import ConcurrentWriteError, atomic_dir, atomic_file
from lit_rlvr.checkpoint import SafeCheckpointIO, verify_checkpoint


def test_a_link_planted_at_the_temporary_name_never_redirects_a_checkpoint(tmp_path):
    """``step=3.ckpt.tmp`` was the fixed temporary name: a link there made the checkpoint overwrite its target."""
    victim = tmp_path / "elsewhere" / "precious.txt"
    victim.parent.mkdir()
    victim.write_text("precious")
    folder = tmp_path / "ckpts"
    folder.mkdir()
    (folder / "step=3.ckpt.tmp").symlink_to(victim)
    (folder / "step=3.ckpt").symlink_to(victim)  # and one at the name itself: replaced, not followed
    SafeCheckpointIO().save_checkpoint({"w": torch.ones(2)}, folder / "step=3.ckpt")
    assert victim.read_text() == "precious"
    checkpoint = folder / "step=3.ckpt"
    assert not checkpoint.is_symlink() and verify_checkpoint(checkpoint)
    assert sorted(p.name for p in folder.iterdir()) == ["step=3.ckpt"]  # the planted link at the old name is gone


def test_the_temporaries_of_killed_writes_are_removed_by_the_next_write(tmp_path):
    target = tmp_path / "shard.bin"
    (tmp_path / "shard.bin.tmp").write_bytes(b"partial")  # the fixed name of lit_rlvr 0.2
    (tmp_path / "shard.bin.0123456789ab.tmp").write_bytes(b"partial")  # a killed write: no lock held
    (tmp_path / "other.bin.0123456789ab.tmp").write_bytes(b"another file's")
    with atomic_file(target) as f:
        f.write(b"whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.bin.0123456789ab.tmp", "shard.bin"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # the umask's mode, as open() gives


def test_a_second_export_to_a_folder_being_written_is_refused(tmp_path):
    """Both used ``<dir>.tmp``: the second removed the first's files and the two mixed."""
    target = tmp_path / "hf"
    with atomic_dir(target) as first:
        (first / "config.json").write_text("first")
        with pytest.raises(ConcurrentWriteError, match=rf"cannot write {target}: another process is writing it"):
            with atomic_dir(target) as second:
                (second / "config.json").write_text("second")
        (first / "model.safetensors").write_text("first")
    assert {p.name: p.read_text() for p in target.iterdir()} == {"config.json": "first", "model.safetensors": "first"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_an_export_from_another_process_is_refused_while_it_runs(tmp_path):
    """The lock lives as long as the writing process: a second process is refused, a killed one's folder is cleared."""
    target = tmp_path / "hf"
    script = textwrap.dedent(f"""
        import sys, time
        from lit_rlvr.atomic import atomic_dir
        with atomic_dir({str(target)!r}) as tmp:
            (tmp / "config.json").write_text("other")
            print("writing", flush=True)
            time.sleep(60)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    other = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert other.stdout.readline().strip() == "writing"
        with pytest.raises(ConcurrentWriteError):
            with atomic_dir(target):
                pass
    finally:
        other.kill()
        other.wait()
    with atomic_dir(target) as tmp:  # killed: its temporary folder is a leftover, removed
        (tmp / "config.json").write_text("mine")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"] and (target / "config.json").read_text() == "mine"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
