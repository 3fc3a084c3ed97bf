"""π_ref, the frozen initial policy, wherever the recipe needs it: the online KL and the cache's identity.

DPH-RL needs no reference model during training: its π_ref log-probs come from the offline cache,
which must have been built by this run's initial policy. The online reverse-KL baseline (RKL,
docs/methods.md §1) needs π_ref on the policy's own samples every step. Both depend on whether
the policy is a LoRA adapter, and that choice is made here only:

- with LoRA, π_ref is the policy with its adapter disabled (no copy: the base weights are frozen);
- without, π_ref is a frozen copy of the initial policy, taken at set-up — before a checkpoint
  is restored, so a resumed run keeps the initial policy as its reference, not the resumed one.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

from torch import nn

from lit_rlvr.policy.loading import is_peft_model


class ReferencePolicy:
    """The initial policy π_ref of ``policy``.

    Not a submodule of the LightningModule: never trained, never saved in checkpoints.

    Args:
        policy: the trained policy (a transformers causal LM, possibly peft-wrapped).
        online: π_ref runs during training (the KL penalty): a non-LoRA policy is copied.

    Example:
        >>> import torch
        >>> policy = torch.nn.Linear(2, 2)
        >>> ref = ReferencePolicy(policy, online=True)
        >>> ref.setup()
        >>> with torch.no_grad():
        ...     _ = policy.weight.add_(1.0)  # training moves the policy ...
        >>> with ref.active() as model:
        ...     bool((model.weight == policy.weight).any())  # ... not π_ref
        False
    """

    def __init__(self, policy: nn.Module, online: bool):
        self.policy = policy
        self.online = online
        self.lora = is_peft_model(policy)
        self._copy: nn.Module | None = None

    def setup(self) -> None:
        """Freeze π_ref now (call before any optimizer step and before restoring a checkpoint)."""
        if self.online and not self.lora and self._copy is None:
            self._copy = copy.deepcopy(self.policy).eval().requires_grad_(False)

    def to(self, device) -> ReferencePolicy:
        if self._copy is not None:
            self._copy.to(device)
        return self

    @contextlib.contextmanager
    def active(self) -> Iterator[nn.Module]:
        """The module to run as π_ref for the duration of the block."""
        if self.lora:
            with self.policy.disable_adapter():
                yield self.policy
            return
        if self._copy is None:
            raise RuntimeError("ReferencePolicy.active() before setup(): π_ref was not frozen (online=False?)")
        yield self._copy

    def check_cache(self, cache) -> None:
        """Refuse a reference cache whose log π_ref were not computed by this initial policy.

        Under LoRA the adapter-free policy is the base, but its wrapped weights do not hash like
        the base checkpoint's, so only the cache's tokenizer and dataset checks apply.
        """
        if not self.lora:
            cache.check(model=self.policy)
