"""The methods the studies compare: each one's main knob and its sweep (``METHODS``, ``BASELINE_KNOBS``),
the names the reports give them, and each method's expected direction against GRPO from its paper (``EXPECTED``,
written before any run of the methods preset or study 3), with the check that reads it on paired runs.
"""

from __future__ import annotations

from study_runner import HELD_OUT
from study_stats import paired, sign_line


# The entropy and diversity methods (docs/methods.md §8): config, the flags of its one main knob at
# a value, and the knob's sweep (the config's own value first: its runs are the variant named after
# the method; the others are <method>_<value>). PSR and NSR have no knob.
def _options(key: str, template: str):
    return lambda v: [f"--model.{key}={{{template.format(v=v)}}}"]


METHODS = {
    "clip_cov": (
        _options("loss.policy_loss_options", "clip_cov_ratio: {v}, clip_cov_lb: 1.0, clip_cov_ub: 5.0"),
        ["0.02", "0.005", "0.05"],
    ),
    "kl_cov": (_options("loss.policy_loss_options", "kl_cov_ratio: {v}, ppo_kl_coef: 1.0"), ["0.02", "0.005", "0.05"]),
    "forking_tokens": (_options("loss.token_mask_options", "top_entropy_quantile: {v}"), ["0.2", "0.1", "0.5"]),
    "entropy_bonus": (_options("entropy.options", "entropy_coef: {v}"), ["0.01", "0.003", "0.03"]),
    "entropy_adaptive": (
        _options(
            "entropy.options",
            "entropy_coef: 0.0, entropy_target: {v}, entropy_coef_delta: 0.002, entropy_coef_max: 0.05",
        ),
        ["0.3", "0.2", "0.4"],
    ),
    "psr": (None, []),
    "nsr": (None, []),
    "w_reinforce": (_options("loss.advantage_options", "positive_advantage_weight: {v}"), ["0.1", "0.03", "0.3"]),
    "unlikeliness": (_options("loss.advantage_options", "rank_penalty: {v}"), ["0.25", "0.1", "0.5"]),
}

# Each method's expected direction against GRPO on held-out countdown (paired differences on the same
# base × seed), from its paper, written before any run of the methods preset: "+" above GRPO (95% CI
# above 0), "-" below (CI below 0), "=" not distinguishable (CI contains 0).
EXPECTED = {
    "clip_cov": {"pass@1": "+", "pass@16": "+"},  # Cui et al.: higher entropy and accuracy than GRPO
    "kl_cov": {"pass@1": "+", "pass@16": "+"},
    "forking_tokens": {"pass@1": "=", "pass@16": "+"},  # Wang et al.: on par at 8B, better at 14B/32B; entropy kept
    "entropy_bonus": {"pass@1": "=", "pass@16": "+"},  # Cui et al.: sensitive; keeps entropy when it works
    "entropy_adaptive": {
        "pass@1": "=",
        "pass@16": "+",
    },  # Skywork-OR1: entropy held near the target, no loss in accuracy
    "psr": {"pass@1": "=", "pass@16": "-"},  # Zhu et al.: PSR sharpens, pass@k at large k falls
    "nsr": {"pass@1": "=", "pass@16": "+"},  # Zhu et al.: NSR keeps pass@k over the whole k range
    "w_reinforce": {"pass@1": "=", "pass@16": "+"},
    "unlikeliness": {"pass@1": "=", "pass@16": "+"},  # He et al.: pass@N up, pass@1 kept
    # the baselines, added by study 3's plan (benchmarks/results/study3_plan.md) before its runs:
    # DAPO (arXiv 2503.14476): dynamic sampling reaches the accuracy sooner; its clip-higher is in this GRPO already
    "dapo": {"pass@1": "+", "pass@16": "="},
    # DPH-RL (arXiv 2509.07430), Llama-3.1-8B on Spider, pass@1 / pass@16: GRPO 73.0 / 80.6, RKL 71.0 / 80.6,
    # DPH-F 77.4 / 85.7, DPH-JS 76.0 / 84.1
    "rkl": {"pass@1": "-", "pass@16": "="},
    "dph_f": {"pass@1": "+", "pass@16": "+"},
    "dph_js": {"pass@1": "+", "pass@16": "+"},
    # Pass@k Training (arXiv 2508.10751): pass@k up without hurting pass@1; Eq. 18's mix keeps that exploration;
    # "P@k T. + P@1 T." on Enigmata 30.8 / 40.6 (pass@1 / pass@k) vs Pass@1 training's 12.9 / 21.3
    "passk": {"pass@1": "=", "pass@16": "+"},
    "passk_combined": {"pass@1": "=", "pass@16": "+"},
    "passk_then_pass1": {"pass@1": "+", "pass@16": "+"},
}


