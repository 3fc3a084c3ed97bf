"""The package's public API: what ``from lit_rlvr import ...`` gives, and what importing it costs."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import lit_rlvr


def test_the_public_api_imports_from_the_package():
    from lit_rlvr import PassAtK, PromptDataModule, RLVRModule, RolloutCallback
    from lit_rlvr.callbacks import RolloutCallback as defined
    from lit_rlvr.data import PromptDataModule as data_module
    from lit_rlvr.metrics import PassAtK as metric
    from lit_rlvr.module import RLVRModule as module

    assert (RLVRModule, RolloutCallback, PromptDataModule, PassAtK) == (module, defined, data_module, metric)
    assert all(hasattr(lit_rlvr, name) for name in lit_rlvr.__all__)
    assert set(lit_rlvr.__all__) <= set(dir(lit_rlvr))


def test_the_version_is_written_once():
    """pyproject.toml reads it from ``lit_rlvr.__version__`` (the installed metadata says the same)."""
    assert lit_rlvr.__version__ == version("lit_rlvr") == "0.2.0"


def test_importing_the_rewards_does_not_import_torch():
    """Reward workers and vLLM's plug-in import parts of lit_rlvr: the package itself stays light."""
    code = "import sys, lit_rlvr, lit_rlvr.rewards.math, lit_rlvr.vllm_plugin; print('torch' in sys.modules, 'lightning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
