"""The environment registry: names, import paths, plug-ins, options, versions; the Step record."""

from __future__ import annotations

import sys
import textwrap

import pytest

from lit_rlvr.envs import ENVIRONMENTS, Environment, EnvironmentBase, Step, register_environment, resolve_environment
from lit_rlvr.envs.base import ForeignEnvironment, declared_version
from lit_rlvr.plugins import load_plugins


@pytest.fixture
def scratch_env():
    """Registers ``_test_counter`` for one test."""

    def positive(limit):
        if not limit > 0:
            raise ValueError(f"limit must be > 0, got {limit}")

    @register_environment("_test_counter", check=positive)
    class Counter(EnvironmentBase):
        version = "7"

        def __init__(self, *, limit: int = 3, tokenizer=None):
            self.limit, self.tokenizer, self.n = limit, tokenizer, 0

        def step(self, action):
            self.n += 1
            return Step(str(self.n), reward=float(self.n), done=self.n >= self.limit)

    yield Counter
    ENVIRONMENTS.pop("_test_counter")


def test_registered_names_options_and_versions(scratch_env):
    spec = resolve_environment("_test_counter", {"limit": 2})
    assert (spec.name, spec.version, spec.identity, dict(spec.options)) == (
        "_test_counter",
        "7",
        "_test_counter@7",
        {"limit": 2},
    )
    env = spec.make(tokenizer="TOK")
    assert env.tokenizer == "TOK"  # injected to a factory that takes it
    assert [env.step("x").done for _ in range(2)] == [False, True]
    with pytest.raises(ValueError, match="already registered"):
        register_environment("_test_counter")(scratch_env)
    with pytest.raises(ValueError, match=r"env: unknown environment 'nope'; valid names: \[.*'sql'.*\]"):
        resolve_environment("nope", key="env")
    with pytest.raises(
        ValueError,
        match=r"env_options: unknown option\(s\) \['limt'\] of environment '_test_counter'; accepted: \['limit'\]",
    ):
        resolve_environment("_test_counter", {"limt": 2}, key="env")
    with pytest.raises(ValueError, match="env_options: limit must be > 0, got 0"):
        resolve_environment("_test_counter", {"limit": 0}, key="env")
    with pytest.raises(ValueError, match="env_options: unknown option"):
        resolve_environment("_test_counter", {"tokenizer": "x"}, key="env")  # injected, never an option
    with pytest.raises(TypeError, match="has no step method"):
        register_environment("_test_broken")(type("Broken", (), {"reset": lambda self, row, max_turns: None}))


def test_builtins_are_registered_with_their_options():
    assert {"sql", "calculator", "skyrl", "trl"} <= set(ENVIRONMENTS)
    assert ENVIRONMENTS.options("sql") == [
        "answer_tag",
        "format_reward",
        "max_chars",
        "max_rows",
        "mode",
        "reminder",
        "sql_tag",
        "timeout_s",
    ]
    with pytest.raises(
        ValueError, match="environment_options: mode must be one of \\('spider', 'bird'\\); got 'postgres'"
    ):
        resolve_environment("sql", {"mode": "postgres"})
    with pytest.raises(ValueError, match="sql_tag and answer_tag must differ"):
        resolve_environment("sql", {"sql_tag": "x", "answer_tag": "x"})
    assert resolve_environment("sql", {"sql_tag": "query"}).make().stop == ("</query>", "</solution>")


USER_ENVS = textwrap.dedent('''
    from lit_rlvr.envs import Step

    class Native:
        """A lit_rlvr environment written in a user's file."""
        stop = ("!",)

        def __init__(self, *, greeting: str = "hi"):
            self.greeting = greeting

        def reset(self, row, max_turns):
            return None

        def step(self, action):
            return Step(self.greeting, done=True, reward=1.0)

    class TRLStyle:
        """A TRL environment_factory class: reset and tools, no step."""

        def reset(self, **row):
            self.total = 0
            return None

        def add(self, x: int) -> int:
            """Add x to the total.

            Args:
                x: the amount.
            """
            self.total += x
            return self.total
''')