def _switch(step: str) -> list[str]:
    """Pass@k → Pass@1 switching at ``step`` (the phases of configs/demo/passk_then_pass1.yaml, its last callback)."""
    return [
        f"--trainer.callbacks.init_args.phases=[{{start_step: 0, advantage: passk, options: {{k: 4}}}}, "
        f"{{start_step: {step}, advantage: grpo, options: {{std: population}}}}]"
    ]


# The baselines' one main knob, as METHODS (study 3's part C; the config's value first)
BASELINE_KNOBS = {
    "grpo": (lambda v: [f"--model.optimizer.init_args.lr={v}"], ["1e-4", "5e-5", "2e-4"]),
    "dapo": (lambda v: [f"--model.loss.clip_high={v}"], ["0.28", "0.2", "0.4"]),
    "rkl": (lambda v: [f"--model.kl.coef={v}"], ["0.05", "0.01", "0.2"]),
    "dph_f": (lambda v: [f"--model.anchor.coef={v}"], ["1.0", "0.5", "2.0"]),
    "dph_js": (lambda v: [f"--model.anchor.coef={v}"], ["4.0", "2.0", "8.0"]),
    "passk": (_options("loss.advantage_options", "k: {v}"), ["4", "2", "8"]),
    "passk_combined": (_options("loss.advantage_options", "k: {v}"), ["4", "2", "8"]),
    "passk_then_pass1": (_switch, ["80", "40", "120"]),
}
KNOBS = {**BASELINE_KNOBS, **METHODS}
KNOB_NAMES = {
    "grpo": "lr",
    "dapo": "clip_high",
    "rkl": "β",
    "dph_f": "η",
    "dph_js": "η",
    "passk": "k",
    "passk_combined": "k",
    "passk_then_pass1": "switch step",
    "clip_cov": "clip_cov_ratio",
    "kl_cov": "kl_cov_ratio",
    "forking_tokens": "top_entropy_quantile",
    "entropy_bonus": "entropy_coef",
    "entropy_adaptive": "entropy_target",
    "w_reinforce": "λ",
    "unlikeliness": "rank_penalty",
}
NAMES = {
    "grpo": "GRPO",
    "dapo": "DAPO",
    "rkl": "RKL",
    "dph_f": "DPH-F",
    "dph_js": "DPH-JS",
    "passk": "Pass@k",
    "passk_combined": "Pass@k combined",
    "passk_then_pass1": "Pass@k → Pass@1",
    "clip_cov": "Clip-Cov",
    "kl_cov": "KL-Cov",
    "forking_tokens": "forking tokens",
    "entropy_bonus": "entropy bonus",
    "entropy_adaptive": "adaptive entropy",
    "psr": "PSR",
    "nsr": "NSR",
    "w_reinforce": "W-REINFORCE",
    "unlikeliness": "unlikeliness",
    "max_rl": "MaxRL",
    "ucpo": "UCPO",
    # study 6's hybrids (benchmarks/study6.py) and study 7's bonus arm (benchmarks/study7.py)
    "dph_f_ucpo": "DPH-F + UCPO",
    "dph6_passk_combined": "DPH-F(6) + Pass@k combined",
    "tool_call": "GRPO + tool-call bonus",
}


def sweep_variants(method: str) -> list[str]:
    """The variants of ``method``'s sweep, by knob value (the config's value is the variant ``method``).

    Example:
        >>> sweep_variants("w_reinforce"), sweep_variants("nsr"), sweep_variants("grpo")
        (['w_reinforce_0.03', 'w_reinforce', 'w_reinforce_0.3'], ['nsr'], ['grpo_5e-5', 'grpo', 'grpo_2e-4'])
    """
    values = KNOBS[method][1]
    return [v for _, v in sorted((float(x), f"{method}_{x}" if i else method) for i, x in enumerate(values))] or [
        method
    ]


def direction_check(by: dict, variant: str, k: int, want: str | None, label: str, against: str = "grpo") -> str:
    """The held-out pass@k difference ``variant`` − ``against`` over the pairs on the same base × seed, the sign
    :func:`sign_seen` gives and, when ``want`` (the allowed signs, e.g. ``"+="``) is given, MET or MISS."""
    diffs = paired(by, variant, f"val/{HELD_OUT}/pass@{k}", against)
    if not diffs:
        return f"- {label} pass@{k}: not run"
    return sign_line(diffs, f"{label} pass@{k} − {NAMES.get(against, against)}", want)


def expectation_check(by: dict, method: str, k: int, variant: str | None = None) -> str:
    """One pre-registered expectation against the paired differences to GRPO: MET or a miss, with the numbers
    (``variant``: the runs read, when not the method's own, e.g. DPH-F at part A's coverage)."""
    label = f"{method} ({variant})" if variant else method
    return direction_check(by, variant or method, k, EXPECTED[method][f"pass@{k}"], label)
