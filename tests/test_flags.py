"""Mapping flags merge into the configured mapping (lit_rlvr/flags.py), on a small jsonargparse parser.

The CLI's own merging (``lit-rlvr fit`` with the shipped configs) is in tests/cli/test_cli.py.
"""

from __future__ import annotations

import pytest
from jsonargparse import ActionConfigFile, ArgumentParser

from lit_rlvr.flags import lookup, mapping_flags, merge_mapping_flags, merged


@pytest.fixture
def parser_and_config(tmp_path):
    """A parser with a config file action, a dict option and an int, and a config setting the dict."""
    parser = ArgumentParser()
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_argument("--opts", type=dict, default={})
    parser.add_argument("--n", type=int, default=1)
    config = tmp_path / "config.yaml"
    config.write_text("opts: {a: 1, b: 2}\n")
    return parser, str(config)


def test_mapping_flags_are_the_flags_whose_value_is_a_non_empty_mapping():
    args = ["--config", "c.yaml", "--opts={c: 3, a: null}", "--n=2", "--empty={}", "--model.x={k: 1}", "--bad={"]
    assert mapping_flags(args, ("--",)) == {2: ("opts", {"c": 3, "a": None}), 5: ("model.x", {"k": 1})}
    assert mapping_flags(args, ("--model.",)) == {5: ("model.x", {"k": 1})}


def test_merged_merges_nested_mappings_and_none_removes_a_key():
    base = {"a": 1, "env": {"X": "1", "Y": "1"}, "keep": [1]}
    assert merged(base, {"env": {"Y": "2", "X": None}, "a": None, "b": 2}) == {"env": {"Y": "2"}, "keep": [1], "b": 2}
    assert base == {"a": 1, "env": {"X": "1", "Y": "1"}, "keep": [1]}  # not changed in place
    assert merged({"a": {"x": 1}}, {"a": 3}) == {"a": 3}  # a value that is not a mapping replaces


def test_lookup_reads_dotted_keys_through_init_args():
    config = {"model": {"init_args": {"loss": {"clip": 0.2}}}, "data": {"path": "p"}}
    assert lookup(config, "model.loss.clip") == 0.2
    assert lookup(config, "model.init_args.loss.clip") == 0.2
    assert lookup(config, "data.path") == "p"
    assert lookup(config, "model.loss.missing") is None and lookup(config, "nothing") is None


def test_a_mapping_flag_merges_into_the_configs_mapping(parser_and_config):
    parser, config = parser_and_config
    args = ["--config", config, "--opts={c: 3, a: null}", "--n=2"]
    out = merge_mapping_flags(parser, args)
    assert out == ["--config", config, "--opts={b: 2, c: 3}", "--n=2"]
    assert parser.parse_args(out).opts == {"b": 2, "c": 3}
    assert parser.parse_args(args).opts == {"c": 3, "a": None}  # what jsonargparse alone does: replaces


def test_an_empty_mapping_still_empties_and_other_sections_are_left_alone(parser_and_config):
    parser, config = parser_and_config
    assert merge_mapping_flags(parser, ["--config", config, "--opts={}"]) == ["--config", config, "--opts={}"]
    other = ["--config", config, "--opts={c: 3}"]
    assert merge_mapping_flags(parser, other, sections=("--model.",)) == other


def test_arguments_that_do_not_parse_are_left_for_the_final_parse_to_report(parser_and_config):
    parser, config = parser_and_config
    args = ["--config", config, "--opts={c: 3}", "--n=not-a-number"]
    assert merge_mapping_flags(parser, args) == args
