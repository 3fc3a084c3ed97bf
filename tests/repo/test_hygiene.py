"""Tests never write into the working tree: the check every test runs under (conftest) sees a write."""

from __future__ import annotations

import tests.conftest as conftest


def test_the_tree_check_sees_new_changed_and_deleted_files(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x")
    (tmp_path / ".venv").mkdir()
    before = conftest._tree_state(tmp_path)
    (tmp_path / ".venv" / "ignored.txt").write_text("y")  # not the working tree
    assert conftest._tree_state(tmp_path) == before
    (tmp_path / "config.yaml").write_text("saved by a CLI run")  # what a test must never do
    assert str(tmp_path / "config.yaml") in set(conftest._tree_state(tmp_path)) - set(before)
