"""The micro-batching options parse from the command line and YAML as the module takes them."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from lit_rlvr.cli import main

BASE = Path(__file__).resolve().parents[1] / "configs" / "math" / "base.yaml"


@pytest.fixture
def model_options(print_config):
    """The parsed ``model.init_args`` of the math base config with ``args`` on top."""
    return lambda *args: print_config("fit", "--config", str(BASE), *args)["model"]["init_args"]


@pytest.mark.parametrize("given,parsed", [("auto", "auto"), ("true", True), ("false", False)])
def test_padding_free_and_token_budget_parse(given, parsed, model_options):
    model = model_options(f"--model.batching.padding_free={given}", "--model.batching.micro_batch_tokens=4096")
    assert model["batching"]["padding_free"] == parsed and model["batching"]["micro_batch_tokens"] == 4096


def test_defaults_are_auto_and_no_budget(model_options):
    model = model_options()
    assert model["batching"]["padding_free"] == "auto" and model["batching"]["micro_batch_tokens"] is None


def test_a_wrong_padding_free_value_names_the_key():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit):
        main(["fit", "--config", str(BASE), "--model.batching.padding_free=always", "--print_config"])
    assert "padding_free" in err.getvalue()
