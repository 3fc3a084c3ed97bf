"""Tests never write into the working tree: the check every test runs under (conftest) sees a write."""

from __future__ import annotations

import os

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


def test_the_per_test_check_sees_a_new_file_and_the_module_scan_a_file_changed_in_place(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x")
    watch = conftest._TreeWatch(tmp_path)
    assert watch.touched() == [] and watch.touched(full=True) == []
    (tmp_path / "pkg" / "sub" / "new.txt").write_text("written by a test")
    assert watch.touched() == [str(tmp_path / "pkg" / "sub" / "new.txt")]
    assert watch.touched() == []  # reported once: the scan is the new reference
    os.utime(tmp_path / "pkg" / "a.py", ns=(1, 1))  # changed in place: no folder's mtime moves
    assert watch.touched() == []
    assert watch.touched(full=True) == [str(tmp_path / "pkg" / "a.py")]
    (tmp_path / "pkg" / "sub" / "new.txt").unlink()
    assert watch.touched() == [str(tmp_path / "pkg" / "sub" / "new.txt")]
