"""The functional core: pure torch functions, no Lightning, no config objects (CONTRIBUTING.md, "A functional core in thin shells").

Data flow: rollouts → rewards → :mod:`~lit_rlvr.functional.advantages` (+ :mod:`~lit_rlvr.functional.ucpo`) →
:mod:`~lit_rlvr.functional.losses` (+ :mod:`~lit_rlvr.functional.covariance`,
:mod:`~lit_rlvr.functional.entropy`, :mod:`~lit_rlvr.functional.divergences`) →
:mod:`~lit_rlvr.functional.metrics`. Registries: ``ADVANTAGES``, ``POLICY_LOSSES``,
``TOKEN_MASKS``, ``ENTROPY_CONTROLS``, ``DIVERGENCES``, ``AGGREGATIONS``, ``KL_ESTIMATORS``.
"""

from lit_rlvr.functional import (
    covariance,  # noqa: F401  (registers clip_cov and kl_cov)
    ucpo,  # noqa: F401  (registers the ucpo advantage)
)
from lit_rlvr.functional.advantages import ADVANTAGES, register_advantage
from lit_rlvr.functional.divergences import DIVERGENCES, f_divergence, register_divergence
from lit_rlvr.functional.entropy import ENTROPY_CONTROLS, TOKEN_MASKS, entropy_bonus
from lit_rlvr.functional.logprobs import token_entropy, token_logprobs
from lit_rlvr.functional.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregate,
    kl_estimate,
    policy_loss,
    register_policy_loss,
)
from lit_rlvr.functional.passk import pass_at_k

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "DIVERGENCES",
    "ENTROPY_CONTROLS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "TOKEN_MASKS",
    "aggregate",
    "entropy_bonus",
    "f_divergence",
    "kl_estimate",
    "pass_at_k",
    "policy_loss",
    "register_advantage",
    "register_divergence",
    "register_policy_loss",
    "token_entropy",
    "token_logprobs",
]
