"""PassAtK and pass_at_k_curve against exact fractions (Chen et al. 2021, Eq. 1)."""

from fractions import Fraction
from math import comb

import lightning.pytorch as pl
import pytest
import torch

from lit_rlvr.functional.metrics import correct_counts, pass_at_k_curve, per_prompt_pass_at_k
from lit_rlvr.metrics import PassAtK, PassHatK


def exact(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def exact_mean(counts: list[tuple[int, int]], k: int) -> float:
    return float(sum(exact(n, c, k) for n, c in counts) / len(counts))


def random_correct(P: int, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    p = torch.rand(P, 1, generator=gen) ** 2  # many low-accuracy prompts, some high
    correct = torch.rand(P, n, generator=gen) < p
    correct[0] = False  # always include the all-wrong and all-right edge cases
    correct[-1] = True
    return correct


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("P,n", [(1, 1), (2, 3), (7, 16), (40, 64), (5, 1024)])
def test_class_and_functional_match_exact_fractions(P, n, seed):
    ks = tuple(k for k in (1, 2, 3, 4, 8, 16, 64, 1024) if k <= n)
    correct = random_correct(P, n, seed)
    counts = [(n, int(c)) for c in correct.sum(1)]
    metric = PassAtK(k=ks)
    metric.update(correct)
    got_class = metric.compute()
    got_fn = pass_at_k_curve(correct, k=ks)
    assert list(got_class) == [f"pass@{k}" for k in ks]
    for k in ks:
        want = exact_mean(counts, k)
        assert got_class[f"pass@{k}"].item() == pytest.approx(want, rel=1e-11, abs=1e-13)
        assert got_fn[f"pass@{k}"].item() == pytest.approx(want, rel=1e-11, abs=1e-13)


@pytest.mark.parametrize("seed", [0, 1])
def test_per_prompt_values_with_mixed_n_match_fractions(seed):
    gen = torch.Generator().manual_seed(seed)
    n = torch.randint(4, 40, (60,), generator=gen)
    c = (torch.rand(60, generator=gen) * (n + 1)).floor().long()
    got = per_prompt_pass_at_k(c, n, (1, 2, 4))
    rows = [[float(exact(int(ni), int(ci), k)) for k in (1, 2, 4)] for ni, ci in zip(n, c)]
    want = torch.tensor(rows, dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-14)


def test_updates_with_different_n_average_per_prompt_estimates():
    a, b = random_correct(6, 4, 0), random_correct(3, 10, 1)
    metric = PassAtK(k=(1, 2, 4))
    metric.update(a)
    metric.update(num_correct=b.sum(1), n=10)
    counts = [(4, int(c)) for c in a.sum(1)] + [(10, int(c)) for c in b.sum(1)]
    out = metric.compute()
    for k in (1, 2, 4):
        assert out[f"pass@{k}"].item() == pytest.approx(exact_mean(counts, k), rel=1e-12)


@pytest.mark.parametrize("seed", [0, 3])
def test_counts_and_bool_and_float_inputs_agree(seed):
    correct = random_correct(25, 12, seed)
    ks = (1, 2, 5, 12)
    by_bool = pass_at_k_curve(correct, k=ks)
    by_float = pass_at_k_curve(correct.float(), k=ks)
    by_counts = pass_at_k_curve(num_correct=correct.sum(1), n=12, k=ks)
    by_count_tensor_n = pass_at_k_curve(num_correct=correct.sum(1), n=torch.full((25,), 12), k=ks)
    for key in by_bool:
        assert by_bool[key] == by_float[key] == by_counts[key] == by_count_tensor_n[key]


def test_class_equals_functional_over_several_updates_and_forward():
    chunks = [random_correct(P, 8, s) for s, P in enumerate([3, 1, 9])]
    metric = PassAtK(k=(1, 4, 8))
    batch_values = [metric(chunk) for chunk in chunks]  # forward: batch value, and accumulates
    assert batch_values[1] == pass_at_k_curve(chunks[1], k=(1, 4, 8))
    want = pass_at_k_curve(torch.cat(chunks), k=(1, 4, 8))
    got = metric.compute()
    for key in want:
        assert got[key].item() == pytest.approx(want[key].item(), rel=1e-14)
    metric.reset()
    metric.update(chunks[0])
    assert metric.compute() == pass_at_k_curve(chunks[0], k=(1, 4, 8))


def test_k_larger_than_n_is_an_error_naming_k_and_n():
    metric = PassAtK(k=(1, 2, 4, 8, 16))
    with pytest.raises(ValueError, match=r"k=16 exceeds n=8"):
        metric.update(torch.ones(3, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"k=16 exceeds n=5"):
        metric.update(num_correct=torch.tensor([1, 2]), n=torch.tensor([20, 5]))
    assert metric.num_prompts.item() == 0  # nothing was counted by the failed updates


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({}, "exactly one"),
        ({"correct": torch.ones(2, 2), "num_correct": torch.ones(2)}, "exactly one"),
        ({"correct": torch.ones(2, 2), "n": 2}, "implied"),
        ({"correct": torch.ones(4)}, r"\(P, n\) tensor, got \(4,\)"),
        ({"correct": torch.tensor([[0.5, 1.0]])}, "bool or 0/1"),
        ({"num_correct": torch.tensor([1, 2])}, "needs `n`"),
        ({"num_correct": torch.tensor([1, 3]), "n": 2}, "num_correct=3, n=2"),
        ({"num_correct": torch.tensor([1.5]), "n": 2}, "integer counts"),
    ],
)
def test_bad_inputs_are_specific_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        correct_counts(**kwargs)


@pytest.mark.parametrize("k", [(), (0, 1), (1, 1), (2.0,)])
def test_bad_budgets_rejected(k):
    with pytest.raises(ValueError, match="PassAtK: k"):
        PassAtK(k=k)


@pytest.mark.parametrize("k", [1, 3, 16])
def test_int_k_is_the_scalar_form_of_the_ladder(k):
    chunks = [random_correct(P, 16, s) for s, P in enumerate([4, 7])]
    scalar, ladder = PassAtK(k=k), PassAtK(k=(1, k) if k != 1 else (1,))
    batch = scalar(chunks[0])  # forward: the batch value, as a tensor
    assert isinstance(batch, torch.Tensor) and batch.ndim == 0
    assert batch.item() == pytest.approx(exact_mean([(16, int(c)) for c in chunks[0].sum(1)], k), rel=1e-12)
    scalar.update(chunks[1])
    for chunk in chunks:
        ladder.update(chunk)
    got = scalar.compute()
    assert isinstance(got, torch.Tensor) and got.ndim == 0 and got.dtype == torch.float64
    assert got == ladder.compute()[f"pass@{k}"]


@pytest.mark.parametrize("k", [0, -2, True])
def test_bad_scalar_budget_rejected(k):
    with pytest.raises(ValueError, match="PassAtK: k"):
        PassAtK(k=k)


class PassAtKModule(pl.LightningModule):
    """Logs metric objects in ``validation_step``, as a user's LightningModule would."""

    def __init__(self, batches: list[torch.Tensor]):
        super().__init__()
        self.batches = batches
        self.pass16, self.pass1 = PassAtK(k=16), PassAtK(k=1)

    def validation_step(self, batch, batch_idx):
        self.pass16.update(batch)
        self.pass1.update(batch)
        self.log("val/pass@16", self.pass16)  # the metric object: Lightning computes it at epoch end
        self.log("val/pass@1", self.pass1)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.batches, batch_size=None)


