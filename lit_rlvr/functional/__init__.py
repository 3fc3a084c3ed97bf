"""The functional core: pure torch functions, no Lightning, no config objects (STYLE.md §2).

Registries: :data:`lit_rlvr.functional.advantages.ADVANTAGES`,
:data:`lit_rlvr.functional.divergences.DIVERGENCES`.
"""

from lit_rlvr.functional.passk import pass_at_k

__all__ = ["pass_at_k"]
