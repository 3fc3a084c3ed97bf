"""The project's own docs (README.md, CONTRIBUTING.md, docs/*.md) agree with the code: generated
tables, commands, examples, links, citations, the layer table."""

from __future__ import annotations

import contextlib
import doctest
import importlib.util
import io
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT

ROOT = REPO_ROOT
DOCS = sorted((ROOT / "docs").glob("*.md"))
READ_BY_USERS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *DOCS]


def test_the_configuration_reference_is_the_codes():
    from lit_rlvr.tools.reference import BEGIN, END, generated

    doc = (ROOT / "docs" / "configuration.md").read_text()
    committed = doc[doc.index(BEGIN) : doc.index(END) + len(END)]
    assert committed == generated(), (
        "docs/configuration.md is stale: python -m lit_rlvr.tools.reference --write docs/configuration.md"
    )


GROUP_TYPES = re.compile(
    r"\b(DatasetSpec|ValSet|HFSource|LoraOptions|PromptFormat|GoldCheck|CacheOptions|RolloutEngine)\b"
)


def reference_rows(title_prefix: str) -> list[tuple[str, str, str]]:
    """``(key, default, type)`` of the reference's tables whose title starts with ``title_prefix``."""
    from lit_rlvr.tools.reference import sections

    return [
        (k.path, k.default, k.type) for title, _, rows in sections() if title.startswith(title_prefix) for k in rows
    ]


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
    keys = [
        *reference_rows("`model"),
        *reference_rows("`rollout"),
        *reference_rows("`data"),
        *reference_rows("`export"),
    ]
    flags = [
        f
        for key, default, type_ in keys
        if (f := flag(key, default, type_)) is not None and not key.startswith("data.train.hf")
    ]
    on = [
        "--model.anchor.coef=1.0",
        "--model.kl.coef=0.1",
        "--data.cache.path=x",
        "--model.policy.lora.r=16",
        "--model.entropy.options={entropy_coef: 0.01}",
    ]
    config = parsed("fit", "--config", str(ROOT / "configs/demo/base.yaml"), *flags, *on)
    assert len(flags) > 70
    model = config["model"]["init_args"]
    assert (
        model["anchor"]["divergence"] == "forward_kl"
        and model["kl"]["estimator"] == "k3"
        and model["policy"]["lora"]["r"] == 16
    )
    assert (
        model["entropy"] == {"control": "static", "options": {"entropy_coef": 0.01}}
        and model["loss"]["policy_loss"] == "vanilla"
    )
    assert (
        config["rollout"]["init_args"]["drift_every_n_steps"] == 10
        and config["data"]["init_args"]["cache"]["verify"] == "sha256"
    )


def test_every_documented_cache_key_parses_at_its_documented_default():
    flags = [
        f for key, default, type_ in reference_rows("`lit-rlvr cache") if (f := flag(key, default, type_)) is not None
    ]
    config = parsed("cache", "--config", str(ROOT / "configs/demo/cache.yaml"), *flags)
    assert len(flags) >= 7 and config["engine"] == "auto" and config["batching"]["micro_batch_size"] == 16


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
    prompts.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "prompt": f"C{i}{i + 1}=0{i}:", "answer": "x", "reward": "test_even_prompts"})
            + "\n"
            for i in range(4)
        )
    )
    cache = tmp_path / "cache"
    build_cache(
        PromptDataModule(str(tiny_model_dir), train=DatasetSpec(str(prompts)), cache=CacheOptions(str(cache))),
        PolicyOptions(str(tiny_model_dir)),
        SamplingParams(n=2, max_new_tokens=8, seed=0),
        engine="hf",
        device="cpu",
        scoring=ScoringOptions(workers=0),
        progress=False,
    )
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
            assert resolved.is_relative_to(ROOT) and not file.startswith("/"), (
                path.name,
                target,
                "outside the repository",
            )
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


