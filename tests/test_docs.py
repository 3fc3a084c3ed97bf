"""The project's own docs (README.md, CONTRIBUTING.md, docs/*.md) agree with the code: generated
tables, commands, examples, links, citations."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
READ_BY_USERS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *DOCS]


def test_the_configuration_reference_is_the_codes():
    from lit_rlvr.tools.reference import BEGIN, END, generated

    doc = (ROOT / "docs" / "configuration.md").read_text()
    committed = doc[doc.index(BEGIN) : doc.index(END) + len(END)]
    assert committed == generated(), "docs/configuration.md is stale: python -m lit_rlvr.tools.reference --write docs/configuration.md"


GROUP_TYPES = re.compile(r"\b(DatasetSpec|ValSet|HFSource|LoraOptions|PromptFormat|GoldCheck|CacheOptions|RolloutEngine)\b")


def reference_rows(title_prefix: str) -> list[tuple[str, str, str]]:
    """``(key, default, type)`` of the reference's tables whose title starts with ``title_prefix``."""
    from lit_rlvr.tools.reference import sections

    return [(k.path, k.default, k.type) for title, _, rows in sections() if title.startswith(title_prefix) for k in rows]


def flag(key: str, default: str, type_: str = "") -> str | None:
    """``--key=value`` setting ``key`` to its documented default (None: a group, set by its own keys)."""
    if default in ("required", "(group)") or "[i]" in key or GROUP_TYPES.search(type_):
        return None
    value = default.strip("`")
    if value.startswith("'") and value.endswith("'"):
        value = value[1:-1]
    return f"--{key}={value}"


def parsed(*args: str) -> dict:
    from lit_rlvr.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        main([*args, "--print_config"])
    assert exit_info.value.code in (0, None), err.getvalue()[-3000:]
    return yaml.safe_load(out.getvalue())


def test_every_documented_fit_key_parses_at_its_documented_default():
    """The whole reference at once, as a user would type it: each key set to its default on the demo config."""
    keys = [*reference_rows("`model"), *reference_rows("`rollout"), *reference_rows("`data"), *reference_rows("`export")]
    flags = [f for key, default, type_ in keys if (f := flag(key, default, type_)) is not None and not key.startswith("data.train.hf")]
    on = ["--model.anchor.coef=1.0", "--model.kl.coef=0.1", "--data.cache.path=x", "--model.policy.lora.r=16",
          "--model.entropy.options={entropy_coef: 0.01}"]
    config = parsed("fit", "--config", str(ROOT / "configs/demo/base.yaml"), *flags, *on)
    assert len(flags) > 70
    model = config["model"]["init_args"]
    assert model["anchor"]["divergence"] == "forward_kl" and model["kl"]["estimator"] == "k3" and model["policy"]["lora"]["r"] == 16
    assert model["entropy"] == {"control": "static", "options": {"entropy_coef": 0.01}} and model["loss"]["policy_loss"] == "vanilla"
    assert config["rollout"]["init_args"]["drift_every_n_steps"] == 10 and config["data"]["init_args"]["cache"]["verify"] == "sha256"


def test_every_documented_cache_key_parses_at_its_documented_default():
    flags = [f for key, default, type_ in reference_rows("`lit-rlvr cache") if (f := flag(key, default, type_)) is not None]
    config = parsed("cache", "--config", str(ROOT / "configs/demo/cache.yaml"), *flags)
    assert len(flags) >= 8 and config["engine"] == "hf" and config["micro_batch_size"] == 16


@pytest.mark.timeout(180)
def even_prompts(completion: str, answer: str, **row) -> float:
    """A reward the base already earns on half the prompts (D_pef) and never on the others (D_exp)."""
    return float(int(row["id"][-1]) % 2 == 0)


def test_the_python_api_example_runs(tiny_model_dir, tmp_path):
    """docs/configuration.md's "From Python" block, on the tiny model, with a reference cache built first."""
    import json

    from lit_rlvr.data import CacheOptions, DatasetSpec, PromptDataModule
    from lit_rlvr.options import PolicyOptions, SamplingParams, ScoringOptions
    from lit_rlvr.rewards import REWARDS
    from lit_rlvr.tools.cache import build_cache

    if "test_even_prompts" not in REWARDS:
        REWARDS.register("test_even_prompts")(even_prompts)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"C{i}{i + 1}=0{i}:", "answer": "x", "reward": "test_even_prompts"})
                               + "\n" for i in range(4)))  # fmt: skip
    cache = tmp_path / "cache"
    build_cache(PromptDataModule(str(tiny_model_dir), train=DatasetSpec(str(prompts)), cache=CacheOptions(str(cache))),
                PolicyOptions(str(tiny_model_dir)), SamplingParams(n=2, max_new_tokens=8, seed=0), device="cpu",
                scoring=ScoringOptions(workers=0), progress=False)  # fmt: skip
    doc = (ROOT / "docs" / "configuration.md").read_text()
    code = re.search(r"<!-- python-api-example -->\n```python\n(.*?)```", doc, re.DOTALL).group(1)
    scope = {"MODEL": str(tiny_model_dir), "PROMPTS": str(prompts), "CACHE": str(cache), "ROOT": str(tmp_path / "run")}
    exec(compile(code, "docs/configuration.md", "exec"), scope)  # noqa: S102 (the docs' own example)
    assert scope["trainer"].global_step == 1 and "train/pef" in scope["trainer"].callback_metrics


