"""The loop's tokens and masks equal the peers' for the same turns: SkyRL's generator and TRL's tool-call loop."""

from __future__ import annotations

import types

import pytest

from lit_rlvr.envs import resolve_environment
from lit_rlvr.rollout.turns import TurnLoop, TurnOptions
from lit_rlvr.rollout.types import SamplingParams

pytest.importorskip("skyrl_gym")
STOP = ("</sql>", "</solution>")


# ----------------------------------------------------------------------------- SkyRL


def skyrl_agent_loop(tok, env, prompt_messages, next_turn, stop=STOP):
    """SkyRL's ``SkyRLGymGenerator.agent_loop`` token bookkeeping with ``use_conversation_multi_turn: true`` and
    ``append_eos_token_after_stop_str_in_multi_turn: true``, transcribed from NovaSky-AI/SkyRL
    skyrl-train/skyrl_train/generators/skyrl_gym_generator.py (``TurnOutput.get_turn_loss_mask``,
    ``get_obs_ids_from_obs``, ``_update_agent_loop_state_with_multiturn_chat_template``, the final trim at
    ``response_end_idx``): returns (prompt_ids, response_ids, loss_mask, whether SkyRL added an EOS to the last turn)."""
    base_conversation = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "I am a user."},
    ]
    base_ids = tok.apply_chat_template(base_conversation, add_generation_prompt=False, tokenize=True, return_dict=False)
    if tok.eos_token_id in base_ids:
        base_ids = base_ids[: len(base_ids) - 1 - base_ids[::-1].index(tok.eos_token_id) + 1]
    chat_history, _ = env.init([dict(m) for m in prompt_messages])
    input_ids = tok.apply_chat_template(chat_history, add_generation_prompt=True, tokenize=True, return_dict=False)
    prompt_len = len(input_ids)
    loss_mask, response_end_idx, done = [], None, False
    while not done:
        output_ids = list(next_turn(input_ids))
        output = tok.decode(output_ids, skip_special_tokens=True)
        added_eos = False
        if output.endswith(stop) and output_ids[-1] != tok.eos_token_id:
            output_ids.append(tok.eos_token_id)
            added_eos = True
        step = env.step(output)
        new_obs, done = step["observations"], step["done"]
        if new_obs:
            obs_ids = tok.apply_chat_template(
                [*base_conversation, *new_obs], add_generation_prompt=not done, tokenize=True, return_dict=False
            )[len(base_ids) :]
        else:
            obs_ids = []
        turn_mask = ([1] * len(output_ids) if not added_eos else [1] * (len(output_ids) - 1) + [0]) + [0] * len(obs_ids)
        input_ids = input_ids + output_ids
        response_end_idx = len(input_ids) - 1
        input_ids = input_ids + obs_ids
        loss_mask += turn_mask
    end = response_end_idx - prompt_len + 1
    return input_ids[:prompt_len], input_ids[prompt_len : response_end_idx + 1], loss_mask[:end], added_eos


def skyrl_sqlenv(root, gold, max_turns):
    from omegaconf import OmegaConf
    from skyrl_gym.envs.sql.env import SQLEnv

    extras = {
        "db_id": "concert_singer",
        "reward_spec": {"method": "rule", "ground_truth": gold},
        "data": "spider",
        "max_turns": max_turns,
    }
    return SQLEnv(OmegaConf.create({"db_path": str(root)}), extras=extras)


def test_skyrl_sqlenv_trajectories_have_skyrls_tokens_and_loss_mask(tool_tokenizer, skyrl_sql_root, scripted):
    tok = tool_tokenizer
    gold = "SELECT count(*) FROM singer"
    question = [{"role": "user", "content": "How many singers do we have?"}]
    prompt = tok.apply_chat_template(question, add_generation_prompt=True, tokenize=True, return_dict=False)
    encode = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    scripts = [
        [
            encode("<think>count</think>\n<sql>SELECT count(*) FROM singer</sql>"),
            encode(f"<think>6</think>\n<solution>{gold}</solution>"),
        ],
        [
            encode("<think>look</think>\n<sql>SELECT nope FROM singer</sql>"),
            encode("<think>fix</think>\n<sql>SELECT name FROM singer</sql>"),
            encode("<think>guess</think>\n<solution>SELECT 5</solution>") + [tok.eos_token_id],
        ],
        [encode("<think>direct</think>\n<solution>SELECT count(*) FROM singer</solution>") + [tok.eos_token_id]],
        [
            encode("<think>a</think><sql>SELECT 1</sql>"),
            encode("<think>b</think><sql>SELECT 2</sql>"),
            encode("<think>c</think><sql>SELECT 3</sql>"),
        ],
    ]
    engine = scripted(tok, {tuple(prompt): scripts})
    max_turns = 3
    spec = resolve_environment(
        "skyrl", {"env": "text2sql", "env_config": {"db_path": str(skyrl_sql_root)}, "conversation": True}
    )
    row = {"id": "spider-0", "prompt": question, "answer": gold, "db_id": "concert_singer", "data": "spider"}
    ours = TurnLoop(tok, TurnOptions(max_turns=max_turns, max_total_tokens=4096)).generate(
        engine, [prompt], [row], SamplingParams(n=len(scripts), max_new_tokens=256, stop=STOP), spec
    )
    for k, script in enumerate(scripts):
        turns = iter(script)
        env = skyrl_sqlenv(skyrl_sql_root, gold, max_turns)
        prompt_ids, response_ids, loss_mask, closed_last = skyrl_agent_loop(
            tok, env, question, lambda _ids: next(turns)
        )
        if (
            closed_last
        ):  # SkyRL also closes a last turn that ended at a stop string (a masked EOS); nothing follows it here
            assert (response_ids[-1], loss_mask[-1]) == (tok.eos_token_id, 0)
            response_ids, loss_mask = response_ids[:-1], loss_mask[:-1]
        assert prompt_ids == prompt
        assert ours.completion_ids[k] == response_ids, k
        assert ours.loss_mask[k] == loss_mask, k
    assert [e.reward for e in ours.episodes] == [1.0, 0.0, 1.0, -1.0]
    assert [e.status for e in ours.episodes] == ["done"] * 4 and [e.turns for e in ours.episodes] == [2, 3, 1, 3]