def test_import_paths_native_trl_and_skyrl_classes(tmp_path, monkeypatch):
    path = tmp_path / "my_envs.py"
    path.write_text(USER_ENVS)
    spec = resolve_environment(f"{path}:Native", {"greeting": "hello"})
    assert spec.make().step("x").observation == "hello"
    assert spec.version.startswith("src-")  # no declared version: a digest of its source
    with pytest.raises(ValueError, match=r"environment_options: unknown option\(s\) \['colour'\]"):
        resolve_environment(f"{path}:Native", {"colour": 1})
    trl_spec = resolve_environment(f"{path}:TRLStyle")
    assert trl_spec.name == "trl" and dict(trl_spec.options) == {"factory": f"{path}:TRLStyle"}
    sky = resolve_environment("skyrl_gym.envs.sql.env:SQLEnv", {"db_path": "/data"})
    assert sky.name == "skyrl" and dict(sky.options) == {
        "env": "skyrl_gym.envs.sql.env:SQLEnv",
        "env_config": {"db_path": "/data"},
    }
    assert sky.version.startswith("skyrl_gym-0.4")
    with pytest.raises(ImportError, match="environment 'no_such_module:Env'"):
        resolve_environment("no_such_module:Env")


def test_a_plugin_module_registers_an_environment(tmp_path, monkeypatch):
    package = tmp_path / "agentproj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "envs.py").write_text(
        USER_ENVS
        + "\nfrom lit_rlvr.envs import register_environment\nregister_environment('_test_plugin_env')(Native)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        load_plugins(["agentproj.envs"], entry_point_group=None)
        assert resolve_environment("_test_plugin_env").make().step("x").reward == 1.0
    finally:
        ENVIRONMENTS.pop("_test_plugin_env", None)
        sys.modules.pop("agentproj.envs", None)


def test_step_checks_its_fields():
    assert Step([{"role": "tool", "content": "4"}]).observation == [{"role": "tool", "content": "4"}]
    for bad in (True, float("inf"), "1"):
        with pytest.raises(ValueError, match="Step.reward must be a finite number or None"):
            Step(reward=bad)
    with pytest.raises(TypeError, match="Step.observation must be text or a list of chat messages"):
        Step([{"role": "tool"}])
    assert declared_version(type("V", (), {"version": "3"})) == "3"


def test_the_protocol_is_every_member_the_loop_uses_and_the_base_defaults_all_but_step(tmp_path):
    import typing

    members = {"stop", "version", "reset", "step", "step_tokens", "close"}
    declared = getattr(Environment, "__protocol_attrs__", None) or typing._get_protocol_attrs(Environment)  # 3.11
    assert set(declared) == members and members <= set(dir(EnvironmentBase))
    base = EnvironmentBase()
    assert isinstance(base, Environment) and (base.stop, base.version, base.close()) == ((), "1", None)
    with pytest.raises(NotImplementedError):
        base.step_tokens("x", [1], [])  # answers with step, which a subclass writes

    class Tokens(EnvironmentBase):
        def step(self, action):
            return Step(action)

    assert Tokens().step_tokens("the text", [4, 5], [1, 2, 3]).observation == "the text"


FOREIGN = textwrap.dedent("""
    from lit_rlvr.envs import Step

    CLOSED = []

    class OnlyResetAndStep:
        stop = ("!",)

        def reset(self, row, max_turns):
            return None

        def step(self, action):
            return Step(action.upper(), done=True)

    class Complete:
        stop, version = (), "3"

        def reset(self, row, max_turns):
            return None

        def step(self, action):
            return Step("text")

        def step_tokens(self, action, ids, prefix):
            return Step(f"{len(prefix)}+{len(ids)}")

        def close(self):
            CLOSED.append(self)
""")


def test_a_foreign_object_is_completed_once_when_made(tmp_path):
    """An environment not derived from EnvironmentBase gets the defaults it lacks at make, so the loop
    calls every member directly; one that has them all is used as it is."""
    path = tmp_path / "foreign_envs.py"
    path.write_text(FOREIGN)
    spec = resolve_environment(f"{path}:OnlyResetAndStep")
    env = spec.make()
    assert isinstance(env, ForeignEnvironment) and isinstance(env, Environment)
    assert (env.stop, env.version, env.close()) == (("!",), spec.version, None)
    assert env.step_tokens("hi!", [1, 2], [0]).observation == "HI!"  # no step_tokens: its step answers
    complete = resolve_environment(f"{path}:Complete").make()
    assert type(complete).__name__ == "Complete"  # every member there: not wrapped
    wrapped = ForeignEnvironment(complete, "3")
    assert wrapped.step_tokens("x", [1, 2], [0, 0, 0]).observation == "3+2"  # its own step_tokens, when it has one
    wrapped.close()
    assert complete.__class__.__module__ and sys.modules[type(complete).__module__].CLOSED == [complete]


