"""Engine-independent pieces: drift, probe, fingerprint check, timeouts, the factory."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
from torch import nn

from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama
from lit_rlvr.policy import sequence_logprob
from lit_rlvr.rollout import (
    HFEngine,
    WeightSyncError,
    build_engine,
    check_fingerprint,
    logprob_drift,
    probe_sequence,
    run_with_timeout,
)
from lit_rlvr.rollout import engine as engine_mod


@pytest.mark.parametrize(("B", "T"), [(1, 1), (3, 5), (8, 17)])
@pytest.mark.parametrize("seed", [0, 1])
def test_logprob_drift_matches_loop_reference(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    s, t = -torch.rand(B, T, generator=g) * 5, -torch.rand(B, T, generator=g) * 5
    mask = (torch.rand(B, T, generator=g) > 0.3).long()
    total, count = 0.0, 0
    for b in range(B):
        for j in range(T):
            if mask[b, j]:
                total += abs(s[b, j].item() - t[b, j].item())
                count += 1
    expected = total / count if count else 0.0
    assert logprob_drift(s, t, mask).item() == pytest.approx(expected, abs=1e-6)


def test_logprob_drift_edge_cases():
    x = torch.zeros(2, 3)
    assert logprob_drift(x, x + 1, torch.zeros(2, 3)).item() == 0.0  # fully masked
    assert logprob_drift(x, x, torch.ones(2, 3)).item() == 0.0
    with pytest.raises(ValueError, match="shapes must match"):
        logprob_drift(x, torch.zeros(2, 4), torch.ones(2, 3))


@pytest.mark.parametrize("seed", [0, 5])
def test_probe_sequence_is_fixed_and_in_vocab(seed):
    a = probe_sequence(50, 4, 6, seed)
    assert a == probe_sequence(50, 4, 6, seed) and a != probe_sequence(50, 4, 6, seed + 1)
    assert len(a[0]) == 4 and len(a[1]) == 6 and all(0 <= t < 50 for t in a[0] + a[1])
    with pytest.raises(ValueError, match="vocab_size"):
        probe_sequence(0)


class ShiftedEngine:
    """The model's probe log-probs plus a constant: a stand-in for an engine with slightly different weights."""

    name = "shifted"

    def __init__(self, model, shift):
        self.model, self.shift = model, shift

    def probe_logprobs(self, prompt_ids, completion_ids):
        return (sequence_logprob(self.model, prompt_ids, completion_ids) + self.shift).tolist()


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    return tok, build_tiny_llama(tok, num_layers=1, seed=0)


@pytest.mark.parametrize(
    ("shift", "atol", "fails"), [(0.0, 1e-6, False), (5e-4, 1e-3, False), (2e-3, 1e-3, True), (float("nan"), 1.0, True)]
)
def test_check_fingerprint_threshold(tiny, shift, atol, fails):
    tok, model = tiny
    probe = probe_sequence(len(tok))
    engine = ShiftedEngine(model, shift)
    if fails:
        with pytest.raises(WeightSyncError, match="tolerance"):
            check_fingerprint(engine, model, probe, atol)
    else:
        assert check_fingerprint(engine, model, probe, atol) == pytest.approx(abs(shift), abs=1e-6)


def test_check_fingerprint_restores_train_mode(tiny):
    tok, model = tiny
    model.train()
    check_fingerprint(ShiftedEngine(model, 0.0), model, probe_sequence(len(tok)))
    assert model.training
    model.eval()


def test_run_with_timeout_passes_results_and_errors():
    assert run_with_timeout(lambda: "ok", 5.0, "x") == "ok"
    assert run_with_timeout(lambda: "ok", None, "x") == "ok"
    with pytest.raises(KeyError):
        run_with_timeout(lambda: {}["missing"], 5.0, "x")


def test_run_with_timeout_interrupts_a_python_loop_with_a_clear_message():
    def spin():
        while True:
            time.sleep(0.005)

    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"rollout generate did not finish within 0\.1 s \(generate_timeout_s\)"):
        run_with_timeout(spin, 0.1, "rollout generate", "generate_timeout_s")
    assert time.perf_counter() - t0 < 2.0


