"""ValidationPanels.log: a set's panel logged through the module, once, then reset."""

from __future__ import annotations

from types import SimpleNamespace

from lit_rlvr.metrics import ValidationPanels


def test_a_panel_is_logged_under_its_set_then_reset():
    panels = ValidationPanels(ks=[1])
    panels.panel("s", 2)
    score = lambda r: SimpleNamespace(reward=r, correct=r, answer=str(r))  # noqa: E731
    panels.add("s", 2, ["p"], [score(1.0), score(0.0)], ["a", "b"])
    calls = []
    module = SimpleNamespace(log_dict=lambda values, **kwargs: calls.append((values, kwargs)))
    panels.log(module, "s")
    values, kwargs = calls[0]
    assert float(values["val/s/pass@1"]) == 0.5 and all(k.startswith("val/s/") for k in values)
    assert kwargs == {"sync_dist": False, "batch_size": 1, "add_dataloader_idx": False}
    panels.log(module, "s")
    assert calls[1][0] == {}  # reset: nothing until the next update