# ----------------------------------------------------------------------------- TRL


def trl_tool_call_loop(tok, prompt_messages, prompt_ids, first_ids, first_logprobs, next_turns, envs, iterations):
    """TRL's own ``GRPOTrainer._tool_call_loop`` (trl 1.16), run on a stand-in for the trainer that holds what the
    loop reads: the per-sample tool dicts of the environments, the tokenizer, and generation by ``next_turns``."""
    from trl import GRPOTrainer
    from trl.chat_template_utils import add_response_schema, parse_response

    add_response_schema(tok)
    tools = [type(envs[0]).increment]
    trainer = types.SimpleNamespace(
        max_tool_calling_iterations=iterations,
        use_vllm=False,
        _is_vlm=False,
        max_completion_length=4096,
        model=types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=8192)),
        environment_factories=None,
        tools=tools,
        _tokenizer=tok,
        processing_class=tok,
        chat_template=None,
        chat_template_kwargs={},
        _sync_tool_dicts=[{"increment": env.increment} for env in envs],
        _async_tool_dicts=[{} for _ in envs],
    )
    trainer._get_tool_suffix_ids = GRPOTrainer._get_tool_suffix_ids.__get__(trainer)
    trainer._generate_single_turn = lambda ids, images, fields, num_generations, has_tool_images=False: next_turns(ids)
    completions = [[parse_response(tok, ids, prefix=prompt_ids, tools=tools)] for ids in first_ids]
    prompts = [[dict(m) for m in prompt_messages] for _ in first_ids]
    tool_mask, _, completion_ids, logprobs, calls, failures, _ = GRPOTrainer._tool_call_loop(
        trainer,
        prompts,
        [list(prompt_ids) for _ in first_ids],
        [list(c) for c in first_ids],
        completions,
        [list(lp) for lp in first_logprobs],
        None,
        {},
    )
    return completion_ids, tool_mask, logprobs, calls, failures


def test_trl_environment_trajectories_have_trls_tokens_tool_mask_and_logprobs(tool_tokenizer, trl_counter, scripted):
    from trl.chat_template_utils import add_response_schema

    tok = add_response_schema(tool_tokenizer)
    question = [{"role": "user", "content": "Add 3 and 4 with the counter."}]
    prompt = tok.apply_chat_template(
        question, tools=[trl_counter.env.increment], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    encode = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    scripts = [
        [encode(trl_counter.call(3)), encode(trl_counter.call(4)), encode("The counter is 7.<|im_end|>")],
        [encode("It is 7.<|im_end|>")],
        [
            encode(trl_counter.call(500)),
            encode(trl_counter.call(7)),
            encode(trl_counter.call(1)),
        ],  # a failing call, then more calls than TRL iterates
    ]
    engine = scripted(tok, {tuple(prompt): scripts})
    iterations = 2
    row = {"id": "t", "prompt": question, "answer": "7"}
    ours = TurnLoop(tok, TurnOptions(max_turns=iterations + 1, max_total_tokens=4096)).generate(
        engine,
        [prompt],
        [row],
        SamplingParams(n=len(scripts), max_new_tokens=256),
        resolve_environment(trl_counter.path),
    )
    first = engine.outputs[0]

    def next_turns(prefixes):
        out = engine.generate(prefixes, SamplingParams(n=1, max_new_tokens=256))
        return out.completion_ids, out.sampler_logprobs

    envs = [trl_counter.env() for _ in scripts]
    for env in envs:
        env.reset(**row)
    first_lp = [[-0.5 - 0.01 * j for j in range(len(ids))] for ids in first]
    completion_ids, tool_mask, logprobs, calls, failures = trl_tool_call_loop(
        tok, question, prompt, first, first_lp, next_turns, envs, iterations
    )
    assert ours.completion_ids == completion_ids
    assert ours.loss_mask == tool_mask
    assert ours.sampler_logprobs == logprobs
    assert (
        sum(len(e.tool_calls) for e in ours.episodes) == calls == 4
        and sum(e.tool_errors for e in ours.episodes) == failures == 1
    )
    assert [e.reward for e in ours.episodes] == [env.get_reward() for env in envs] == [1.0, 0.0, 1.0]
