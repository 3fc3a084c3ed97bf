"""Weights for sync: LoRA merged by hand as reference, names mapped back to the base model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model

from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama
from lit_rlvr.rollout.weights import base_weight_name, engine_model_path, is_peft_model, sync_weights


@pytest.fixture
def tok():
    return build_char_tokenizer()


def lora_model(tok, targets=("q_proj", "v_proj", "down_proj"), modules_to_save=None, seed=0):
    base = build_tiny_llama(tok, num_layers=2, hidden_size=64, num_heads=2, intermediate_size=128, seed=seed)
    torch.manual_seed(seed)
    cfg = LoraConfig(
        r=4, lora_alpha=16, target_modules=list(targets), init_lora_weights=False, modules_to_save=modules_to_save
    )
    return base, get_peft_model(copy.deepcopy(base), cfg)


def test_plain_model_weights_are_its_state_dict(tok):
    model = build_tiny_llama(tok, num_layers=1, seed=0)
    with sync_weights(model) as weights:
        got = dict(weights)
    ref = model.state_dict()
    assert got.keys() == ref.keys()
    assert all(torch.equal(got[k], ref[k]) for k in ref)


@pytest.mark.parametrize("seed", [0, 1])
def test_lora_weights_are_merged_with_base_names(tok, seed):
    base, lora = lora_model(tok, seed=seed)
    assert is_peft_model(lora) and not is_peft_model(base)
    with sync_weights(lora) as weights:
        got = {k: v.clone() for k, v in weights}
    assert got.keys() == base.state_dict().keys()
    for name, ref in base.state_dict().items():
        module_name = name.rsplit(".", 1)[0]
        module = lora.base_model.model.get_submodule(module_name)
        if hasattr(module, "lora_A") and name.endswith("weight"):  # W + (alpha / r) B A, by hand
            A, B = module.lora_A["default"].weight, module.lora_B["default"].weight
            ref = ref + module.scaling["default"] * (B @ A)
        torch.testing.assert_close(got[name], ref)


def test_lora_is_unmerged_after_sync_even_on_error(tok):
    base, lora = lora_model(tok)
    x = torch.tensor([[5, 6, 7, 8]])
    before = lora(x).logits.detach()
    with pytest.raises(RuntimeError, match="boom"):
        with sync_weights(lora):
            raise RuntimeError("boom")
    with sync_weights(lora) as weights:
        list(weights)
    torch.testing.assert_close(lora(x).logits, before)
    layer = lora.base_model.model.model.layers[0].self_attn.q_proj
    torch.testing.assert_close(layer.base_layer.weight, base.model.layers[0].self_attn.q_proj.weight)


def test_modules_to_save_map_to_the_trained_copy(tok):
    base, lora = lora_model(tok, targets=("q_proj",), modules_to_save=["v_proj"])
    trained = lora.base_model.model.model.layers[1].self_attn.v_proj.modules_to_save["default"].weight
    with torch.no_grad():
        trained.add_(1.0)
    with sync_weights(lora) as weights:
        got = dict(weights)
    assert got.keys() == base.state_dict().keys()
    torch.testing.assert_close(got["model.layers.1.self_attn.v_proj.weight"], trained)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("base_model.model.model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("base_model.model.model.layers.3.mlp.down_proj.base_layer.bias", "model.layers.3.mlp.down_proj.bias"),
        ("base_model.model.model.layers.3.mlp.down_proj.lora_B.default.weight", None),
        ("base_model.model.model.embed_tokens.lora_embedding_A.default", None),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector.default.weight", None),
        ("base_model.model.score.modules_to_save.my_adapter.weight", "score.weight"),
    ],
)
def test_base_weight_name(name, expected):
    assert base_weight_name(name) == expected


def test_engine_model_path_uses_name_or_path_or_saves(tok, tmp_path):
    model = build_tiny_llama(tok, num_layers=1, seed=0)
    saved_to = Path(engine_model_path(model, tok))  # built in memory: saved to a temp dir
    assert (saved_to / "config.json").is_file() and (saved_to / "tokenizer.json").is_file()
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path)
    assert engine_model_path(reloaded) == str(tmp_path)
    lora = get_peft_model(reloaded, LoraConfig(r=2, target_modules=["q_proj"]))
    assert engine_model_path(lora) == str(tmp_path)
    with pytest.raises(ValueError, match="pass model_path explicitly"):
        engine_model_path(torch.nn.Linear(2, 2))