def test_scalar_metric_object_logs_in_a_lightning_module(tmp_path):
    batches = [random_correct(P, 16, s) for s, P in enumerate([5, 2, 9])]
    trainer = pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    (result,) = trainer.validate(PassAtKModule(batches), verbose=False)
    counts = [(16, int(c)) for b in batches for c in b.sum(1)]
    for k in (1, 16):
        assert result[f"val/pass@{k}"] == pytest.approx(exact_mean(counts, k), rel=1e-6)  # over all prompts
        assert trainer.callback_metrics[f"val/pass@{k}"].item() == pytest.approx(exact_mean(counts, k), rel=1e-6)


def test_plot_draws_the_ladder_against_log2_k():
    pytest.importorskip("matplotlib")
    correct = random_correct(30, 16, 0)
    metric = PassAtK(k=(1, 2, 4, 16))
    metric.update(correct)
    fig, ax = metric.plot()
    assert fig is not None and ax.get_xscale() == "log" and len(ax.lines) == 1
    want = pass_at_k_curve(correct, k=(1, 2, 4, 16))
    assert ax.lines[0].get_xdata().tolist() == [1, 2, 4, 16]
    assert ax.lines[0].get_ydata().tolist() == pytest.approx([v.item() for v in want.values()], rel=1e-12)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "16"]
    assert ax.get_ylim() == (0.0, 1.0) and ax.get_xlabel().startswith("k") and ax.get_ylabel() == "pass@k"


def test_plot_of_several_ladders_on_a_given_axis_draws_one_labelled_curve_each():
    plt = pytest.importorskip("matplotlib.pyplot")
    early, late = (
        pass_at_k_curve(random_correct(10, 8, 1), k=(1, 8)),
        pass_at_k_curve(random_correct(10, 8, 2), k=(1, 2, 8)),
    )
    _, ax = plt.subplots()
    fig, same_ax = PassAtK(k=(1, 8)).plot([early, late], ax=ax)
    assert fig is None and same_ax is ax  # torchmetrics: no new figure when an axis is given
    assert [line.get_xdata().tolist() for line in ax.lines] == [[1, 8], [1, 2, 8]]
    assert ax.lines[1].get_ydata().tolist() == pytest.approx([v.item() for v in late.values()])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["0", "1"]
    with pytest.raises(ValueError, match="keys like 'pass@16'"):
        PassAtK(k=(1, 8)).plot({"maj@1": torch.tensor(0.5)})
    with pytest.raises(ValueError, match="non-empty"):
        PassAtK(k=(1, 8)).plot([])


