"""RolloutCallback in real ``Trainer.fit`` runs with a minimal LightningModule defined here.

``TinyRL`` is a user's own module: it provides what the callback requires
(:class:`~lit_rlvr.contracts.RolloutHost`) and nothing of :class:`~lit_rlvr.module.RLVRModule`.
"""

from __future__ import annotations

import copy
import importlib.util
import time

import lightning as L
import pytest
import torch
from lightning.pytorch import Callback
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlvr.callbacks import RolloutCallback
from lit_rlvr.contracts import TrainBatch, ValBatch
from lit_rlvr.lockstep import Lockstep
from lit_rlvr.policy import MicroBatching, completion_logprobs, sequence_logprob
from lit_rlvr.rollout import HFEngine, Rollouts, SamplingParams, probe_sequence, vllm_available

PROMPTS = ["12+3=", "7*8=", "abc", "x", "9-4=", "hello", "2+2=", "z:"]


class TinyRL(L.LightningModule):
    """Maximise the log-likelihood of the policy's own samples: a real step on a loss from the rollouts."""

    def __init__(
        self, policy, tokenizer, lr=0.05, sampling=SamplingParams(n=2, max_new_tokens=6, seed=1), val_temperature=None
    ):
        super().__init__()
        self.policy, self.tokenizer, self.lr = policy.train(), tokenizer, lr
        self.sampling = sampling
        self.val_sampling = SamplingParams(
            n=1,
            temperature=val_temperature or sampling.temperature,
            max_new_tokens=sampling.max_new_tokens,
            seed=sampling.seed,
        )
        self.environment = None  # single-turn rollouts
        self.micro_batching = MicroBatching()
        self.lockstep = Lockstep()  # one process
        self.train_seen: list[dict] = []
        self.val_seen: list[dict] = []

    def training_step(self, batch, batch_idx):
        r = batch.rollouts  # None here means Lightning copied the batch after the hook
        self.train_seen.append({"batch_id": id(batch), "rollouts": r, "prompt_ids": batch.prompt_ids})
        t = {k: v.to(self.device) for k, v in r.to_padded(self.tokenizer.pad_token_id).items()}
        lp, _ = completion_logprobs(self.policy, t["input_ids"], t["attention_mask"], t["response_mask"].shape[1])
        mask = t["response_mask"].float()
        return -(lp * mask).sum() / mask.sum()

    def validation_step(self, batch, batch_idx):
        self.val_seen.append({"n_samples": batch.n_samples, "rollouts": batch.rollouts, "prompt_ids": batch.prompt_ids})

    def test_step(self, batch, batch_idx):
        self.validation_step(batch, batch_idx)

    def configure_optimizers(self):
        return torch.optim.SGD(self.policy.parameters(), lr=self.lr)


class Spy(Callback):
    """Runs after RolloutCallback: what a user's own Callback sees."""

    def __init__(self, rollout_cb, probe):
        self.rollout_cb, self.probe = rollout_cb, probe
        self.batch_ids, self.drifts, self.first_batch_check = [], [], None
        self.engine = None

    def on_fit_start(self, trainer, pl_module):
        self.engine = self.rollout_cb.engine
        self.tokens_at_fit_start = self.rollout_cb.total_rollout_tokens

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        assert isinstance(batch.rollouts, Rollouts)
        self.batch_ids.append(id(batch))
        self.drifts.append(self.rollout_cb.last_metrics.get("rollout/drift"))
        if self.first_batch_check is None:
            engine_lp = torch.tensor(self.rollout_cb.engine.probe_logprobs(*self.probe))
            self.first_batch_check = (engine_lp - sequence_logprob(pl_module.policy, *self.probe)).abs().max().item()


def loaders(tok, P=2, n_val=3, n_train=len(PROMPTS)):
    rows = [{"id": str(i), "prompt": p, "answer": "", "reward": "none"} for i, p in enumerate(PROMPTS[:n_train])]

    def collate(batch):
        return TrainBatch(batch, [tok(r["prompt"]).input_ids for r in batch])

    def collate_val(batch):
        return ValBatch(batch, [tok(r["prompt"]).input_ids for r in batch], [False] * len(batch), "tiny", n_val)

    return DataLoader(rows, batch_size=P, collate_fn=collate), DataLoader(
        rows[:2], batch_size=2, collate_fn=collate_val
    )


def trainer(tmp_path, max_steps, **kw):
    kw = {
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": max_steps,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
        "default_root_dir": tmp_path,
        **kw,
    }
    return L.Trainer(**kw)


