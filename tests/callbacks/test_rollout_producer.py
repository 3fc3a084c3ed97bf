"""RolloutProducer against a fake engine and loop: order, staleness bounds, counters, k = 0 on request."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from lit_rlvr.callbacks.rollout_producer import AsyncRollouts, RolloutProducer
from lit_rlvr.contracts import TrainBatch
from lit_rlvr.rollout.options import AsyncOptions
from lit_rlvr.rollout.types import Rollouts, SamplingParams


class _Source:
    """Batch (epoch, step) has one prompt [epoch, step]."""

    def train_prompt_ids_at(self, epoch: int, step: int) -> list[list[int]]:
        return [[epoch, step]]

    def train_rows_at(self, epoch: int, step: int) -> list[dict]:
        return [{"id": f"{epoch}/{step}"}]


class _Loop:
    """The weights' version and global step as a training loop moves them; a fake engine that
    records which version generated what and when."""

    def __init__(self, gen_s: float = 0.0):
        self.step, self.gen_s, self.calls, self.lock = 0, gen_s, [], threading.Lock()
        self.weights = 0  # the version the engine holds

    def generate(self, prompt_ids, rows, params: SamplingParams) -> Rollouts:
        assert [r["id"] for r in rows] == [
            f"{p[0]}/{p[1]}" for p in prompt_ids
        ]  # the batch's rows travel with its prompts
        with self.lock:
            self.calls.append((tuple(map(tuple, prompt_ids)), params.seed, self.weights))
        time.sleep(self.gen_s)
        return Rollouts(
            [list(p) for p in prompt_ids],
            [[1]] * len(prompt_ids),
            [[-0.5]] * len(prompt_ids),
            ["stop"] * len(prompt_ids),
            1,
            ["x"] * len(prompt_ids),
        )

    def producer(self, k: int, on_stale: str = "wait", per_epoch: int = 3) -> RolloutProducer:
        return RolloutProducer(
            self.generate,
            lambda g, lane: SamplingParams(n=1, seed=g * 100 + lane),
            lambda: self.step,
            _Source(),
            per_epoch,
            AsyncOptions(k, on_stale),
        )

    def train(self, producer: RolloutProducer, first: int, batches: int, train_s: float = 0.0):
        out = []
        self.weights = first  # the weights hold every batch before the first (a resumed run)
        producer.start(first)
        for number in range(first, first + batches):
            produced, _, staleness = producer.take(number)
            out.append((number, produced.prompt_ids, staleness, produced.version))
            time.sleep(train_s)
            with producer.paused():  # the weight sync
                self.step += 1
                self.weights = number + 1
            producer.synced(number + 1)
        return out


@pytest.mark.parametrize("k", [0, 1, 2])
def test_wait_keeps_order_bounds_staleness_and_counts(k):
    loop = _Loop(gen_s=0.01)
    producer = loop.producer(k)
    out = loop.train(producer, first=0, batches=7, train_s=0.03)
    time.sleep(0.1)  # let the producer run as far ahead as it may
    producer.stop()
    assert [n for n, *_ in out] == list(range(7))
    assert [p for _, p, *_ in out] == [[[n // 3, n % 3]] for n in range(7)]  # the loader's order across epochs
    assert all(0 <= s <= k for _, _, s, _ in out)
    assert k == 0 or max(s for _, _, s, _ in out) == k  # training slower than generation: the lag fills up
    assert producer.dropped == 0 and producer.trained == 7
    assert producer.generated == producer.trained + producer.dropped + producer.in_flight
    assert producer.in_flight <= k + 1  # after the last sync: batches v .. v + k
    for prompts, seed, weights in loop.calls:  # each batch generated with the version it says
        number = prompts[0][0] * 3 + prompts[0][1]
        version = next((v for n, _, _, v in out if n == number), None)
        assert version is None or version == weights


def test_k0_is_the_synchronous_loop():
    """Generation only when the loop asks, with the weights of every earlier batch and lane 0."""
    loop = _Loop()
    producer = loop.producer(0)
    out = loop.train(producer, first=4, batches=4, train_s=0.02)
    producer.stop()
    assert len(loop.calls) == 4  # nothing generated ahead
    assert [s for _, _, s, _ in out] == [0, 0, 0, 0]
    assert [seed for _, seed, _ in loop.calls] == [0, 100, 200, 300]  # the step's seed, lane 0
    assert [w for *_, w in loop.calls] == [4, 5, 6, 7]


def test_drop_regenerates_what_is_too_old_and_counts_it():
    loop = _Loop()
    producer = loop.producer(0, "drop")
    out = loop.train(producer, first=0, batches=5, train_s=0.03)
    producer.stop()
    assert all(s == 0 for _, _, s, _ in out)
    assert producer.dropped >= 1 and producer.trained == 5
    assert producer.generated == producer.trained + producer.dropped + producer.in_flight


def test_a_failed_generation_reaches_the_loop():
    def boom(prompt_ids, rows, params):
        raise OSError("server gone")

    producer = RolloutProducer(boom, lambda g, lane: SamplingParams(n=1), lambda: 0, _Source(), 3, AsyncOptions(1))
    producer.start(0)
    with pytest.raises(RuntimeError, match="rollout producer failed: OSError: server gone"):
        producer.take(0)
    producer.stop()


def test_an_out_of_order_take_is_refused():
    loop = _Loop()
    producer = loop.producer(1)
    producer.start(2)
    with pytest.raises(RuntimeError, match="took batch 3, the producer expected 2"):
        producer.take(3)
    producer.stop()


@pytest.mark.parametrize(("max_steps", "max_batches", "trained"), [(5, None, 5), (None, 6, 6)])
def test_nothing_is_generated_past_the_end_of_the_run(max_steps, max_batches, trained):
    """With steps or epochs bounded, the producer runs ahead only as far as training will go."""
    loop = _Loop()
    steps_left = (lambda: max_steps - loop.step) if max_steps is not None else (lambda: None)
    producer = RolloutProducer(
        loop.generate,
        lambda g, lane: SamplingParams(n=1, seed=g * 100 + lane),
        lambda: loop.step,
        _Source(),
        3,
        AsyncOptions(2),
        steps_left=steps_left,
        max_batches=max_batches,
    )
    loop.train(producer, first=0, batches=trained, train_s=0.02)
    time.sleep(0.1)  # let the producer run as far ahead as it may
    producer.stop()
    assert len(loop.calls) == trained and producer.in_flight == 0


def test_the_loops_side_takes_checks_counts_and_holds():
    """AsyncRollouts as RolloutCallback drives it: the producer starts at the first batch taken (here a
    resumed run at epoch 1, step 1), each batch's rollouts are checked against its prompts, and the
    metrics count staleness, waits and batches."""
    loop = _Loop()
    trainer = SimpleNamespace(
        num_training_batches=3, global_step=0, max_steps=-1, max_epochs=None, datamodule=_Source()
    )
    ahead = AsyncRollouts(AsyncOptions(1), loop.generate, lambda g, lane: SamplingParams(n=1, seed=g * 100 + lane))
    ran = []

    def run(what, fn):
        ran.append(what)
        return fn()

    metrics = []
    for position in ((1, 1), (1, 2)):
        produced, seconds, m = ahead.take(trainer, TrainBatch([{}], [list(position)], position=position), run)
        assert produced.prompt_ids == [list(position)] and seconds >= 0
        metrics.append(m)
        while ahead.producer.generated < 2:  # batch 5 is generated ahead, under batch 4's weights
            time.sleep(0.005)
        with ahead.paused():  # the weight sync
            trainer.global_step += 1
            loop.weights = ahead.number + 1
        if position == (1, 2):
            ahead.hold()  # validation: no batch starts while held, though the new weights allow batch 7
        ahead.synced()
    batch_7 = ((2, 1),)
    time.sleep(0.1)
    assert batch_7 not in [prompts for prompts, *_ in loop.calls]
    ahead.release()
    while batch_7 not in [prompts for prompts, *_ in loop.calls]:
        time.sleep(0.005)
    assert ran == ["asynchronous rollouts of batch 4", "asynchronous rollouts of batch 5"]
    assert [m["rollout/staleness"] for m in metrics] == [0, 1]
    assert {k: v for k, v in metrics[1].items() if k.startswith("rollout/staleness_")} == {
        "rollout/staleness_0": 1,
        "rollout/staleness_1": 1,
    }
    assert ahead.staleness_counts == {0: 1, 1: 1}
    assert metrics[1]["rollout/trained"] == 2 and metrics[1]["rollout/dropped"] == 0
    assert metrics[1]["rollout/trainer_idle_s"] >= metrics[0]["rollout/trainer_idle_s"] >= 0
    with pytest.raises(RuntimeError, match=r"generated ahead for batch \(2, 0\) are for other prompts"):
        ahead.take(trainer, TrainBatch([{}], [[9, 9]], position=(2, 0)), run)
    with pytest.raises(TypeError, match="carry their position"):
        ahead.take(trainer, TrainBatch([{}], [[2, 1]]), run)
    ahead.stop()
    assert ahead.producer is None