def test_run_with_timeout_leaves_no_late_exception():
    """Calls that finish right at the limit must never leak the watchdog's exception afterwards."""
    for _ in range(50):
        try:
            run_with_timeout(lambda: time.sleep(0.002), 0.002, "race")
        except TimeoutError:
            pass
        time.sleep(0.004)  # a leaked async exception would surface here, outside pytest.raises


def test_run_with_timeout_works_outside_the_main_thread():
    result = {}

    def worker():
        try:
            run_with_timeout(lambda: [time.sleep(0.005) for _ in range(1000)], 0.05, "worker call")
        except TimeoutError as err:
            result["err"] = str(err)

    th = threading.Thread(target=worker)
    th.start()
    th.join(5)
    assert "worker call did not finish" in result["err"]


@pytest.mark.parametrize("value", [0, -1.0])
def test_engine_rejects_bad_timeouts(tiny, value):
    tok, model = tiny
    with pytest.raises(ValueError, match="generate_timeout_s must be > 0"):
        HFEngine(model, tok, generate_timeout_s=value)


def test_build_engine_hf_and_errors(tiny):
    tok, model = tiny
    assert isinstance(build_engine("hf", model=model, tokenizer=tok), HFEngine)
    with pytest.raises(
        ValueError, match=r"engine: unknown rollout engine 'trt'; valid names: \['auto', 'hf', 'vllm', 'vllm_server'\]"
    ):
        build_engine("trt", model=model, tokenizer=tok)
    with pytest.raises(ValueError, match="needs the live policy model and its tokenizer"):
        build_engine("hf", model=model)
    with pytest.raises(ValueError, match="needs model_path or the policy model"):
        build_engine("vllm")


def test_build_engine_auto_falls_back_to_hf_with_one_line(tiny, monkeypatch, caplog):
    tok, model = tiny
    monkeypatch.setattr(engine_mod, "vllm_available", lambda: False)
    lightning_logger = logging.getLogger("lightning.pytorch")
    lightning_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO):
            eng = build_engine("auto", model=model, tokenizer=tok)
    finally:
        lightning_logger.removeHandler(caplog.handler)
    assert isinstance(eng, HFEngine)
    assert "vLLM is not importable; rollouts use the transformers fallback" in caplog.text
    assert "HFEngine" in caplog.text


def test_build_engine_auto_prefers_vllm_and_finds_the_policy_path(tiny, monkeypatch, tmp_path):
    """Routing only (the real VLLMEngine is exercised in test_engines.py): record the constructor call."""
    import lit_rlvr.rollout.vllm as vllm_mod

    tok, model = tiny
    calls = []
    monkeypatch.setattr(engine_mod, "vllm_available", lambda: True)
    monkeypatch.setattr(vllm_mod, "VLLMEngine", lambda path, **kw: calls.append((path, kw)) or "vllm-engine")
    model.save_pretrained(tmp_path)
    saved = type(model).from_pretrained(tmp_path)
    assert build_engine("auto", model=saved, tokenizer=tok, dtype="float32") == "vllm-engine"
    assert calls == [(str(tmp_path), {"dtype": "float32", "adapter": None})]  # a plain policy: merged syncs


def test_engine_stats_accumulate(tiny):
    from lit_rlvr.rollout import SamplingParams

    tok, model = tiny
    eng = HFEngine(model, tok)
    r = eng.generate([[5, 6]], SamplingParams(n=2, max_new_tokens=4, seed=0))
    eng.update_weights(model)  # live module: a no-op that still counts as a sync
    s = eng.stats()
    assert s.generated_tokens == r.num_tokens() and s.generate_calls == 1 and s.syncs == 1
    with pytest.raises(ValueError, match="empty"):
        eng.generate([[5], []], SamplingParams())


def test_hf_engine_update_from_a_different_architecture_is_refused(tiny):
    tok, model = tiny
    eng = HFEngine(build_tiny_llama(tok, num_layers=1, seed=1), tok)
    with pytest.raises(KeyError, match="no counterpart"):
        eng.update_weights(nn.Linear(2, 2))
