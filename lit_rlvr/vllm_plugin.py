"""lit_rlvr's vLLM plug-in (entry point ``vllm.general_plugins``): registers the ``lit_rlvr_file`` weight-transfer backend.

vLLM runs every installed general plug-in in each of its processes (API server, engine core,
workers), so ``vllm serve --weight-transfer-config '{"backend": "lit_rlvr_file"}'`` finds the
backend. Registration is by module path: nothing of lit_rlvr is imported until a server uses it
(:mod:`lit_rlvr.rollout.weight_transfer`).
"""

from __future__ import annotations

BACKEND = "lit_rlvr_file"
_MODULE = "lit_rlvr.rollout.weight_transfer"


def register() -> None:
    """Register both halves of the backend with vLLM's factories (idempotent: vLLM may call it often)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, _MODULE, "FileWeightTransferEngine")
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, _MODULE, "FileTrainerWeightTransferEngine")