def test_the_base_keeps_the_row_and_counts_the_turns_for_every_builtin():
    """The row, the turn count and the row without its gold live once, in EnvironmentBase: the built-in
    environments check their rows (check_row) and count turns (next_turn) through it."""
    import lit_rlvr.demo  # noqa: F401  (countdown)

    calls = []

    class Counting(EnvironmentBase):
        def check_row(self, row):
            calls.append(dict(row))
            if "bad" in row:
                raise ValueError("bad row")

        def step(self, action):
            return Step(str(self.next_turn()), done=self.turns_left == 0)

    env = Counting()
    row = {"id": "r", "answer": "4", "digits": "123"}
    assert env.reset(row, max_turns=2) is None and calls == [row]
    row["id"] = "changed"
    assert env.row == {"id": "r", "answer": "4", "digits": "123"} and env.scoring_row == {"id": "r", "digits": "123"}
    assert [(env.step("x").observation, env.turn, env.turns_left) for _ in range(2)] == [
        ("False", 1, 1),
        ("True", 2, 0),
    ]
    env.reset({"id": "again"}, max_turns=1)
    assert (env.turn, env.max_turns, env.step("y").done) == (0, 1, True)  # reset starts counting again
    with pytest.raises(ValueError, match="bad row"):
        env.reset({"bad": 1}, 3)
    assert env.row == {"id": "again"}  # a refused row is not kept
    for name in ("sql", "calculator", "countdown"):
        cls = ENVIRONMENTS[name]
        assert issubclass(cls, EnvironmentBase) and not {"reset", "row", "turn", "max_turns"} & set(vars(cls)), name
    with pytest.raises(ValueError, match="the sql environment needs 'db_path'"):
        resolve_environment("sql").make().reset({"id": "q", "answer": "SELECT 1"}, 3)
    with pytest.raises(ValueError, match="malformed gold for countdown"):
        resolve_environment("countdown").make().reset({"id": "c", "digits": "1", "answer": "x"}, 3)


def test_an_environment_says_whether_it_scores_its_trajectories(tmp_path):
    """The built-ins score every trajectory, so their rows need no ``reward``; a TRL class scores when it
    has ``get_reward``; a class of the user's scores when it declares ``scores = True``."""
    import lit_rlvr.demo  # noqa: F401  (the countdown environment)

    assert all(resolve_environment(name).scores for name in ("sql", "calculator", "countdown"))
    assert resolve_environment("skyrl", {"env": "text2sql"}).scores
    path = tmp_path / "my_envs.py"
    path.write_text(
        USER_ENVS + "\n\nclass Scored(Native):\n    scores = True\n\n\nclass Rewarded(TRLStyle):\n"
        "    def get_reward(self):\n        return float(self.total == 7)\n"
    )
    assert not resolve_environment(f"{path}:Native").scores and resolve_environment(f"{path}:Scored").scores
    assert not resolve_environment(f"{path}:TRLStyle").scores and resolve_environment(f"{path}:Rewarded").scores
    register_environment("_test_unscored")(type("Unscored", (EnvironmentBase,), {}))
    register_environment("_test_scored", scores=lambda *, level=1: level > 0)(
        type("Scored", (EnvironmentBase,), {"__init__": lambda self, *, level=1: None})
    )
    try:
        assert not resolve_environment("_test_unscored").scores
        assert (
            resolve_environment("_test_scored").scores and not resolve_environment("_test_scored", {"level": 0}).scores
        )
    finally:
        ENVIRONMENTS.pop("_test_unscored"), ENVIRONMENTS.pop("_test_scored")


def test_a_row_column_named_completion_or_answer_never_reaches_a_rewards_keywords():
    """reward(completion, answer, **row): the countdown checker and the calculator score a row that
    carries a ``completion`` column (a dataset's reference solution, say) as one without it."""
    import lit_rlvr.demo  # noqa: F401  (the countdown checker)

    row = {"id": "c", "answer": "26", "digits": "357", "completion": "5*7-3*3;"}
    env = resolve_environment("countdown").make()
    env.reset(row, 2)
    assert env.step("3*7+5;").reward == 1.0
    env = resolve_environment("calculator").make()
    env.reset({"id": "k", "answer": "42", "reward": "math", "completion": "42"}, 2)
    assert env.step("<answer>42</answer>").reward == 1.0
