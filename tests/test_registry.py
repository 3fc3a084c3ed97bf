"""Every registry checks its entries' options through one path: ``Registry.get_checked``."""

from __future__ import annotations

import pytest

from lit_rlvr.registry import Registry


def test_registering_twice_and_unknown_names_are_errors():
    reg = Registry("thing")
    reg.register("a")(lambda x: x)
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        reg.register("a")(lambda x: x)
    with pytest.raises(ValueError, match=r"key: unknown thing 'b'; valid names: \['a'\]"):
        reg.get_checked("b", "key")


def test_injected_arguments_are_not_options_and_required_ones_are_enforced():
    reg = Registry("estimator", injected=("generator",))

    @reg.register("e")
    def e(rewards, *, k: int, scale: float = 1.0, generator=None):
        return rewards

    assert reg.options("e") == ["k", "scale"] and reg.defaults("e") == {"scale": 1.0}
    assert reg.declares("e", "generator") and not reg.declares("e", "entropies")
    reg.get_checked("e", "key", {"k": 2})
    with pytest.raises(
        ValueError, match=r"opts: unknown option\(s\) \['generator'\] of estimator 'e'; accepted: \['k', 'scale'\]"
    ):
        reg.get_checked("e", "key", {"k": 2, "generator": None}, "opts")
    with pytest.raises(ValueError, match=r"opts: estimator 'e' needs option\(s\) \['k'\]"):
        reg.get_checked("e", "key", {}, "opts")


def test_a_signature_names_the_options_of_an_entry_that_forwards_kwargs():
    class Engine:
        def __init__(self, path, *, depth: int = 1): ...

    reg = Registry("engine")
    reg.register("plain")(lambda **kwargs: None)  # no signature: takes anything
    reg.register("typed", signature=Engine)(lambda **kwargs: Engine("x", **kwargs))
    reg.get_checked("plain", "engine", {"anything": 1})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['deep'\] of engine 'typed'; accepted: \['depth'\]"):
        reg.get_checked("typed", "engine", {"deep": 2})


@pytest.mark.parametrize(
    ("registry", "name", "options", "match"),
    [
        ("advantages", "grpo", {"std": "huge"}, r"grpo: std must be one of"),
        ("advantages", "passk", {"k": 0}, r"k must be an integer >= 1"),
        ("advantages", "passk_bootstrap", {"k": 2, "num_groups": 0}, r"num_groups must be an integer >= 1"),
        ("advantages", "pkpo", {"k": 2, "baseline": "mean"}, r"pkpo: baseline must be one of"),
        ("advantages", "passk_entropy_adaptive", {"k": 2, "entropies": None}, r"unknown option\(s\) \['entropies'\]"),
        ("divergences", "alpha", {"alpha": 1.0}, r"alpha in \(0, 1\)"),
        ("divergences", "tv", {"alpha": 0.5}, r"unknown option\(s\) \['alpha'\] of f-divergence 'tv'"),
        ("rewards", "math", {"extraction": "latex"}, r"extraction='latex' is not one of"),
        ("rewards", "math", {"float_rounding": -1}, r"float_rounding=-1 must be an integer >= 0"),
        (
            "rewards",
            "sql",
            {"timeout_s": 1.0},
            r"unknown option\(s\) \['timeout_s'\] of reward 'sql'; accepted: \['mode'\]",
        ),
        (
            "adapters",
            "gsm8k",
            {"reward": "math", "index": 3},
            r"unknown option\(s\) \['index'\] of dataset adapter 'gsm8k'",
        ),
        ("engines", "hf", {"decode": "fast", "model": None}, r"unknown option\(s\) \['model'\] of rollout engine 'hf'"),
        (
            "engines",
            "vllm",
            {"gpu_memory_utilisation": 0.5},
            r"unknown option\(s\) \['gpu_memory_utilisation'\] of rollout engine 'vllm'",
        ),
    ],
)
def test_each_registry_refuses_what_its_entries_do_not_take(registry, name, options, match):
    import lit_rlvr.rewards  # noqa: F401  (registers math and sql)
    from lit_rlvr.data import ADAPTERS
    from lit_rlvr.functional import ADVANTAGES, DIVERGENCES
    from lit_rlvr.rewards import REWARDS
    from lit_rlvr.rollout import ENGINES

    table = {
        "advantages": ADVANTAGES,
        "divergences": DIVERGENCES,
        "rewards": REWARDS,
        "adapters": ADAPTERS,
        "engines": ENGINES,
    }[registry]
    with pytest.raises(ValueError, match=match):
        table.get_checked(name, "key", options, "key_options")


def test_every_registry_uses_the_one_path():
    """No registry of the library is a bare dict: each is a Registry, so get_checked applies to it."""
    from lit_rlvr.data import ADAPTERS
    from lit_rlvr.functional import ADVANTAGES, DIVERGENCES
    from lit_rlvr.functional.divergences import DIVERGENCE_LEVELS
    from lit_rlvr.functional.losses import AGGREGATIONS, KL_ESTIMATORS
    from lit_rlvr.rewards import REWARDS
    from lit_rlvr.rollout import ENGINES

    for registry in (
        ADAPTERS,
        ADVANTAGES,
        DIVERGENCES,
        DIVERGENCE_LEVELS,
        AGGREGATIONS,
        KL_ESTIMATORS,
        REWARDS,
        ENGINES,
    ):
        assert isinstance(registry, Registry) and len(registry) >= 2, registry.kind
        for name in registry:
            registry.get_checked(name, "key")  # every registered name is reachable through the one path