@pytest.fixture
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def policy(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def check_rollouts(seen, tok, n):
    for s in seen:
        r, P = s["rollouts"], len(s["prompt_ids"])
        assert r.prompt_ids == s["prompt_ids"] and r.n == n
        assert len(r.completion_ids) == len(r.sampler_logprobs) == len(r.finish_reasons) == len(r.texts) == P * n
        assert torch.equal(r.group_ids, torch.arange(P).repeat_interleave(n))
        assert torch.equal(r.to_padded(tok.pad_token_id)["group_ids"], r.group_ids)
        assert all(f in ("stop", "length") for f in r.finish_reasons)


@pytest.mark.timeout(120)
def test_fit_with_live_hf_engine_attaches_rollouts_to_the_training_batch(tmp_path, tok, policy):
    cb = RolloutCallback(engine="hf", drift_every_n_steps=1)
    spy = Spy(cb, probe_sequence(len(tok)))
    module = TinyRL(policy, tok, sampling=SamplingParams(n=3, max_new_tokens=8, seed=0))
    before = copy.deepcopy(policy.state_dict())
    train, val = loaders(tok)
    t = trainer(tmp_path, 3, callbacks=[cb, spy], limit_val_batches=1, num_sanity_val_steps=1, val_check_interval=2)
    t.fit(module, train, val)
    assert len(module.train_seen) == 3 and t.global_step == 3
    check_rollouts(module.train_seen, tok, 3)
    assert [s["batch_id"] for s in module.train_seen] == spy.batch_ids  # the very dict the hook mutated
    assert len(module.val_seen) == 2  # sanity check + the validation after step 2
    check_rollouts(module.val_seen, tok, 3)  # validation: batch["n_samples"] per prompt
    assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert spy.engine.stats().syncs == 1 + 3  # fit start + one per optimizer step
    assert all(d is not None and d < 1e-4 for d in spy.drifts)  # live module: on-policy
    assert {"rollout/seconds", "rollout/tokens_per_s", "rollout/drift", "rollout/fingerprint_err"} <= set(
        t.callback_metrics
    )
    assert "rollout/seconds" in t.progress_bar_metrics and "val_rollout/seconds" in t.callback_metrics
    assert cb.engine is None  # teardown closed the engine it built


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("sync_every", "accumulate", "batches"), [(1, 1, 3), (2, 1, 4), (1, 2, 4)])
def test_sync_follows_optimizer_steps(tmp_path, tok, policy, sync_every, accumulate, batches):
    """A separate inference copy: only syncs make it follow the policy."""
    engine = HFEngine(copy.deepcopy(policy), tok)
    cb = RolloutCallback(engine=engine, sync_every_n_steps=sync_every, drift_every_n_steps=1)
    spy = Spy(cb, probe_sequence(len(tok)))
    steps = batches // accumulate
    t = trainer(tmp_path, steps, callbacks=[cb, spy], accumulate_grad_batches=accumulate)
    t.fit(TinyRL(policy, tok, lr=0.2), loaders(tok)[0])
    assert engine.stats().syncs == 1 + steps // sync_every
    assert cb.engine is engine  # not owned: left open for the caller
    stale = [i for i in range(batches) if (i // accumulate) % sync_every != 0]  # batches sampled before a due sync
    for i, d in enumerate(spy.drifts):
        assert (d > 1e-3) if i in stale else (d < 1e-4), (i, d, spy.drifts)
    if steps % sync_every == 0:
        for k, v in engine.model.state_dict().items():
            torch.testing.assert_close(v, policy.state_dict()[k])


@pytest.mark.timeout(120)
def test_resume_resyncs_engine_from_restored_policy(tmp_path, tok, tiny_model_dir):
    probe = probe_sequence(len(tok))
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cb = RolloutCallback(engine="hf")
    t = trainer(tmp_path, 2, callbacks=[cb], enable_checkpointing=True)
    t.fit(TinyRL(policy, tok, lr=0.2, sampling=SamplingParams(n=2, max_new_tokens=6, seed=2)), loaders(tok)[0])
    ckpt = t.checkpoint_callback.best_model_path
    trained_lp = sequence_logprob(policy, *probe)

    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_dir)  # weights A; the checkpoint holds B
    engine = HFEngine(copy.deepcopy(fresh), tok)  # an engine started from A, like vLLM from disk
    cb2 = RolloutCallback(engine=engine)
    spy = Spy(cb2, probe)
    assert (torch.tensor(engine.probe_logprobs(*probe)) - trained_lp).abs().mean() > 1e-2
    t2 = trainer(tmp_path, 3, callbacks=[cb2, spy], enable_checkpointing=True)
    t2.fit(
        TinyRL(fresh, tok, lr=0.2, sampling=SamplingParams(n=2, max_new_tokens=6, seed=2)),
        loaders(tok)[0],
        ckpt_path=ckpt,
    )
    assert spy.first_batch_check < 1e-5  # engine == restored policy before the first generation
    assert spy.tokens_at_fit_start == cb.total_rollout_tokens > 0  # callback state restored
    assert cb2.total_rollout_tokens > cb.total_rollout_tokens


def test_standalone_validate_and_test_sync_and_sample_n_per_prompt(tmp_path, tok, policy):
    perturbed = copy.deepcopy(policy)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine = HFEngine(perturbed, tok)  # stale engine: validation must sync it first
    cb = RolloutCallback(engine=engine)
    module = TinyRL(policy, tok, sampling=SamplingParams(n=2, max_new_tokens=5), val_temperature=0.5)
    t = trainer(tmp_path, 1, callbacks=[cb], limit_val_batches=1)
    t.validate(module, loaders(tok, n_val=4)[1])
    check_rollouts(module.val_seen, tok, 4)
    assert engine.stats().syncs == 1 and cb.last_fingerprint_err < 1e-5
    t.test(module, loaders(tok, n_val=2)[1])  # test batches are served like validation ones
    assert len(module.val_seen) == 2 and module.val_seen[-1]["rollouts"].n == 2
    assert engine.stats().syncs == 1  # nothing changed since the last sync


def test_module_without_policy_is_a_clear_error(tmp_path, tok):
    class NoPolicy(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, batch_idx):
            return self.w.sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    match = (
        "RolloutCallback needs the LightningModule to provide RolloutHost: NoPolicy has no policy, tokenizer, sampling"
    )
    with pytest.raises(TypeError, match=match):
        trainer(tmp_path, 1, callbacks=[RolloutCallback(engine="hf")]).fit(NoPolicy(), loaders(tok)[0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sync_every_n_steps": 0}, "rollout.sync_every_n_steps must be >= 1"),
        ({"engine": "trt"}, r"rollout.engine: unknown rollout engine 'trt'; valid names"),
        (
            {"engine": "hf", "engine_options": {"max_batch_row": 4}},
            r"rollout.engine_options: unknown option\(s\) \['max_batch_row'\] of rollout engine 'hf'; accepted: \['decode', 'max_batch_rows', 'prefix_cache_mb'\]",
        ),
        ({"engine": "hf", "engine_options": {"model_path": "x"}}, r"\['model_path'\] are set by the callback itself"),
        ({"drift_every_n_steps": -1}, "drift_every_n_steps"),
    ],
)
def test_bad_options_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RolloutCallback(**kwargs)


def test_configurable_from_yaml_class_path():
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--callback", type=Callback)
    cfg = parser.parse_string(
        """
        callback:
          class_path: lit_rlvr.callbacks.RolloutCallback
          init_args: {engine: hf, sync_every_n_steps: 2, engine_options: {max_batch_rows: 8}}
        """
    )
    cb = parser.instantiate_classes(cfg).callback
    assert isinstance(cb, RolloutCallback) and cb.options.sync_every_n_steps == 2
    assert cb.options.engine_kind == "hf" and cb.options.engine_options == {"max_batch_rows": 8}
    assert cb.state_key == "RolloutCallback{'engine': 'hf'}"


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_fit_with_vllm_engine_syncs_every_step(tmp_path, tok, policy):
    if not vllm_available():
        pytest.skip("`import vllm` fails")
    t0 = time.perf_counter()
    kwargs = {"dtype": "float32", "max_model_len": 256, "kv_cache_memory_bytes": 32 * 2**20, "enforce_eager": True}
    cb = RolloutCallback(engine="vllm", engine_options=kwargs, fingerprint_atol=1e-4, drift_every_n_steps=1)
    spy = Spy(cb, probe_sequence(len(tok)))
    module = TinyRL(policy, tok, lr=0.2, sampling=SamplingParams(n=3, max_new_tokens=8, seed=0))
    before = copy.deepcopy(policy.state_dict())
    train, val = loaders(tok, n_train=4)
    t = trainer(tmp_path, 2, callbacks=[cb, spy], limit_val_batches=1)
    t.fit(module, train, val)
    check_rollouts(module.train_seen, tok, 3)
    check_rollouts(module.val_seen, tok, 3)
    assert type(spy.engine).__name__ == "VLLMEngine"
    assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert spy.engine.stats().syncs == 1 + 2
    assert cb.last_fingerprint_err < 1e-4  # vLLM == the trained policy (fp32) after the last sync
    assert all(d < 1e-4 for d in spy.drifts)  # on-policy sampling at every step
    assert cb.engine is None
    print(f"\n[vllm Trainer.fit test wall time: {time.perf_counter() - t0:.1f} s]")
