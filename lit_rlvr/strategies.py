"""Strategy names users can type as flags: ``--trainer.strategy=fsdp2``.

Lightning's FSDP2 is :class:`~lightning.pytorch.strategies.ModelParallelStrategy`, which has no
registered name (``--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy`` is
refused as an unknown name; only a YAML ``class_path`` reached it), and whose ``"auto"`` sizes give
tensor parallelism across a node's devices. :class:`FSDP2Strategy` is pure data-parallel FSDP2:
every device of every node is one data-parallel shard (``tensor_parallel_size=1``), which is what
:meth:`lit_rlvr.module.RLVRModule.configure_model` shards for. Registered as ``fsdp2`` when this
module is imported (the ``lit-rlvr`` CLI does).
"""

from __future__ import annotations

from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from typing_extensions import override


class FSDP2Strategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` with ``data_parallel_size`` = every process and ``tensor_parallel_size`` = 1.

    Args:
        **kwargs: the other ``ModelParallelStrategy`` arguments (``save_distributed_checkpoint``,
            ``process_group_backend``, ``timeout``).
    """

    def __init__(self, **kwargs):
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, **kwargs)

    @override
    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes  # all ranks, one shard each
        super().setup_environment()


if "fsdp2" not in StrategyRegistry:
    StrategyRegistry.register(
        "fsdp2", FSDP2Strategy, description="FSDP2 (fully_shard) data parallelism over every device"
    )
