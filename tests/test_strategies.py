"""The strategy names users can type as flags (lit_rlvr/strategies.py).

Fits under ``--trainer.strategy=fsdp2`` on two processes are in tests/integration/test_scale_out.py
and tests/integration/test_fsdp.py.
"""

from __future__ import annotations


def test_fsdp2_is_a_registered_strategy_that_shards_every_device():
    from lightning.pytorch.strategies import StrategyRegistry

    from lit_rlvr.strategies import FSDP2Strategy

    assert StrategyRegistry["fsdp2"]["strategy"] is FSDP2Strategy
    strategy = StrategyRegistry.get("fsdp2")
    strategy.num_nodes, strategy.parallel_devices = 2, [None] * 4  # 2 nodes x 4 devices
    assert strategy.num_processes == 4 and strategy._tensor_parallel_size == 1
