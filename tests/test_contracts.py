"""The typed contracts between the pieces: batches, and what callbacks require of the module."""

from __future__ import annotations

import pytest


def test_the_module_provides_what_every_callback_requires(tiny_model_dir):
    from lit_rlvr.contracts import AdvantageHost, PolicyHost, RolloutHost
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import PolicyOptions, SamplingParams, ScoringOptions

    module = RLVRModule(PolicyOptions(str(tiny_model_dir)), sampling=SamplingParams(n=4, max_new_tokens=8, seed=3),
                        scoring=ScoringOptions(workers=0))  # fmt: skip
    for protocol in (PolicyHost, RolloutHost, AdvantageHost):
        assert isinstance(module, protocol), protocol.__name__
    assert module.val_sampling.n == 1 and module.val_sampling.seed == 3 and module.val_sampling.max_new_tokens == 8
    assert module.lockstep(5) == 5  # one process


def test_require_names_every_missing_member():
    from lit_rlvr.contracts import AdvantageHost, RolloutHost, require

    class Half:
        policy, tokenizer = object(), object()

    with pytest.raises(TypeError, match="RolloutHost: Half has no sampling, val_sampling, micro_batching, lockstep"):
        require(Half(), RolloutHost, "RolloutCallback")
    with pytest.raises(TypeError, match="AdvantageHost: Half has no advantage_name, advantage_options, set_advantage"):
        require(Half(), AdvantageHost, "AdvantageSchedule")


def test_the_module_refuses_a_batch_that_is_not_the_contracts(tiny_model_dir):
    from lit_rlvr.module import _require_rollouts

    with pytest.raises(TypeError, match="RLVRModule takes lit_rlvr.contracts.TrainBatch / ValBatch batches"):
        _require_rollouts({"rows": [], "prompt_ids": []})


def test_a_datamodule_whose_tokenizer_is_not_the_policys_is_refused(tiny_model_dir, tmp_path):
    from lit_rlvr.demo.tiny import build_char_tokenizer
    from lit_rlvr.module import _check_tokenizer

    other = build_char_tokenizer("0123456789")
    policy_tok = build_char_tokenizer()

    class DM:
        tokenizer = other

    with pytest.raises(ValueError, match="data.tokenizer .* does not tokenize like the policy's"):
        _check_tokenizer(DM(), policy_tok)
    DM.tokenizer = build_char_tokenizer()
    _check_tokenizer(DM(), policy_tok)  # an equal tokenizer passes
