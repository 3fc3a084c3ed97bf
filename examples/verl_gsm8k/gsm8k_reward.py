"""A verl custom reward function for GSM8K, in verl's ``compute_score`` signature.

verl loads it with ``reward.custom_reward_function.path=examples/verl_gsm8k/gsm8k_reward.py``
(``.name=compute_score``); lit_rlvr calls it unchanged from ``model.scoring.reward_funcs:
[examples/verl_gsm8k/gsm8k_reward.py:compute_score]`` (configs/migrate/verl_gsm8k.yaml).
Like verl's built-in GSM8K scorer: the last ``#### <number>`` of the response is the answer.
"""

import re

_FINAL = re.compile(r"#### (\-?[0-9\.\,]+)")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, format_score=0.0, score=1.0):
    """``score`` for the right number after ``####``, ``format_score`` for a wrong one, 0 for none.

    Returns a dict, as verl allows: ``score`` is the reward, the other keys are extra information.
    """
    found = _FINAL.findall(solution_str[-300:])  # the answer is at the end; long responses are not scanned whole
    if not found:
        return {"score": 0.0, "has_answer": False}
    answer = found[-1].replace(",", "").replace("$", "")
    return {"score": score if answer == ground_truth else format_score, "has_answer": True}