@pytest.mark.timeout(300)
def test_the_readme_python_example_trains_and_logs_to_csv(tiny_model_dir, tmp_path, monkeypatch):
    """The README's example, verbatim but for the model (the tiny one), the run's length (2 steps) and
    the engine (transformers: no vLLM start); its relative paths are the data and logs in tmp_path."""
    import json

    code = re.search(
        r"<!-- readme-python-example -->\n```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL
    ).group(1)
    for shown, run in {
        '"Qwen/Qwen2.5-Math-1.5B"': repr(str(tiny_model_dir)),
        "max_steps=200": "max_steps=2",
        'engine="vllm"': 'engine="hf"',
    }.items():
        assert code.count(shown) == 1, shown
        code = code.replace(shown, run)
    for name, n in (("train.jsonl", 8), ("test.jsonl", 4)):
        (tmp_path / name).write_text(
            "".join(
                json.dumps({"id": f"{name[:2]}{i}", "prompt": f"C{i}{i + 1}=0{i}:", "answer": "7", "reward": "math"})
                + "\n"
                for i in range(n)
            )
        )
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 (the README's own example)
    assert scope["trainer"].global_step == 2
    logs = tmp_path / "runs" / "lightning_logs" / "version_0"
    columns = (logs / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/reward", "train/loss", "val/test/pass@1", "val/test/pass@16"} <= set(columns), columns
    assert "advantage: passk" in (logs / "hparams.yaml").read_text()  # the option groups reached the logger


# methods.md quotes examples of the code's docstrings without their imports; they run there (--doctest-modules)
DOCTESTED = [path for path in DOCS if re.search(r"^>>> ", path.read_text(), re.MULTILINE) and path.name != "methods.md"]


@pytest.mark.parametrize("path", DOCTESTED, ids=lambda p: p.name)
def test_the_docs_examples_run_as_doctests(path):
    """``>>>`` examples in docs/*.md run, as pytest runs the README's (``--doctest-glob``)."""
    result = doctest.testfile(
        str(path), module_relative=False, verbose=False, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    )
    assert result.attempted > 0 and result.failed == 0, (
        f"{path.name}: {result.failed} of {result.attempted} examples failed (above)"
    )


def test_docs_with_examples_are_doctested():
    assert {"architecture.md"} <= {p.name for p in DOCTESTED}


def load_test_module(name: str):
    spec = importlib.util.spec_from_file_location(f"lit_rlvr_tests_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_architecture_layer_table_is_the_layout_tests():
    """docs/architecture.md's rooms and who may import whom are tests/repo/test_layout.py's ``ALLOWED``."""
    layout = load_test_module("test_layout")
    text = (ROOT / "docs" / "architecture.md").read_text().split("<!-- layers-table -->", 1)[1].strip()
    rows = [line for line in text.split("\n\n", 1)[0].splitlines() if line.startswith("| `")]
    table = {}
    for row in rows:
        room, may_import = (cell.strip() for cell in row.strip("|").split("|")[:2])
        names = set(re.findall(r"`([^`]+)`", may_import)) | (layout.CORE if "the core" in may_import else set())
        table[room.strip("`")] = names
    rooms = list(table)
    assert layout.CORE == set(rooms[: rooms.index("demo")]) - {"vllm_plugin"}, "the doc's definition of the core"
    wrong = {
        room: sorted(layout.ALLOWED.get(room, {"(no such room)"}))
        for room in table.keys() | layout.ALLOWED.keys()
        if table.get(room) != layout.ALLOWED.get(room)
    }
    assert not wrong, (
        f"docs/architecture.md's layer table is not tests/repo/test_layout.py's ALLOWED; these rows should read: {wrong}"
    )


MAKEFILE = (ROOT / "Makefile").read_text()
MAKE_TARGETS = set(re.findall(r"^([\w.-]+)\s*:(?!=)", MAKEFILE, re.MULTILINE)) - {".PHONY"}
MAKE_VARIABLES = set(re.findall(r"^([A-Z_]+)\s*[?:]?=", MAKEFILE, re.MULTILINE))


def shell_lines(path: Path) -> list[tuple[dict[str, str], list[str]]]:
    """``(environment, words)`` of each command line of a markdown file's bash blocks."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if line.lstrip().startswith("#") or not line.strip():
                continue
            words, env = shlex.split(line.split(" #")[0].strip()), {}
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                key, _, value = words.pop(0).partition("=")
                env[key] = value
            lines.append((env, words))
    return lines


def benchmark_script(name: str):
    """``benchmarks/<name>.py`` as a module (``async`` is a keyword: loaded from its file)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(f"lit_rlvr_docs_bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def check_python(words: list[str]) -> None:
    """``python -m pytest PATHS`` names existing tests; ``python benchmarks/X.py ARGS`` an existing script whose parser takes ARGS."""
    if words[1:3] == ["-m", "pytest"]:
        paths = [w.split("::")[0] for w in words[3:] if not w.startswith("-")]
        assert paths and all((ROOT / p).exists() for p in paths), words
        return
    script = ROOT / words[1]
    assert script.parent == ROOT / "benchmarks" and script.exists(), words
    if words[2:]:
        module = benchmark_script(script.stem)
        assert hasattr(module, "parse_args"), f"{words}: the script has no parse_args to check its arguments with"
        module.parse_args(words[2:])


def test_every_shell_command_in_the_docs_is_checked():
    """Each command line a user may copy is run or parsed: `lit-rlvr` and `vllm serve` lines by the tests
    above, `torchrun` by tests/integration/test_scale_out.py, and here `make` targets and variables, `pip` extras,
    `python` scripts and test paths. A new kind of command needs its check."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = set(pyproject["project"]["optional-dependencies"])
    uninstalled = set(re.search(r"pip uninstall -y (.+)", MAKEFILE).group(1).split())
    seen = set()
    for path in READ_BY_USERS:
        for env, words in shell_lines(path):
            program = Path(words[0]).name
            seen.add(program)
            if program in ("lit-rlvr", "vllm"):
                continue  # test_every_command_in_the_docs_parses, test_the_vllm_serve_commands_in_the_docs_parse_with_vllms_own_parser
            elif program == "torchrun":
                # parsed by tests/integration/test_scale_out.py
                assert words[words.index("-m") + 1] == "lit_rlvr.cli", words
            elif program == "make":
                variables = {w.partition("=")[0] for w in words[1:] if "=" in w} | set(env)
                assert {w for w in words[1:] if "=" not in w} <= MAKE_TARGETS and variables <= MAKE_VARIABLES, (
                    path.name,
                    words,
                )
                for method in env.get("DEMO_METHODS", "").split():
                    assert (ROOT / "configs" / "demo" / f"{method}.yaml").exists(), (path.name, method)
            elif program == "pip" and words[1] == "install":
                named = {
                    extra for w in words[2:] if (m := re.fullmatch(r"\.\[(.+)\]", w)) for extra in m.group(1).split(",")
                }
                assert "." in words[2:] or named, words
                assert named <= extras, (path.name, words, extras)
            elif program == "pip" and words[1] == "uninstall":
                assert set(words[3:]) == uninstalled and words[2] == "-y", (path.name, words)
            elif program == "python":
                check_python(words)
            else:
                pytest.fail(f"{path.name}: no check for the command {words}")
    assert {"lit-rlvr", "make", "pip", "python"} <= seen
    for path in READ_BY_USERS:  # and the ones quoted in the text
        for command in re.findall(r"`(python benchmarks/[\w]+\.py[^`]*)`", path.read_text()):
            check_python(shlex.split(command))


def test_the_readmes_license_and_citations_are_the_projects():
    readme = (ROOT / "README.md").read_text()
    license_ = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]["text"]
    assert readme.split("## License", 1)[1].split()[0] == license_ and f"license = {{{license_}}}" in readme
    bibtex = re.search(r"```bibtex\n(.*?)```", readme, re.DOTALL).group(1)
    intro = readme.split("## Install", 1)[0]
    assert (
        set(re.findall(r"arXiv:(\d{4}\.\d{5})", bibtex))
        == set(re.findall(r"\*\*(?:DPH-RL|Pass@k Training)\*\*[^:]*?arXiv (\d{4}\.\d{5})", intro))
        == {"2509.07430", "2508.10751"}
    )
