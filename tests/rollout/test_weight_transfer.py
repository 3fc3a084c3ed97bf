"""The trainer half of the ``lit_rlvr_file`` backend, with a stand-in for vLLM's sync client."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")


def test_chunks_of_at_most_chunk_bytes_go_into_a_private_folder_that_is_removed_after_the_sync(tmp_path):
    from safetensors.torch import load_file

    from lit_rlvr.rollout.weight_transfer import FileTrainerInitInfo, FileTrainerWeightTransferEngine

    class Client:
        def __init__(self):
            self.calls = []

        def init_weight_transfer_engine(self, init_info):
            self.calls.append("init")

        def start_weight_update(self):
            self.calls.append("start")

        def update_weights(self, info):
            path = Path(info["path"])
            folder = path.parent
            self.calls.append((folder, stat.S_IMODE(folder.stat().st_mode), sorted(load_file(path)), info["names"]))

        def finish_weight_update(self, weight_version=None):
            self.calls.append("finish")

    weights = {"a": torch.ones(4), "b": torch.zeros(2, 2), "c": torch.arange(3.0)}
    client = Client()
    init = FileTrainerInitInfo(rank=0, directory=str(tmp_path), chunk_bytes=32)  # a and b (16 + 16 bytes) fill a chunk
    sender = FileTrainerWeightTransferEngine.trainer_init(init, client=client, source=list(weights.items()))
    sender.send_weights()
    start, (folder, mode, names, posted), (folder2, _, names2, _), finish = client.calls[1:]
    assert (start, finish, mode, folder, names, posted, names2) == (
        "start",
        "finish",
        0o700,
        folder2,
        ["a", "b"],
        ["a", "b"],
        ["c"],
    )
    assert folder.parent == tmp_path and list(tmp_path.iterdir()) == []  # nothing left of the sync
