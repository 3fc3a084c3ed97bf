"""Checkpoints that carry their own sha256 (lit_rlvr/checkpoint.py): sealed, verified, refused when
damaged, loaded unverified when written without one; and the random states of an exact resume.

Checkpoints on a full disk, truncated or killed mid-write, are in tests/integration/test_faults.py
and tests/test_atomic.py.
"""

from __future__ import annotations

import random

import pytest
import torch

from lit_rlvr.checkpoint import (
    CheckpointCorruptError,
    SafeCheckpointIO,
    carried_checksum,
    load_training_state,
    restore_rng,
    rng_state,
    save_training_state,
    save_with_checksum,
    verify_checkpoint,
)
from lit_rlvr.functional.entropy import EntropyState


@pytest.fixture
def sealed(tmp_path):
    path = tmp_path / "step=1.ckpt"
    SafeCheckpointIO().save_checkpoint({"w": torch.arange(64.0), "step": 1}, path)
    return path


def test_a_sealed_checkpoint_carries_its_digest_and_loads_verified(sealed, tmp_path):
    digest = carried_checksum(sealed)
    assert digest is not None and len(digest) == 64 and int(digest, 16) >= 0
    with open(tmp_path / "again.ckpt", "wb") as f:  # the same content seals to the same digest
        assert save_with_checksum({"w": torch.arange(64.0), "step": 1}, f) == digest
    assert verify_checkpoint(sealed) is True
    loaded = SafeCheckpointIO().load_checkpoint(sealed)
    assert torch.equal(loaded["w"], torch.arange(64.0)) and loaded["step"] == 1


def test_a_flipped_byte_is_refused_naming_the_file(sealed):
    data = bytearray(sealed.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the archive: torch alone would load it
    sealed.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match=rf"checkpoint {sealed} is damaged: its sha256 is"):
        verify_checkpoint(sealed)
    with pytest.raises(CheckpointCorruptError, match="is damaged"):
        SafeCheckpointIO().load_checkpoint(sealed)


def test_a_checkpoint_without_a_digest_loads_unverified(tmp_path):
    plain = tmp_path / "lightning.ckpt"
    torch.save({"w": torch.ones(3)}, plain)  # Lightning's default writer, or lit_rlvr 0.1
    assert carried_checksum(plain) is None and verify_checkpoint(plain) is False
    assert torch.equal(SafeCheckpointIO().load_checkpoint(plain)["w"], torch.ones(3))
    tiny = tmp_path / "tiny.ckpt"
    tiny.write_bytes(b"PK")
    assert carried_checksum(tiny) is None


def test_storage_options_are_refused_for_a_local_path(tmp_path):
    with pytest.raises(TypeError, match="SafeCheckpointIO.save_checkpoint takes no storage_options"):
        SafeCheckpointIO().save_checkpoint({"w": 1}, tmp_path / "x.ckpt", storage_options={"k": 1})
    assert not (tmp_path / "x.ckpt").exists()


def test_the_training_state_restores_every_random_state_and_the_entropy_coefficient():
    generator = torch.Generator().manual_seed(1)
    checkpoint: dict = {}
    save_training_state(checkpoint, generator, EntropyState(0.01, True))
    expected = (torch.rand(3), random.random(), torch.rand(3, generator=generator))
    torch.rand(5), random.random(), torch.rand(5, generator=generator)  # the run moves on
    assert checkpoint["lit_rlvr_entropy_control"] == {"coef": 0.01, "active": True}
    assert load_training_state(checkpoint, generator, EntropyState(0.5, False)) == EntropyState(0.01, True)
    again = (torch.rand(3), random.random(), torch.rand(3, generator=generator))
    assert torch.equal(again[0], expected[0]) and again[1] == expected[1] and torch.equal(again[2], expected[2])


def test_a_checkpoint_without_the_training_state_leaves_the_generators_alone():
    generator = torch.Generator().manual_seed(2)
    state = rng_state(generator)
    assert load_training_state({}, generator) is None
    initial = EntropyState(0.5, False)
    assert load_training_state({}, generator, initial) is initial  # nothing saved: the coefficient as it is
    assert torch.equal(generator.get_state(), state["generator"])
    checkpoint: dict = {}
    save_training_state(checkpoint, generator, None)
    assert set(checkpoint) == {"lit_rlvr_rng"}  # no entropy bonus: no coefficient saved
    restore_rng(state, generator)
    assert torch.equal(torch.get_rng_state(), state["torch"]) and random.getstate() == state["python"]
