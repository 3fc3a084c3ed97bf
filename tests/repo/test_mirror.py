"""The tests mirror the package: the rule "one test home per part of ``lit_rlvr``, and nothing else at
the top of ``tests/``".

- every subpackage ``lit_rlvr/<part>/`` has a folder ``tests/<part>/`` holding at least one test file;
- every module ``lit_rlvr/<name>.py`` (but ``__init__.py``, the public API: tests/repo/test_package.py)
  has a test file ``tests/test_<name>.py``;
- the other way round, every folder at the top of ``tests/`` is a part's mirror or one of
  :data:`NOT_PARTS` (what crosses the parts), and every test file at the top of ``tests/`` is a
  module's mirror, so the top level cannot grow flat again.

A new part of the package therefore comes with the place its tests live.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO_ROOT

NOT_PARTS = {
    "integration": "multi-process and end-to-end fits that cross the parts",
    "repo": "repository checks: docs, layout, hygiene, packaging, shipped configs",
    "benchmarks": "the benchmarks/ scripts' own tests",
    "fixtures": "files the tests read (a 0.1 checkpoint and configs)",
}


def mirror_problems(package: Path, tests: Path) -> list[str]:
    """What breaks the rule in a package folder and its tests folder, one line each (empty: none)."""
    problems = []
    parts = {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    for part in sorted(parts):
        if not any((tests / part).glob("test_*.py")):
            problems.append(f"lit_rlvr/{part}/ has no tests: add tests/{part}/test_*.py")
    for module in sorted(modules):
        if not (tests / f"test_{module}.py").is_file():
            problems.append(f"lit_rlvr/{module}.py has no tests: add tests/test_{module}.py")
    for folder in sorted(p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"):
        if folder not in parts and folder not in NOT_PARTS:
            problems.append(f"tests/{folder}/ mirrors no part of lit_rlvr (move its tests to the part they test)")
    for file in sorted(p.name for p in tests.glob("test_*.py")):
        if file.removeprefix("test_").removesuffix(".py") not in modules:
            problems.append(f"tests/{file} mirrors no module of lit_rlvr (move it under the part it tests)")
    return problems


def test_every_part_of_the_package_has_its_mirror_under_tests():
    assert mirror_problems(REPO_ROOT / "lit_rlvr", REPO_ROOT / "tests") == []


def test_the_mirror_check_names_each_part_without_tests_and_each_stray(tmp_path):
    package, tests = tmp_path / "lit_rlvr", tmp_path / "tests"
    for folder in (package / "policy", package / "rollout", tests / "rollout", tests / "misc", tests / "integration"):
        folder.mkdir(parents=True)
    for file in ("__init__.py", "policy/__init__.py", "rollout/__init__.py", "options.py", "ranks.py"):
        (package / file).write_text("")
    for file in ("rollout/test_turns.py", "test_ranks.py", "test_everything.py", "conftest.py"):
        (tests / file).write_text("")
    (package / "notes").mkdir()  # a folder that is not a package: not a part
    assert mirror_problems(package, tests) == [
        "lit_rlvr/policy/ has no tests: add tests/policy/test_*.py",
        "lit_rlvr/options.py has no tests: add tests/test_options.py",
        "tests/misc/ mirrors no part of lit_rlvr (move its tests to the part they test)",
        "tests/test_everything.py mirrors no module of lit_rlvr (move it under the part it tests)",
    ]
