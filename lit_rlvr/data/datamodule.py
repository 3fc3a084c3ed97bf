"""PromptDataModule: prompts for RL training and named validation sets, plus DPH-RL anchor batches.

Batches follow the library's contract (:mod:`lit_rlvr.contracts`):

- train: :class:`~lit_rlvr.contracts.TrainBatch` (rows and prompt ids), with an
  :class:`~lit_rlvr.contracts.AnchorBatch` when a reference cache is configured and D_pef has
  anchor samples;
- validation (one dataloader per named set): :class:`~lit_rlvr.contracts.ValBatch`; each rank
  gets its share of the set (:class:`~lit_rlvr.data.samplers.EvalShardSampler`), and
  ``padding[i]`` marks repeats that only keep the ranks in step (generated, never counted).

With a cache (``cache:``, :class:`CacheOptions`), training prompts are D_exp (prompts the
reference policy does not already solve ``perfect_threshold`` times of n) and each step's anchor
batch holds cached π_ref samples of D_pef prompts, served inside the same batch (the anchor stream
is a pure function of the step, so it needs no loader of its own and resumes exactly).

Resuming mid-epoch: each train batch carries its ``position`` ``(epoch, step)``;
:meth:`on_before_batch_transfer` records it as training consumes it;
:meth:`state_dict` (saved by Lightning in every checkpoint) stores it; after a restore the sampler
starts at the next step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

from lit_rlvr.contracts import StartupError, TrainBatch, ValBatch
from lit_rlvr.data.adapters import ADAPTERS, load_rows
from lit_rlvr.data.prompts import PromptFormat, encode_prompt
from lit_rlvr.data.readers import BadRow, HFSource
from lit_rlvr.data.samplers import BatchKey, EvalShardSampler, PromptBatchSampler, anchor_batch_indices

log = logging.getLogger(__name__)


@dataclass
class DatasetSpec:
    """Where a dataset's rows come from: local files or a Hugging Face dataset (exactly one).

    In YAML: ``{files: data/gsm8k/test.jsonl, adapter: gsm8k}`` or
    ``{hf: {path: openai/gsm8k, name: main, split: test}, adapter: gsm8k}``. Both give the same
    rows, ids and order for the same records; nothing is read before ``setup``.

    Args:
        files: one path or a list of JSONL/JSON/Parquet files.
        adapter: a name in :data:`lit_rlvr.data.ADAPTERS` (``gsm8k``, ``math``, ``spider``, ``jsonl``,
            ``trl`` for TRL's prompt-only datasets, ``verl`` for verl's parquet layout).
        name: dataset name, used in row ids and metric names (default: the adapter name).
        options: adapter options (e.g. ``{"db_root": ..., "reward": "math"}``).
        hf: a Hugging Face ``datasets`` split (:class:`~lit_rlvr.data.readers.HFSource`: ``path``,
            ``name``, ``split``, ``streaming``, ``kwargs``), instead of ``files``.
    """

    files: str | list[str] | None = None
    adapter: str = "jsonl"
    name: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    hf: HFSource | None = None

    def __post_init__(self):
        if (self.files is None) == (self.hf is None):
            given = f"both (files={self.files!r}, hf={self.hf!r})" if self.hf is not None else "neither"
            raise ValueError(
                f"dataset {self.name or self.adapter!r}: give exactly one of `files` (local files) or `hf` (a Hugging "
                f"Face dataset), got {given}; to replace one given in a config, set the other to null"
            )

    @property
    def source(self) -> str | list[str] | HFSource:
        """What :func:`~lit_rlvr.data.adapters.load_rows` reads: the files or the Hugging Face split."""
        return self.files if self.hf is None else self.hf


@dataclass
class ValSet(DatasetSpec):
    """A named validation set with its own samples per prompt (for its pass@k ladder).

    Args:
        n_samples: completions per prompt, the n of its unbiased pass@k (k up to n is reported).
    """

    n_samples: int = 1


@dataclass(frozen=True)
class GoldCheck:
    """Parse every row's gold once at set-up, in reward worker processes (``data.gold_check``).

    Each row's reward's ``check_gold`` (math-verify for math, the gold query for SQL) runs before
    training, so a malformed gold is a bad row reported with its file and line, not a crash at
    the step that draws it.

    Args:
        workers: reward worker processes for the check (0 = in this process).
        timeout_s: per-gold deadline (a gold past it is a bad row).
    """

    workers: int = 1
    timeout_s: float = 10.0

    def __post_init__(self):
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(
                f"data.gold_check.workers must be an integer >= 0 (0 = in this process), got {self.workers!r}"
            )
        if not self.timeout_s > 0:
            raise ValueError(f"data.gold_check.timeout_s must be > 0 seconds, got {self.timeout_s!r}")


@dataclass(frozen=True)
class CacheOptions:
    """DPH-RL's reference cache and how the run uses it (``data.cache``; docs/methods.md §2).

    Args:
        path: the cache directory (``lit-rlvr cache`` builds it; its config's ``data.cache.path``).
        perfect_threshold: pass count (of the cache's n) from which a prompt is in D_pef
            (near-perfect); None = n.
        anchor_samples: ``correct`` (the cached correct samples of D_pef prompts, as the paper)
            or ``all`` (every cached sample of them).
        anchor_batch_size: anchor samples per training step.
        train_split: train on ``exp`` (D_exp only: D_pef prompts leave RL, as in DPH-RL) or
            ``all`` prompts.
        verify: ``sha256`` re-hashes every shard on open, ``size`` only checks sizes.
    """

    path: str
    perfect_threshold: int | None = None
    anchor_samples: Literal["correct", "all"] = "correct"
    anchor_batch_size: int = 16
    train_split: Literal["exp", "all"] = "exp"
    verify: Literal["sha256", "size"] = "sha256"

    def __post_init__(self):
        if self.anchor_batch_size < 1:
            raise ValueError(f"data.cache.anchor_batch_size must be >= 1, got {self.anchor_batch_size}")
        if self.perfect_threshold is not None and self.perfect_threshold < 1:
            raise ValueError(
                f"data.cache.perfect_threshold must be >= 1 or null (= the cache's n), got {self.perfect_threshold}"
            )


@dataclass
class _Prepared:
    rows: list[dict]
    prompt_ids: list[list[int]]
    positions: list[tuple[str, int]]  # (file or source label, line) of each row, for reports
    total: int  # records read, good and bad

    def keep(self, indices: list[int]) -> _Prepared:
        """The prepared rows at ``indices``, in order."""
        pick = lambda values: [values[i] for i in indices]  # noqa: E731
        return _Prepared(pick(self.rows), pick(self.prompt_ids), pick(self.positions), self.total)


def _removal_hint(spec: DatasetSpec, key: str) -> str:
    """How to remove an adapter option that a config sets and this adapter does not take: a mapping given on
    the command line (``--data.train.options='{…}'``) merges into the config's, so it cannot drop a key."""
    if spec.adapter not in ADAPTERS or ADAPTERS.takes_any(spec.adapter):
        return ""
    unknown = [k for k in spec.options if k not in ADAPTERS.options(spec.adapter)]
    return f" (to remove an option a config sets: --{key}.options.{unknown[0]}=null)" if unknown else ""


def _open_cache(path: str, verify: str) -> Any:
    """The :class:`~lit_rlvr.cache.ReferenceCache` at ``path`` (``data.cache.path``), opened and
    verified. One that is not there, is damaged (a shard missing, truncated or altered; an unfinished
    build) or is not a cache (a manifest that is not lit_rlvr's JSON) is a
    :class:`~lit_rlvr.contracts.StartupError` naming the path and what to do, not a traceback."""
    from lit_rlvr.cache.format import CacheCorruptError, CacheError, CacheMismatchError
    from lit_rlvr.cache.reader import ReferenceCache

    key = f"data.cache.path={str(path)!r}"
    try:
        return ReferenceCache(path, verify=verify)
    except CacheMismatchError:
        raise
    except CacheCorruptError as err:
        hint = (
            ""
            if "lit-rlvr cache" in str(err)
            else "; run the `lit-rlvr cache` command that built it again: it rebuilds what is missing or damaged"
        )
        raise StartupError(f"{key}: {err}{hint}") from err
    except CacheError as err:  # no manifest: nothing was built there
        raise StartupError(f"{key}: {err}") from err
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # not JSON, or not the manifest's keys
        raise StartupError(
            f"{key}: not a reference cache lit_rlvr can read ({type(err).__name__}: {err}); "
            "build it again with `lit-rlvr cache` into an empty folder, or correct data.cache.path"
        ) from err


def check_golds(rows: list[dict], check: GoldCheck) -> list[str | None]:
    """Per row, why its gold is unusable (None if fine), checked in ``check.workers`` reward processes.

    No process starts when no row's reward has a gold check. A row without a ``reward`` (a TRL
    dataset scored by ``model.scoring.reward_funcs``) or without an answer has no gold to check.
    """
    from lit_rlvr.rewards import REWARDS, BatchScorer

    todo = [
        i
        for i, row in enumerate(rows)
        if row.get("reward") is not None
        and row.get("answer") is not None
        and REWARDS[row["reward"]].check_gold is not None
    ]
    problems: list[str | None] = [None] * len(rows)
    if not todo:
        return problems
    with BatchScorer(workers=check.workers, timeout_s=check.timeout_s) as scorer:
        for i, problem in zip(todo, scorer.check_golds([rows[i] for i in todo])):
            problems[i] = problem
    return problems


def _identity(batch):
    return batch


class _TrainBatches(Dataset):
    """Maps a :class:`BatchKey` to a train batch (rows, prompt ids, position, anchors)."""

    def __init__(self, dm: PromptDataModule, sampler: PromptBatchSampler):
        self.dm, self.sampler = dm, sampler

    def __getitem__(self, key: BatchKey) -> TrainBatch:
        s = self.sampler
        return self.dm.train_batch(key, number=(key.epoch * len(s) + key.step) * s.num_replicas + s.rank)

    def __len__(self) -> int:
        return self.dm.num_train_prompts


class _TrainLoader(DataLoader):
    """The train DataLoader, stateful through its DataModule so Lightning knows it resumes mid-epoch."""

    def __init__(self, dm: PromptDataModule, sampler: PromptBatchSampler):
        super().__init__(_TrainBatches(dm, sampler), sampler=sampler, batch_size=None, collate_fn=_identity)
        self.dm = dm

    def state_dict(self) -> dict[str, Any]:
        return self.dm.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.dm.load_state_dict(state_dict)


class _ValBatches(Dataset):
    """Maps an :class:`EvalShardSampler` key ``(index, padding)`` to ``(row, prompt ids, padding)``."""

    def __init__(self, prepared: _Prepared):
        self.prepared = prepared

    def __getitem__(self, key: tuple[int, bool]) -> tuple[dict, list[int], bool]:
        i, padding = key
        return dict(self.prepared.rows[i]), list(self.prepared.prompt_ids[i]), padding

    def __len__(self) -> int:
        return len(self.prepared.rows)


@dataclass(frozen=True)
class _ValCollate:
    set_name: str
    n_samples: int

    def __call__(self, items: list[tuple[dict, list[int], bool]]) -> ValBatch:
        return ValBatch(
            rows=[r for r, _, _ in items],
            prompt_ids=[p for _, p, _ in items],
            padding=[pad for _, _, pad in items],
            set_name=self.set_name,
            n_samples=self.n_samples,
        )


class PromptDataModule(pl.LightningDataModule):
    """Prompts from local files or Hugging Face datasets, formatted and tokenized, with deterministic resumable order.

    Args:
        tokenizer: path or hub name of the policy's tokenizer (``AutoTokenizer``; the CLI links
            it to ``model.policy.path``).
        train: the training dataset (None for validate-only runs).
        val: named validation sets, each with its own ``n_samples``.
        prompt: how a row becomes the prompt text (:class:`~lit_rlvr.data.prompts.PromptFormat`:
            the instruction template, system prompt, chat template or plain layout).
        max_prompt_tokens: prompts longer than this are reported and skipped (never truncated).
        batch_size: prompts per training step (per device).
        val_batch_size: prompts per validation batch (default ``batch_size``).
        seed: seeds the per-epoch shuffle and the anchor order.
        shuffle: reshuffle training prompts every epoch.
        drop_last: drop the last, smaller training batch of an epoch.
        max_bad_fraction: stop with an error when a dataset has a larger share of bad rows
            (missing fields, unknown reward names, malformed golds, unreadable database); below it
            bad rows are reported with file:line and skipped.
        gold_check: parse every row's gold at set-up (:class:`GoldCheck`; None skips the check).
        cache: DPH-RL's reference cache (:class:`CacheOptions`): enables the D_pef/D_exp split
            and the anchor batches.
    """

    def __init__(
        self,
        tokenizer: str,
        train: DatasetSpec | None = None,
        val: list[ValSet] | None = None,
        prompt: PromptFormat = PromptFormat(),
        max_prompt_tokens: int = 1024,
        batch_size: int = 8,
        val_batch_size: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        max_bad_fraction: float = 0.1,
        gold_check: GoldCheck | None = GoldCheck(),
        cache: CacheOptions | None = None,
    ):
        super().__init__()
        if batch_size < 1 or max_prompt_tokens < 1:
            raise ValueError(
                f"data.batch_size and data.max_prompt_tokens must be >= 1, got {batch_size} and {max_prompt_tokens}"
            )
        if not 0.0 <= max_bad_fraction <= 1.0:
            raise ValueError(f"data.max_bad_fraction must be in [0, 1], got {max_bad_fraction}")
        names = [v.name or v.adapter for v in val or []]
        if len(set(names)) != len(names):
            raise ValueError(f"validation set names must be unique, got {names}; set `name` on each")
        for v in val or []:
            if v.n_samples < 1:
                raise ValueError(f"val set {v.name or v.adapter!r}: n_samples must be >= 1, got {v.n_samples}")
        self.tokenizer_path = tokenizer
        self.train_spec, self.val_specs = train, list(val or [])
        self.prompt_format = prompt
        self.max_prompt_tokens, self.batch_size = max_prompt_tokens, batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.seed, self.shuffle, self.drop_last, self.max_bad_fraction = seed, shuffle, drop_last, max_bad_fraction
        self.gold_check, self.cache = gold_check, cache
        self.tokenizer = None
        self.train_rows: list[dict] = []
        self.train_prompt_ids: list[list[int]] = []
        self._train: _Prepared | None = None
        self._context_checked: tuple[int, int, int] | None = None  # the last fit_context's limits
        self.val_sets: dict[str, _Prepared] = {}
        self.bad_rows: dict[str, list[BadRow]] = {}
        self.skipped_long: dict[str, list[str]] = {}
        self.reference_cache = None
        self.split = None
        self._train_index: list[int] = []
        self._anchor_index = None
        self._consumed: tuple[int, int] | None = None  # (epoch, step) of the last batch training took
        self._sampler: PromptBatchSampler | None = None

    # ------------------------------------------------------------------------------- setup
    @override
    def setup(self, stage: str | None = None) -> None:
        """Load, check and tokenize the datasets; what a dataset's settings or rows make unusable is a
        :class:`~lit_rlvr.contracts.StartupError` (``lit-rlvr`` ends with its message and exit status 2)."""
        try:
            self._setup(stage)
        except StartupError:
            raise
        except ValueError as err:  # an adapter option, too many bad rows, no usable prompt: a refusal, not a crash
            raise StartupError(str(err)) from err

    def _setup(self, stage: str | None) -> None:
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        if stage in ("fit", None) and self.train_spec is not None and not self.train_rows:
            prepared = self._train = self._prepare(self.train_spec, "data.train")
            self.train_rows, self.train_prompt_ids = prepared.rows, prepared.prompt_ids
            self._train_index = list(range(len(self.train_rows)))
            if self.cache is not None:
                self._attach_cache()
        if stage in ("fit", "validate", None):
            for i, spec in enumerate(self.val_specs):
                name = spec.name or spec.adapter
                if name not in self.val_sets:
                    self.val_sets[name] = self._prepare(spec, f"data.val[{i}]")

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    @property
    def val_set_names(self) -> list[str]:
        """Names of the validation sets, in dataloader order (dataloader_idx i is the i-th name)."""
        return [v.name or v.adapter for v in self.val_specs]

    @property
    def val_samples_per_prompt(self) -> dict[str, int]:
        """``{set name: samples per prompt}`` for every validation set."""
        return {v.name or v.adapter: v.n_samples for v in self.val_specs}

    def all_rows(self) -> list[dict]:
        """Every prepared row: training prompts, then each validation set's."""
        return [*self.train_rows, *(row for prepared in self.val_sets.values() for row in prepared.rows)]

    @property
    def base_pass_counts(self) -> dict[str, int] | None:
        """π_ref pass count (of the cache's n) per prompt id, for the retention metric; None without a cache."""
        return None if self.reference_cache is None else self.reference_cache.base_pass_counts()

    def _prepare(self, spec: DatasetSpec, key: str) -> _Prepared:
        """Load, validate, format and tokenize one dataset (config key ``key``); report bad and over-long rows."""
        name = spec.name or spec.adapter
        try:
            loaded = load_rows(spec.source, spec.adapter, name=name, options_key=f"{key}.options", **spec.options)
        except ValueError as err:
            raise StartupError(f"{err}{_removal_hint(spec, key)}") from err
        if self.gold_check is not None and loaded.rows:
            loaded.drop(check_golds(loaded.rows, self.gold_check))
        self.bad_rows[name] = []
        if loaded.bad:
            self._report_bad(name, loaded.bad, loaded.total)
        rows, ids, positions, too_long, unreadable = [], [], [], [], []
        for row, position in zip(loaded.rows, loaded.positions):
            try:
                tokens = encode_prompt(row, self.tokenizer, self.prompt_format, loaded.raw_text)
            except (TypeError, ValueError, UnicodeError) as e:  # text the template or tokenizer refuses
                unreadable.append(
                    BadRow(*position, f"cannot build the prompt's tokens: {type(e).__name__}: {str(e)[:200]}")
                )
                continue
            if len(tokens) > self.max_prompt_tokens:
                too_long.append(f"{row['id']} ({len(tokens)} tokens)")
                continue
            rows.append(row)
            ids.append(tokens)
            positions.append(position)
        if unreadable:
            self._report_bad(name, unreadable, loaded.total)
        self.skipped_long[name] = too_long
        if too_long:
            log.warning(
                "%s: %d prompts longer than max_prompt_tokens=%d are skipped: %s%s",
                name,
                len(too_long),
                self.max_prompt_tokens,
                ", ".join(too_long[:10]),
                " ..." if len(too_long) > 10 else "",
            )
        if not rows:
            raise ValueError(
                f"{name}: no usable prompts ({loaded.total} rows, {len(loaded.bad)} bad, {len(too_long)} too long)"
            )
        return _Prepared(rows, ids, positions, loaded.total)

    def _report_bad(self, name: str, bad: list[BadRow], total: int, hint: str = "") -> None:
        """Add ``bad`` rows of dataset ``name`` to :attr:`bad_rows`, log them, and stop past ``max_bad_fraction``."""
        self.bad_rows[name] = [*self.bad_rows.get(name, []), *bad]
        shown = "\n  ".join(str(b) for b in bad[:10])
        more = f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else ""
        log.warning("%s: %d of %d rows are bad and skipped:\n  %s%s", name, len(bad), total, shown, more)
        every = self.bad_rows[name]
        if len(every) > self.max_bad_fraction * total:
            raise ValueError(
                f"{name}: {len(every)} of {total} rows are bad ({len(every) / total:.1%}), more than "
                f"max_bad_fraction={self.max_bad_fraction:.1%}; first: {every[0]}{hint}"
            )

    def fit_context(self, context: int, train_new_tokens: int, val_new_tokens: int, where: str) -> None:
        """Skip the prompts whose tokens plus the completion's length cap exceed the context.

        Called at set-up by the rollout callback, which knows the engine's context. Each such
        prompt is a bad row (file:line, :attr:`bad_rows`), counted against ``max_bad_fraction``;
        the rows and their order stay as prepared (a reference cache's fingerprint is unchanged),
        only the prompts served skip them.

        Args:
            context: the longest prompt + completion the engine and model take, in tokens.
            train_new_tokens: the training rollouts' ``max_new_tokens``.
            val_new_tokens: the validation rollouts' ``max_new_tokens``.
            where: where ``context`` comes from, for the reports (e.g. the config key).

        Raises:
            ValueError: more than ``max_bad_fraction`` of a dataset's rows are bad, or none is left.
        """
        if self._context_checked == (context, train_new_tokens, val_new_tokens):
            return  # set up again (fit, then validate): the same prompts were skipped already
        self._context_checked = (context, train_new_tokens, val_new_tokens)
        hint = (
            f"; shorten the prompts (data.max_prompt_tokens drops them earlier), lower model.sampling.max_new_tokens "
            f"(or model.evaluation.max_new_tokens), or raise the context ({where})"
        )
        if self._train is not None:
            kept = self._fitting(
                self._train, "data.train", context, train_new_tokens, where, hint, "model.sampling.max_new_tokens"
            )
            self._train_index = [i for i in self._train_index if i in kept]
            if not self._train_index:
                raise ValueError(f"{self._train_name}: no training prompt fits the context of {context} tokens{hint}")
        for name, prepared in self.val_sets.items():
            kept = self._fitting(prepared, name, context, val_new_tokens, where, hint, "the validation max_new_tokens")
            if len(kept) < len(prepared.rows):
                if not kept:
                    raise ValueError(f"{name}: no validation prompt fits the context of {context} tokens{hint}")
                self.val_sets[name] = prepared.keep(sorted(kept))

    def _fitting(
        self, prepared: _Prepared, key: str, context: int, new_tokens: int, where: str, hint: str, new_key: str
    ) -> set[int]:
        """Indices of ``prepared``'s prompts that fit; the others are reported as bad rows."""
        name = self._train_name if key == "data.train" else key
        kept, bad = set(), []
        for i, (ids, position) in enumerate(zip(prepared.prompt_ids, prepared.positions)):
            if len(ids) + new_tokens <= context:
                kept.add(i)
            else:
                bad.append(
                    BadRow(
                        *position,
                        f"prompt of {len(ids)} tokens + {new_key}={new_tokens} exceeds the "
                        f"context of {context} tokens ({where})",
                    )
                )
        if bad:
            self._report_bad(name, bad, prepared.total, hint)
        return kept

    @property
    def _train_name(self) -> str:
        return self.train_spec.name or self.train_spec.adapter

    def _attach_cache(self) -> None:
        """Open the reference cache, check it belongs to this run, split D_pef / D_exp, index anchors."""
        from lit_rlvr.cache.format import dataset_fingerprint
        from lit_rlvr.cache.split import split_by_pass_count

        options = self.cache
        cache = _open_cache(options.path, options.verify)
        cache.check(
            tokenizer=self.tokenizer, dataset_fingerprint=dataset_fingerprint(self.train_rows, self.train_prompt_ids)
        )
        self.reference_cache = cache
        self.split = split_by_pass_count(cache.ids, cache.pass_counts, cache.n, options.perfect_threshold)
        if options.train_split == "exp":
            exp = set(self.split.exp)
            self._train_index = [i for i, r in enumerate(self.train_rows) if r["id"] in exp]
            if not self._train_index:
                raise ValueError(
                    f"every training prompt is in D_pef (perfect_threshold={self.split.threshold}); nothing to explore"
                )
        self._anchor_index = cache.sample_indices(self.split.pef, options.anchor_samples) if self.split.pef else None
        anchors = 0 if self._anchor_index is None else len(self._anchor_index)
        if anchors == 0:
            log.warning(
                "reference cache %s: D_pef has no %s samples; train batches carry no anchors",
                cache.path,
                options.anchor_samples,
            )
        log.info("reference cache: |D_pef|=%d |D_exp|=%d anchors=%d", len(self.split.pef), len(self.split.exp), anchors)

    # ------------------------------------------------------------------------------- loaders
    @override
    def train_dataloader(self) -> DataLoader:
        if not self._train_index:
            raise RuntimeError("PromptDataModule has no training data: set `train` and call setup('fit')")
        world, rank = 1, 0
        if self.trainer is not None:
            world, rank = self.trainer.world_size, self.trainer.global_rank
        sampler = PromptBatchSampler(
            len(self._train_index),
            self.batch_size,
            self.seed,
            self.shuffle,
            self.drop_last,
            num_replicas=world,
            rank=rank,
        )
        if self._consumed is not None:
            sampler.resume(self._consumed[0], self._consumed[1] + 1)
        self._sampler = sampler
        return _TrainLoader(self, sampler)

    @override
    def val_dataloader(self) -> list[DataLoader]:
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer is not None else (1, 0)
        return [
            DataLoader(
                _ValBatches(self.val_sets[name]),
                batch_size=self.val_batch_size,
                sampler=EvalShardSampler(len(self.val_sets[name].rows), num_replicas=world, rank=rank),
                collate_fn=_ValCollate(name, spec.n_samples),
            )
            for name, spec in zip(self.val_set_names, self.val_specs)
        ]

    # ------------------------------------------------------------------------------- resume
    @override
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, TrainBatch) and batch.position is not None:
            self._consumed = tuple(batch.position)
        return batch

    # ------------------------------------------------------------------------------- train batches
    @property
    def num_train_prompts(self) -> int:
        """Training prompts in the epoch's order (those D_exp keeps, that fit the engine's context)."""
        return len(self._train_index)

    def train_batch(self, key: BatchKey, number: int) -> TrainBatch:
        """The train batch of ``key`` (the sampler's rows, epoch and step): rows, prompt ids, position,
        and the DPH-RL anchor samples of global batch ``number`` when a cache has D_pef prompts."""
        rows = [dict(self.train_rows[self._train_index[i]]) for i in key.indices]
        prompt_ids = [list(self.train_prompt_ids[self._train_index[i]]) for i in key.indices]
        batch = TrainBatch(rows, prompt_ids, position=(key.epoch, key.step))
        if self._anchor_index is not None and len(self._anchor_index):
            picks = anchor_batch_indices(number, self.cache.anchor_batch_size, len(self._anchor_index), self.seed)
            batch.anchor = self.reference_cache.anchor_batch(self._anchor_index[picks], self.pad_id)
        return batch

    def train_prompt_ids_at(self, epoch: int, step: int) -> list[list[int]]:
        """The prompt ids of the batch the train loader yields at ``step`` of ``epoch`` on this rank,
        ahead of it (asynchronous rollouts generate for batches the loop has not reached yet)."""
        if self._sampler is None:
            raise RuntimeError("train_prompt_ids_at before train_dataloader()")
        key = self._sampler.key_at(epoch, step)
        return [list(self.train_prompt_ids[self._train_index[i]]) for i in key.indices]

    def train_rows_at(self, epoch: int, step: int) -> list[dict]:
        """The rows of the batch :meth:`train_prompt_ids_at` names (multi-turn rollouts reset their environments with them)."""
        if self._sampler is None:
            raise RuntimeError("train_rows_at before train_dataloader()")
        return [dict(self.train_rows[self._train_index[i]]) for i in self._sampler.key_at(epoch, step).indices]

    @override
    def state_dict(self) -> dict[str, Any]:
        if self._consumed is None:
            return {}
        return {
            "epoch": self._consumed[0],
            "step": self._consumed[1],
            "num_train": len(self._train_index),
            "seed": self.seed,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict or (self.trainer is not None and self.trainer.state.fn != TrainerFn.FITTING):
            return  # the prompt order is training's: `validate --ckpt_path` reads no training prompt
        if state_dict["num_train"] != len(self._train_index) or state_dict["seed"] != self.seed:
            raise ValueError(
                f"cannot resume the prompt order: the checkpoint was taken with {state_dict['num_train']} training "
                f"prompts and seed {state_dict['seed']}, this run has {len(self._train_index)} and seed {self.seed}"
            )
        self._consumed = (state_dict["epoch"], state_dict["step"])
        if self._sampler is not None:
            self._sampler.resume(self._consumed[0], self._consumed[1] + 1)
