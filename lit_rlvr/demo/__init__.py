"""The CPU demo: synthetic verifiable tasks, a tiny char-level Llama and its supervised warm start.

Nothing here is needed to train real models; it is the embedded example (``make demo``) and the
testbed of the diversity-collapse benchmark, and it plugs into lit_rlvr the way a user's own
package does (``imports: [lit_rlvr.demo]`` in ``configs/demo/``), which registers the
``countdown`` reward and the ``countdown`` environment:

- :mod:`lit_rlvr.demo.countdown` — countdown-3 and addition tasks, the ``countdown`` reward.
- :mod:`lit_rlvr.demo.agents` — the multi-turn countdown checker, the ``countdown`` environment.
- :mod:`lit_rlvr.demo.sql_toy` — a generated SQLite database and its questions.
- :mod:`lit_rlvr.demo.data` — ``lit-rlvr demo-data``: the task files.
- :mod:`lit_rlvr.demo.tiny` — a character tokenizer and a tiny Llama (tests, benchmarks, demo).
- :mod:`lit_rlvr.demo.warmstart` — ``lit-rlvr warmstart``: the supervised base policy.
"""

from lit_rlvr.demo import agents as agents
from lit_rlvr.demo import countdown as countdown

__all__ = ["agents", "countdown"]
