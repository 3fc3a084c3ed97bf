"""Asynchronous rollouts with bounded staleness: generation runs up to k training batches ahead.

Generation and training alternate in the synchronous loop; with a rollout server they can
overlap (verl's fully-async trainer, AReaL, PipelineRL, TRL and NeMo-RL bound the lag the same
way). :class:`RolloutProducer` is a background thread of :class:`~lit_rlvr.callbacks.RolloutCallback`
that generates the rollouts of the training batches the loop has not reached yet, taking them from
the DataModule in the loop's own order (:class:`~lit_rlvr.contracts.PromptSource`: their prompt ids
and rows, which a multi-turn rollout's environments are reset with); batch m is
step m mod E of epoch m // E, E the loop's batches per epoch (``trainer.num_training_batches``).

Versions and staleness, counted in training batches (one rollout batch feeds its optimizer steps):
the weights have version v when the server holds the update of every batch before batch v. Batch
m generated at version v has staleness m − v (0: on-policy, as the synchronous loop). With
``max_staleness`` k:

- ``on_stale: wait`` — the producer starts batch m only when m − v ≤ k, so no batch is older
  (k = 0: only when the loop asks for batch m, the synchronous loop's own order, validation included);
- ``on_stale: drop`` — it may start one batch further (m − v ≤ k + 1), and a batch found older
  than k when training reaches it is dropped, counted, and generated again with the current weights.

Groups stay whole (a batch's prompts are generated together, under one version: a weight sync waits
for the batch in generation, :meth:`RolloutProducer.paused`). Each batch's seeds follow the global
step at which its generation starts and its lane m − v (< 8): with k = 0 that is exactly the
synchronous loop's seed, so the run is the same bit for bit. Counters: generated = trained +
dropped + in flight. A resumed run has no producer state: it regenerates from the restored position.

:class:`AsyncRollouts` is the training loop's side: it starts the producer at the loop's first
batch, takes each batch's rollouts, holds the producer through weight syncs and validation, and
counts what the loop waited and the staleness of what it trained.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from lit_rlvr.contracts import PromptSource, TrainBatch, require
from lit_rlvr.rollout.options import AsyncOptions
from lit_rlvr.rollout.types import Rollouts, SamplingParams

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

T = TypeVar("T")


@dataclass
class Produced:
    """One generated batch: its number, its prompts and their rows, its rollouts, and the weight version it was made at."""

    number: int
    prompt_ids: list[list[int]]
    rows: list[dict]
    rollouts: Rollouts
    version: int
    seconds: float


class RolloutProducer:
    """Generate the rollouts of batch ``m`` ahead of the loop, within ``options.max_staleness`` of the weights.

    Args:
        generate: ``(prompt_ids, rows, params) -> Rollouts`` (the rollout callback's sampler on its engine).
        params_at: ``(global_step, lane) -> SamplingParams`` of a batch starting then.
        global_step: the trainer's current optimizer step (read when a batch starts).
        source: the DataModule's batches ahead of the loader.
        batches_per_epoch: the loop's training batches per epoch (E above).
        options: k = ``max_staleness`` and ``on_stale`` (``wait`` or ``drop``).
        steps_left: optimizer steps the run has left (None: no step limit). Every batch takes at
            least one step, so no batch past ``version + steps_left()`` is generated ahead: a run
            ends with nothing generated that it will never train.
        max_batches: batches the run may train in all (``max_epochs`` · E; None: no limit).
    """

    def __init__(
        self,
        generate: Callable[[list[list[int]], list[dict], SamplingParams], Rollouts],
        params_at: Callable[[int, int], SamplingParams],
        global_step: Callable[[], int],
        source: PromptSource,
        batches_per_epoch: int,
        options: AsyncOptions,
        steps_left: Callable[[], int | None] = lambda: None,
        max_batches: int | None = None,
    ):
        self.steps_left, self.max_batches = steps_left, max_batches
        self.generate, self.params_at, self.global_step, self.source = generate, params_at, global_step, source
        if batches_per_epoch < 1:
            raise ValueError(
                f"asynchronous rollouts need at least one training batch per epoch, got {batches_per_epoch}"
            )
        self.k, self.batches_per_epoch = options.max_staleness, batches_per_epoch
        self.ahead = options.ahead  # how far past the weights a batch may start
        self._cond = threading.Condition()
        self._generating = threading.Lock()  # held while one batch generates: a weight sync waits for it
        self._queue: dict[int, Produced] = {}
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stop = False
        self.version = 0
        self.next = 0  # the next batch number to generate
        self.consumed = 0  # the next batch number training takes
        self.requested = -1  # the batch the loop waits for (k = 0 generates on request)
        self.generated = self.trained = self.dropped = 0
        self.generator_idle_s = 0.0

    # ------------------------------------------------------------------ the loop's side
    def start(self, number: int) -> None:
        """Start generating at batch ``number`` (the loop's first; the weights are its version)."""
        self.version = self.next = self.consumed = number
        self._thread = threading.Thread(target=self._run, name="lit_rlvr_rollout_producer", daemon=True)
        self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def take(self, number: int) -> tuple[Produced, float, int]:
        """The rollouts of batch ``number`` (waiting for them): ``(produced, seconds waited, staleness)``."""
        t0 = time.perf_counter()
        with self._cond:
            if number != self.consumed:
                raise RuntimeError(
                    f"asynchronous rollouts: the loop took batch {number}, the producer expected {self.consumed}"
                )
            self.requested = number
            self._cond.notify_all()
            while number not in self._queue and self._error is None:
                self._cond.wait()
            if self._error is not None and number not in self._queue:
                raise RuntimeError(
                    f"the rollout producer failed: {type(self._error).__name__}: {self._error}"
                ) from self._error
            produced = self._queue.pop(number)
            self.consumed = number + 1
            self._cond.notify_all()
        waited = time.perf_counter() - t0
        staleness = number - produced.version
        if staleness > self.k:  # on_stale: drop
            self.dropped += 1
            with self._generating:
                t1 = time.perf_counter()
                rollouts = self.generate(produced.prompt_ids, produced.rows, self.params_at(self.global_step(), 0))
                produced = Produced(
                    number, produced.prompt_ids, produced.rows, rollouts, self.version, time.perf_counter() - t1
                )
            self.generated += 1
            staleness = number - produced.version
        self.trained += 1
        return produced, waited, staleness

    def synced(self, version: int) -> None:
        """The weights now hold the update of every batch before ``version``."""
        with self._cond:
            self.version = version
            self._cond.notify_all()

    def paused(self) -> threading.Lock:
        """Hold while syncing weights: waits for the batch in generation, and stops the next from starting."""
        return self._generating

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Generated batches training has not taken yet."""
        return self.generated - self.trained - self.dropped

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None

    # ------------------------------------------------------------------ the thread
    def _must_wait(self) -> bool:
        """Whether batch ``next`` may not start yet (under ``_cond``)."""
        if self.next <= self.requested:  # the loop waits for it
            return False
        left = self.steps_left()
        if (left is not None and self.next >= self.version + left) or (
            self.max_batches is not None and self.next >= self.max_batches
        ):  # past the end of the run
            return True
        if self.next - self.version > self.ahead or self.next - self.consumed > self.ahead:
            return True
        return self.ahead == 0 and self.next > self.requested  # k = 0, wait: on request only

    def _run(self) -> None:
        try:
            while True:
                t0 = time.perf_counter()
                with self._cond:
                    while not self._stop and self._must_wait():
                        self._cond.wait()
                    if self._stop:
                        return
                    m = self.next
                    self.next += 1
                self.generator_idle_s += time.perf_counter() - t0
                epoch, step = divmod(m, self.batches_per_epoch)
                prompt_ids, rows = self.source.train_prompt_ids_at(epoch, step), self.source.train_rows_at(epoch, step)
                with self._generating:
                    version = self.version  # stable: a sync waits for this lock
                    t1 = time.perf_counter()
                    rollouts = self.generate(prompt_ids, rows, self.params_at(self.global_step(), m - version))
                    seconds = time.perf_counter() - t1
                with self._cond:
                    self._queue[m] = Produced(m, prompt_ids, rows, rollouts, version, seconds)
                    self.generated += 1
                    self._cond.notify_all()
        except BaseException as err:  # surfaced to the loop by take()
            with self._cond:
                self._error = err
                self._cond.notify_all()


class AsyncRollouts:
    """The training loop's side of asynchronous rollouts (``rollout.max_staleness``), for
    :class:`~lit_rlvr.callbacks.RolloutCallback`.

    Args:
        options: k and the stale policy.
        generate: ``(prompt_ids, rows, params) -> Rollouts`` (the rollout callback's sampler on its engine).
        params_at: ``(global_step, lane) -> SamplingParams`` of a batch starting then.
    """

    def __init__(
        self,
        options: AsyncOptions,
        generate: Callable[[list[list[int]], list[dict], SamplingParams], Rollouts],
        params_at: Callable[[int, int], SamplingParams],
    ):
        self.options, self.generate, self.params_at = options, generate, params_at
        self.producer: RolloutProducer | None = None  # started at the loop's first batch
        self.staleness_counts: dict[int, int] = {}  # batches trained at each staleness (saved with the callback)
        self.trainer_idle_s = 0.0  # seconds the loop waited for rollouts or for a batch in generation
        self.number = 0  # the batch in training
        self._hold: threading.Lock | None = None  # the producer's lock, held through validation

    def take(
        self, trainer: Trainer, batch: TrainBatch, run: Callable[[str, Callable[[], T]], T]
    ) -> tuple[Produced, float, dict[str, float]]:
        """Batch ``batch``'s rollouts, the seconds the loop waited for them, and the asynchronous metrics.

        ``run(what, fn)`` runs the producer's take (the callback's: on every rank together). The
        metrics: ``rollout/staleness`` (of the batch trained), ``rollout/staleness_<s>`` (batches
        trained at staleness s so far: the histogram), ``rollout/queue_depth``,
        ``rollout/generator_idle_s`` and ``rollout/trainer_idle_s`` (cumulative seconds each waited
        for the other), ``rollout/generated``, ``rollout/trained``, ``rollout/dropped``,
        ``rollout/in_flight`` (generated = trained + dropped + in flight).

        Raises:
            TypeError: the batch carries no ``position``.
            RuntimeError: the rollouts generated ahead are for other prompts than the batch's.
        """
        if batch.position is None:
            raise TypeError(
                "asynchronous rollouts need train batches that carry their position (PromptDataModule's do)"
            )
        epoch, step = batch.position
        self.number = epoch * trainer.num_training_batches + step
        if self.producer is None:
            self.producer = self._start(trainer)
        t0 = time.perf_counter()
        produced, waited, staleness = run(
            f"asynchronous rollouts of batch {self.number}", lambda: self.producer.take(self.number)
        )
        if produced.prompt_ids != batch.prompt_ids:
            raise RuntimeError(
                f"asynchronous rollouts: the rollouts generated ahead for batch {batch.position} are for other prompts "
                "than the loader's batch (the DataModule's train_prompt_ids_at and its loader disagree)"
            )
        seconds = time.perf_counter() - t0
        self.trainer_idle_s += waited
        self.staleness_counts[staleness] = self.staleness_counts.get(staleness, 0) + 1
        p = self.producer
        return (
            produced,
            seconds,
            {
                "rollout/staleness": staleness,
                "rollout/queue_depth": p.queue_depth,
                "rollout/generator_idle_s": p.generator_idle_s,
                "rollout/trainer_idle_s": self.trainer_idle_s,
                "rollout/generated": p.generated,
                "rollout/trained": p.trained,
                "rollout/dropped": p.dropped,
                "rollout/in_flight": p.in_flight,
                **{f"rollout/staleness_{s}": c for s, c in sorted(self.staleness_counts.items())},
            },
        )

    def _start(self, trainer: Trainer) -> RolloutProducer:
        """A producer on the trainer's DataModule and loop, generating from batch ``self.number`` on."""
        datamodule = trainer.datamodule
        require(datamodule, PromptSource, "RolloutCallback(max_staleness=...)", "DataModule")
        per_epoch = trainer.num_training_batches
        if not isinstance(per_epoch, int):
            raise ValueError("asynchronous rollouts need a train loader of known length (got num_training_batches=inf)")
        producer = RolloutProducer(
            generate=self.generate,
            params_at=self.params_at,
            global_step=lambda: trainer.global_step,
            source=datamodule,
            batches_per_epoch=per_epoch,
            options=self.options,
            steps_left=lambda: trainer.max_steps - trainer.global_step if trainer.max_steps >= 0 else None,
            max_batches=per_epoch * trainer.max_epochs if trainer.max_epochs not in (None, -1) else None,
        )
        producer.start(self.number)
        return producer

    def synced(self) -> None:
        """The weights now hold every update of the batches up to the one in training."""
        if self.producer is not None:
            self.producer.synced(self.number + 1)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the producer (a weight sync): the batch in generation finishes under the old weights first."""
        if self.producer is None:
            yield
            return
        t0 = time.perf_counter()
        with self.producer.paused():
            self.trainer_idle_s += time.perf_counter() - t0
            yield

    def hold(self) -> None:
        """Hold the producer until :meth:`release` (validation: the engine evaluates alone)."""
        if self.producer is not None and self._hold is None:
            self._hold = self.producer.paused()
            self._hold.acquire()

    def release(self) -> None:
        if self._hold is not None:
            self._hold.release()
            self._hold = None

    def stop(self) -> None:
        """Release any hold and stop the producer (a later batch starts a new one)."""
        self.release()
        if self.producer is not None:
            self.producer.stop()
            self.producer = None