def section_numbers(path: Path) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^#{2,3} (\d+(?:\.\d+)?)[. ]", path.read_text(), re.MULTILINE)}


def test_every_citation_of_the_methods_doc_names_a_section_it_has():
    sections = section_numbers(ROOT / "docs" / "methods.md")
    assert {"1", "1.7", "2", "3", "4", "5"} <= sections
    sources = [*ROOT.joinpath("lit_rlvr").rglob("*.py"), *ROOT.joinpath("configs").rglob("*.yaml"), *READ_BY_USERS]
    cited = {}
    for path in sources:
        for m in re.finditer(r"docs/methods\.md[`']*\)?\s*§\s*(\d+(?:\.\d+)?)((?:[–-]\d+)?)", path.read_text()):
            cited.setdefault(m.group(1), []).append(path.relative_to(ROOT))
    assert len(cited) >= 4
    missing = {n: where[:3] for n, where in cited.items() if n not in sections}
    assert not missing, f"cited sections that docs/methods.md does not have: {missing}"


def heading_anchors(path: Path) -> set[str]:
    """The ``#anchors`` of a markdown file's headings, as GitHub spells them (lower case, punctuation
    dropped, spaces to hyphens, ``-1``, ``-2`` … for repeats)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)  # a bash comment is not a heading
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def test_heading_anchors_are_githubs():
    anchors = heading_anchors(ROOT / "docs" / "methods.md")
    assert "2-dph-rl-diversity-preserving-hybrid-rl-arxiv-250907430" in anchors  # as its own table of contents links it
    assert "1-the-rlvr-policy-loss-grpo--dapo-family" in anchors


def test_nothing_a_user_reads_links_outside_the_repository():
    """Every relative link (and image) resolves to a file of the repository, and its ``#anchor`` to a heading there."""
    for path in READ_BY_USERS:
        text = path.read_text()
        assert "METHODS.md" not in text and "shared/docs" not in text, path.name
        text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # links, not code
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            assert resolved.is_relative_to(ROOT) and not file.startswith("/"), (path.name, target, "outside the repository")
            assert resolved.exists(), (path.name, target)
            if anchor and resolved.suffix == ".md":
                assert anchor in heading_anchors(resolved), (path.name, target, "no such heading")


def doc_commands(path: Path, program: str = "lit-rlvr") -> list[list[str]]:
    """The ``program …`` lines of a markdown file's bash blocks (continuations joined, leading
    ``VAR=value`` environment settings dropped), without the program's name."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.split(" #")[0].strip()) if not line.lstrip().startswith("#") else []
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                words = words[1:]
            if words[:1] == [program]:
                commands.append(words[1:])
    return commands


@pytest.mark.parametrize("path", READ_BY_USERS, ids=lambda p: p.name)
def test_every_command_in_the_docs_parses(path):
    from lit_rlvr.callbacks import RolloutCallback
    from lit_rlvr.cli import TOOLS, main

    for args in doc_commands(path):
        args = [str(ROOT / a) if a.startswith("configs/") else a for a in args]
        if args[0] in ("fit", "validate"):  # and the rollout callback takes its settings (engine options, staleness)
            RolloutCallback(**parsed(*args)["rollout"]["init_args"])
        elif args[0] == "cache":
            parsed(*args)
        else:
            assert args[0] in TOOLS, args
            with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exit_info:
                main([args[0], "--help"])
            assert exit_info.value.code in (0, None)


def test_the_vllm_serve_commands_in_the_docs_parse_with_vllms_own_parser():
    """A user-run server's flags (docs/generation.md) are vLLM's, as vLLM itself parses them."""
    pytest.importorskip("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    commands = [args for path in READ_BY_USERS for args in doc_commands(path, "vllm")]
    assert commands and all(args[0] == "serve" for args in commands)
    for args in commands:
        parser = make_arg_parser(FlexibleArgumentParser())
        parsed_args = parser.parse_args(args[1:])
        assert parsed_args.logprobs_mode == "processed_logprobs" and parsed_args.weight_transfer_config is not None