def test_plot_of_the_scalar_form_is_torchmetrics_single_value_plot():
    pytest.importorskip("matplotlib")
    metric = PassAtK(k=4)
    values = []
    for seed in range(3):
        values.append(metric(random_correct(6, 8, seed)))
    _, ax = metric.plot(values)  # a series over steps
    assert ax.lines[0].get_ydata().tolist() == pytest.approx([v.item() for v in values])
    _, ax = metric.plot()
    assert ax.lines[0].get_ydata().tolist() == pytest.approx([metric.compute().item()])


def test_a_failed_environments_trajectory_is_left_out_of_pass_at_k_by_hand():
    """Prompt 0: 1, 0, 0 and a failed trajectory (3 valid samples); prompt 1: 1, 1, 0, 0."""
    from lit_rlvr.metrics.panel import ValidationPanel

    correct = torch.tensor([[True, False, False, False], [True, True, False, False]])
    failed = torch.tensor([False, False, False, True, False, False, False, False])
    panel = ValidationPanel(n=4, ks=(1, 2, 4), max_turns=2)
    behaviour = (
        torch.ones(8, dtype=torch.long),
        torch.zeros(8, dtype=torch.long),
        torch.zeros(8, dtype=torch.long),
        failed,
    )
    answers = [["a", None, None, None], ["a", "a", None, None]]
    texts = [["x"] * 4, ["y"] * 4]
    panel.update(
        correct, answers, texts, correct.flatten().float(), torch.tensor([True, True]), behaviour, [[()] * 4] * 2
    )
    got = {k: float(v) for k, v in panel.compute().items()}
    # prompt 0 (c = 1 of n = 3): pass@1 1/3, pass@2 1 − C(2,2)/C(3,2) = 2/3, pass@4 not estimable (left out);
    # prompt 1 (c = 2 of 4): pass@1 1/2, pass@2 1 − C(2,2)/C(4,2) = 5/6, pass@4 1
    want = {"pass@1": (1 / 3 + 1 / 2) / 2, "pass@2": (2 / 3 + 5 / 6) / 2, "pass@4": 1.0}
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-6) and got[f"retention/{key}"] == pytest.approx(value, abs=1e-6)
    # pass^k over the same valid samples: prompt 0 C(1,k)/C(3,k), prompt 1 C(2,k)/C(4,k); pass^4 only prompt 1's 0
    want_hat = {"pass^1": (1 / 3 + 2 / 4) / 2, "pass^2": (0 + 1 / 6) / 2, "pass^4": 0.0}
    assert {k: pytest.approx(got[k], abs=1e-6) for k in want_hat} == want_hat
    # without failures: the same values as the plain update, bit for bit
    plain, with_valid = PassAtK(k=(1, 2, 4)), PassAtK(k=(1, 2, 4))
    plain.update(correct)
    with_valid.update(correct, valid=torch.ones_like(correct))
    assert all(torch.equal(plain.compute()[k], with_valid.compute()[k]) for k in ("pass@1", "pass@2", "pass@4"))
    with pytest.raises(ValueError, match="`valid` needs `correct`"):
        PassAtK(k=1).update(num_correct=torch.tensor([1]), n=2, valid=torch.ones(1, 2, dtype=torch.bool))


@pytest.mark.parametrize("seed", range(3))
def test_pass_hat_k_metric_is_the_mean_of_exact_per_prompt_fractions_over_updates(seed):
    """PassHatK over two updates with different n equals the mean over prompts of C(c, k)/C(n, k)."""
    gen = torch.Generator().manual_seed(seed)
    first = torch.rand(5, 8, generator=gen) < 0.7
    second = torch.rand(3, 4, generator=gen) < 0.5
    metric = PassHatK(k=(1, 2, 4))
    metric.update(first)
    metric.update(num_correct=second.sum(1), n=4)
    coverage = PassAtK(k=(1, 2, 4))
    coverage.update(first)
    coverage.update(num_correct=second.sum(1), n=4)
    got, at = metric.compute(), coverage.compute()
    counts = [(8, int(c)) for c in first.sum(1)] + [(4, int(c)) for c in second.sum(1)]
    for k in (1, 2, 4):
        want = sum(Fraction(comb(c, k), comb(n, k)) for n, c in counts) / len(counts)
        assert got[f"pass^{k}"].item() == pytest.approx(float(want), abs=1e-12)
        assert got[f"pass^{k}"] <= at[f"pass@{k}"]  # all k right implies one of k right
    assert got["pass^1"] == at["pass@1"]
    scalar, ladder = PassHatK(k=2), PassHatK(k=(2,))
    scalar.update(first)
    ladder.update(first)
    assert scalar.compute() == ladder.compute()["pass^2"]
