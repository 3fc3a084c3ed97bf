"""The functional core: pure torch functions, no Lightning, no config objects (STYLE.md §2).

Data flow: rollouts → rewards → :mod:`~lit_rlvr.functional.advantages` →
:mod:`~lit_rlvr.functional.losses` (+ :mod:`~lit_rlvr.functional.divergences`) →
:mod:`~lit_rlvr.functional.metrics`. Registries: ``ADVANTAGES``, ``DIVERGENCES``,
``AGGREGATIONS``, ``KL_ESTIMATORS``.
"""

from lit_rlvr.functional.advantages import ADVANTAGES, register_advantage
from lit_rlvr.functional.divergences import DIVERGENCES, f_divergence, register_divergence
from lit_rlvr.functional.logprobs import token_entropy, token_logprobs
from lit_rlvr.functional.losses import AGGREGATIONS, KL_ESTIMATORS, aggregate, kl_estimate, policy_loss
from lit_rlvr.functional.passk import pass_at_k

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "DIVERGENCES",
    "KL_ESTIMATORS",
    "aggregate",
    "f_divergence",
    "kl_estimate",
    "pass_at_k",
    "policy_loss",
    "register_advantage",
    "register_divergence",
    "token_entropy",
    "token_logprobs",
]
