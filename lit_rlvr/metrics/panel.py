"""The validation panel: every diversity-collapse metric of one validation set (docs/methods.md §4).

For each named validation set lit_rlvr reports the pass@k ladder (Chen et al. 2021) and beside it
pass^k (all k samples correct: τ-bench, arXiv 2406.12045, prime-rl's eval metric), maj@k
(self-consistency, Wang et al. 2023), retention (pass@k over the prompts the base policy solved:
DPH-RL's keep rate), distinct final answers, distinct correct answers and distinct completions
per prompt, and the share of zero-variance groups; for multi-turn rollouts also the trajectories'
behaviour (turns, tool calls, tool errors, single-turn share, distinct tool-call sequences per prompt:
:mod:`lit_rlvr.metrics.behaviour`). :class:`ValidationPanel` holds those
torchmetrics ``Metric``s (sum states, so multi-process results equal one process over the union
of the prompts), updates them from one batch of scored samples and returns their values under
the names the loggers show (``pass@k``, ``pass^k``, ``maj@k``, ``retention/pass@k``, ``distinct_answers``, …).
:class:`ValidationPanels` keeps one per set, turns a batch of scores into a panel update
(:meth:`ValidationPanels.add`, what ``RLVRModule.validation_step`` calls) and knows which base
policy retention is measured against; :func:`is_last_val_batch` says when a set's panel is taken.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlvr.functional.metrics import Answers, pass_k_ladder
from lit_rlvr.metrics.behaviour import DistinctToolSequences, TurnBehaviour
from lit_rlvr.metrics.diversity import DistinctAnswers, DistinctCompletions, DistinctCorrectAnswers, ZeroVarianceShare
from lit_rlvr.metrics.majority import MajorityAtK
from lit_rlvr.metrics.passk import PassAtK, PassHatK


class ValidationPanel(nn.Module):
    """The metrics of one validation set with ``n`` samples per prompt.

    Args:
        n: samples per prompt.
        ks: pass@k / pass^k / maj@k budgets (those above ``n`` are dropped); None = 1, 2, 4, …, n.
        max_turns: multi-turn rollouts' turn limit: the panel also reports their behaviour
            (None: single-turn rollouts, no behaviour metrics).

    Example:
        >>> panel = ValidationPanel(n=2)
        >>> correct = torch.tensor([[True, False], [False, False]])
        >>> panel.update(correct, answers=[["4", "5"], [None, "7"]], texts=[["4", "5"], ["x", "7"]],
        ...              rewards=correct.flatten().float(), base_solved=torch.tensor([True, False]))
        >>> {k: round(float(v), 3) for k, v in panel.compute().items()}  # doctest: +NORMALIZE_WHITESPACE
        {'pass@1': 0.25, 'pass@2': 0.5, 'pass^1': 0.25, 'pass^2': 0.0, 'maj@1': 0.5, 'maj@2': 0.5, 'retention/pass@1': 0.5,
         'retention/pass@2': 1.0, 'distinct_answers': 1.5, 'distinct_correct_answers': 0.5,
         'distinct_completions': 2.0, 'zero_variance_groups': 0.5}
    """

    def __init__(self, n: int, ks: Sequence[int] | None = None, max_turns: int | None = None):
        super().__init__()
        ks = [k for k in (ks or pass_k_ladder(n)) if k <= n]
        if not ks:
            raise ValueError(f"ValidationPanel: no pass@k budget <= n={n} (got ks={list(ks or [])})")
        self.n, self.max_turns = n, max_turns
        self.metrics = nn.ModuleDict(
            {
                "pass": PassAtK(k=ks),
                "pass_hat": PassHatK(k=ks),  # pass^k: all k samples correct
                "maj": MajorityAtK(k=ks),
                "retention": PassAtK(k=ks),  # pass@k restricted to prompts the base policy solved
                "distinct_answers": DistinctAnswers(),
                "distinct_correct_answers": DistinctCorrectAnswers(),
                "distinct_completions": DistinctCompletions(),
                "zero_variance_groups": ZeroVarianceShare(),
            }
        )
        if max_turns is not None:
            self.metrics["behaviour"] = TurnBehaviour(max_turns)
            self.metrics["distinct_tool_sequences"] = DistinctToolSequences()

    def update(
        self,
        correct: Tensor,
        answers: Answers,
        texts: Sequence[Sequence[str]],
        rewards: Tensor,
        base_solved: Tensor | None = None,
        behaviour: Sequence[Tensor] | None = None,
        tool_sequences: Sequence[Sequence[Sequence[str]]] | None = None,
    ) -> None:
        """Add P prompts.

        Args:
            correct: ``(P, n)`` bool, sample j of prompt p passed.
            answers: P lists of n canonical answers (``None`` = no answer).
            texts: P lists of n completion texts.
            rewards: ``(P·n,)`` rewards, prompt-major.
            base_solved: ``(P,)`` bool, prompts the base policy solved (None: retention unknown).
            behaviour: multi-turn rollouts: ``(turns, tool_calls, tool_errors, env_failed)``, each
                ``(P·n,)`` (:class:`~lit_rlvr.metrics.TurnBehaviour`).
            tool_sequences: multi-turn rollouts: P lists of n tool-call sequences.
        """
        m = self.metrics
        P = correct.shape[0]
        # a trajectory whose environment failed is left out of pass@k (not counted a miss)
        valid = None if behaviour is None or not behaviour[3].any() else ~behaviour[3].to(correct.device).view(P, -1)
        m["pass"].update(correct, valid=valid)
        m["pass_hat"].update(correct, valid=valid)
        m["maj"].update(answers, correct)
        m["distinct_answers"].update(answers)
        m["distinct_correct_answers"].update(answers, correct)
        m["distinct_completions"].update(texts)
        m["zero_variance_groups"].update(rewards, torch.arange(P).repeat_interleave(self.n))
        solved = base_solved.to(correct.device) if base_solved is not None else torch.zeros(P, dtype=torch.bool)
        m["retention"].update(correct[solved], valid=None if valid is None else valid[solved])  # possibly no prompt
        if self.max_turns is not None:
            if behaviour is None or tool_sequences is None:
                raise ValueError(
                    "ValidationPanel(max_turns=...) reports multi-turn behaviour: update it with behaviour and tool_sequences"
                )
            m["behaviour"].update(*behaviour)
            m["distinct_tool_sequences"].update(tool_sequences)

    def compute(self) -> dict[str, Tensor]:
        """Every metric's value by logged name (``pass@k``, ``pass^k``, ``maj@k``, ``retention/pass@k``, …).

        Under several processes each metric syncs its sum states here, so every rank must call
        this at the same point (RLVRModule does, at each set's last validation batch, which
        EvalShardSampler makes the same batch on every rank); values that no rank measured
        (retention without base counts, a set with no prompts) are left out.
        """
        out: dict[str, Tensor] = {}
        for key, metric in self.metrics.items():
            if not metric.update_called:
                continue
            values = metric.compute()
            values = values if isinstance(values, dict) else {key: values}  # a dict: its own names (pass@k, turns, …)
            for k, v in values.items():
                if not torch.isnan(v):
                    out[f"{key}/{k}" if key == "retention" else k] = v.float()
        return out

    def reset(self) -> None:
        for metric in self.metrics.values():
            metric.reset()


class ValidationPanels(nn.ModuleDict):
    """One :class:`ValidationPanel` per validation set, by name, made when the set is first seen.

    Args:
        ks: the pass@k / maj@k budgets of every panel (None: each set's ladder up to its n).
        max_turns: multi-turn rollouts' turn limit (every panel reports their behaviour; None: single-turn).
        reference: the base policy's per-prompt pass counts by set, ``{set name: {prompt id: count}}``,
            that retention@k is measured against (``model.evaluation.retention_reference``; None: the
            counts given to each :meth:`add`, the reference cache's).

    Example:
        >>> panels = ValidationPanels()
        >>> panels.panel("gsm8k", n=2).update(torch.tensor([[True, False]]), answers=[["4", "5"]], texts=[["4", "5"]],
        ...                                   rewards=torch.tensor([1.0, 0.0]))
        >>> {k: round(float(v), 2) for k, v in panels.take("gsm8k").items() if "pass" in k}  # doctest: +NORMALIZE_WHITESPACE
        {'val/gsm8k/pass@1': 0.5, 'val/gsm8k/pass@2': 1.0, 'val/gsm8k/pass^1': 0.5,
         'val/gsm8k/pass^2': 0.0}
        >>> panels.take("gsm8k")  # taken: reset until the next update
        {}
    """

    def __init__(
        self,
        ks: Sequence[int] | None = None,
        max_turns: int | None = None,
        reference: Mapping[str, Mapping[str, int]] | None = None,
    ):
        super().__init__()
        self.ks, self.max_turns, self.reference = ks, max_turns, reference

    def panel(self, name: str, n: int) -> ValidationPanel:
        """The panel of set ``name`` (``n`` samples per prompt), added on first use."""
        if name not in self:
            self[name] = ValidationPanel(n, self.ks, self.max_turns)
        return self[name]

    def add(
        self,
        name: str,
        n: int,
        ids: Sequence[str],
        scores: Sequence,
        texts: Sequence[str],
        base_pass_counts: Mapping[str, int] | None = None,
        behaviour: Sequence[Tensor] | None = None,
        tool_sequences: Sequence[Sequence[Sequence[str]]] | None = None,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """Add one batch of set ``name``: P prompts with ``n`` scored samples each, prompt-major.

        Args:
            name: the validation set.
            n: its samples per prompt.
            ids: the P prompts' ids.
            scores: P·n scores, each with a ``reward``, ``correct`` (the correctness term: correct
                above 0.5) and ``answer`` (:class:`~lit_rlvr.rewards.combine.MixedScore`).
            texts: P·n completion texts.
            base_pass_counts: the base policy's pass count by prompt id, without a :attr:`reference`
                (None: retention unknown).
            behaviour / tool_sequences: multi-turn rollouts (:meth:`ValidationPanel.update`).
            device: where the panel's states live (a panel first seen here is made on the CPU).

        Returns:
            ``(P, n)`` bool: which samples are correct.

        Example:
            >>> from types import SimpleNamespace as Score
            >>> panels = ValidationPanels(reference={"gsm8k": {"a": 1}})
            >>> scores = [Score(reward=1.0, correct=1.0, answer="4"), Score(reward=0.0, correct=0.0, answer=None)]
            >>> panels.add("gsm8k", 2, ["a"], scores, ["4", "x"])
            tensor([[ True, False]])
            >>> panels.take("gsm8k")["val/gsm8k/retention/pass@2"]
            tensor(1.)
        """
        P = len(ids)
        rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)  # (P·n,)
        correct = (torch.tensor([s.correct for s in scores], dtype=torch.float32) > 0.5).view(-1, n)  # (P, n)
        counts = self.reference.get(name, {}) if self.reference is not None else base_pass_counts
        self.panel(name, n).to(device).update(
            correct,
            answers=[[s.answer for s in scores[p * n : (p + 1) * n]] for p in range(P)],
            texts=[texts[p * n : (p + 1) * n] for p in range(P)],
            rewards=rewards,
            base_solved=solved_prompts(counts, ids),
            behaviour=behaviour,
            tool_sequences=tool_sequences,
        )
        return correct

    def take(self, name: str) -> dict[str, Tensor]:
        """Set ``name``'s values as ``val/<name>/<metric>`` (synced across ranks by the sum states), then reset it.

        Empty when the panel had no update since it was last taken. Every rank must call it at
        the same point (:meth:`ValidationPanel.compute`).
        """
        values = {f"val/{name}/{k}": v for k, v in self[name].compute().items()}
        self[name].reset()
        return values

    def log(self, module: Any, name: str) -> None:
        """Log set ``name``'s panel through ``module`` (a LightningModule) and reset it (:meth:`take`;
        nothing if it has no update).

        Called at the last batch of the set's dataloader (:func:`is_last_val_batch`), Lightning files
        the values under that dataloader (``trainer.validate`` returns them in that dataloader's dict);
        logged at epoch end they would be listed under every dataloader.
        """
        # one value per epoch (its batch weight is moot); the set's name is in the key
        module.log_dict(self.take(name), sync_dist=False, batch_size=1, add_dataloader_idx=False)


def is_last_val_batch(trainer, batch_idx: int, dataloader_idx: int) -> bool:
    """Whether ``batch_idx`` is the last batch the Lightning ``trainer`` runs on validation dataloader
    ``dataloader_idx`` now (sanity check or validation), where that set's panel is taken; never for a
    loader without a length (its panel is taken at the epoch's end)."""
    batches = trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
    return batch_idx + 1 == batches[dataloader_idx]


def solved_prompts(pass_counts: Mapping[str, int] | None, ids: Sequence[str]) -> Tensor | None:
    """``(P,)`` bool: the prompts ``ids`` the base policy solved at least once (None: no counts known).

    Example:
        >>> solved_prompts({"a": 3, "b": 0}, ["a", "b", "c"])
        tensor([ True, False, False])
    """
    if not pass_counts:
        return None
    return torch.tensor([pass_counts.get(i, 0) > 0 for i in ids], dtype=torch.bool)
