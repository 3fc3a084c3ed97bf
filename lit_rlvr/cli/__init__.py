"""``lit-rlvr``: LightningCLI ``fit`` / ``validate`` plus the ``cache``, ``report``, ``warmstart`` and ``demo-data`` tools.

    lit-rlvr fit --config configs/math/base.yaml --config configs/math/dph_f.yaml
    lit-rlvr validate --config configs/math/base.yaml --config configs/math/grpo.yaml --ckpt_path …/checkpoints/epoch=…-step=500.ckpt
    lit-rlvr cache --config configs/math/cache.yaml      # DPH-RL's offline π_ref samples
    lit-rlvr warmstart --config configs/demo/warmstart.yaml
    lit-rlvr demo-data --out_dir artifacts/demo/data                   # the demo's task files
    lit-rlvr report runs/demo/metrics.jsonl --out runs/demo/passk.png   # table + plot
    lit-rlvr upgrade config old.yaml                                    # a 0.1 config in today's groups

Configs are parsed with OmegaConf interpolation (``${model.sampling.n}``) and read by option
group (``model.loss.advantage``, :mod:`lit_rlvr.options`). Every setting has one owner: the
rollouts' sampling is the module's (``model.sampling``), which the rollout callback reads; the
one value given twice, the DataModule's tokenizer, is linked to ``model.policy.path``.
``model:`` and ``data:`` take a user's subclass (``class_path: myproj.MyModule``); the top-level
``imports:`` list names plug-in modules (a user's rewards, estimators, divergences, adapters) to
import before anything is built (:mod:`lit_rlvr.plugins`).
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
import warnings
from collections.abc import Callable
from typing import NoReturn

from typing_extensions import override

TOOL_MODULES = {
    "cache": "lit_rlvr.tools.cache",
    "demo-data": "lit_rlvr.demo.data",
    "report": "lit_rlvr.tools.report",
    "upgrade": "lit_rlvr.tools.upgrade",
    "warmstart": "lit_rlvr.demo.warmstart",
}  # each tool's module, whose ``main(argv)`` runs it
TOOLS = tuple(TOOL_MODULES)
# What a run prints that lit_rlvr cannot fix at its cause, silenced by exact message, category and
# module, each with why. (Fixed at their cause instead: "Found N module(s) in eval mode" — the policy
# loads in train mode; "Total length of `list` across ranks is zero" — a fit without data.val has no
# validation loop; "Epoch 0/-2" — StepProgressBar.)
QUIET_WARNINGS = (
    # Lightning 2.6's CombinedLoader builds torch's LeafSpec, which torch 2.13 deprecates: Lightning's
    # code (lightning/pytorch/utilities/_pytree.py), once per run, nothing a user can change
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, r"lightning\.pytorch\.utilities\._pytree"),
)  # (message regex, category, module regex), as warnings.filterwarnings takes them
QUIET_LOGS = (
    # every Trainer without Lightning's cloud LitLogger advertises it (an INFO record no setting turns off)
    (
        "lightning.pytorch.utilities.rank_zero",
        r"💡 Tip: For seamless cloud logging and experiment tracking, try installing \[litlogger\]",
    ),
)  # (logger name, message regex)


def quiet_known_noise() -> None:
    """Install :data:`QUIET_WARNINGS` and :data:`QUIET_LOGS` (each once): what the CLI's runs never print."""
    for message, category, module in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, message in QUIET_LOGS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.pattern.pattern == message for f in logger.filters):
            logger.addFilter(_DropMessage(message))


class _DropMessage(logging.Filter):
    """Drops the records whose message matches ``message`` (a regex, from its start)."""

    def __init__(self, message: str):
        super().__init__()
        self.pattern = re.compile(message)

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


class ConfigError(ValueError):
    """A configuration ``lit-rlvr`` refuses; the message (lit_rlvr's own, without jsonargparse's
    wrapping) names the key, the value and what is accepted."""


def _short(key: str) -> str:
    """``model.init_args.x`` → ``model.x``: how users write the model and data sections."""
    return key.replace(".init_args.", ".") if key.startswith(("model.", "data.")) else key


_SECTIONS = ("--model.", "--data.", "--rollout.")


def _nulls_as_dicts(args: list[str]) -> list[str]:
    """``--model.loss.dual_clip=null`` as ``--model.loss={dual_clip: null}`` (the same setting).

    jsonargparse (4.53) refuses ``null`` for a field of an option group inside a subclass-mode
    section (``model:``, ``data:``, ``rollout:``) given as a flag, though it takes it from YAML and
    in the dict form, which merges into the group like the flag would.

    Example:
        >>> _nulls_as_dicts(["--model.loss.dual_clip=null", "--data.cache.perfect_threshold", "null", "--model.kl=null"])
        ['--model.loss={dual_clip: null}', '--data.cache={perfect_threshold: null}', '--model.kl=null']
    """
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        key, eq, value = arg.partition("=")
        if not eq and i + 1 < len(args) and arg.startswith(_SECTIONS) and args[i + 1] in ("null", "None"):
            value, i = args[i + 1], i + 1
        parts = key.removeprefix("--").split(".")
        if "init_args" in parts:
            parts.remove("init_args")
        if key.startswith(_SECTIONS) and value in ("null", "None") and len(parts) >= 3:
            out.append(f"--{'.'.join(parts[:-1])}={{{parts[-1]}: null}}")
        elif not eq and value:
            out += [arg, value]
        else:
            out.append(arg)
        i += 1
    return out


def _exit_with_config_error(prog: str, message: str) -> NoReturn:
    """Print ``message`` as the last lines of the output, with where the options are listed, and exit 2."""
    print(
        f"{prog}: error: {message}\n(every option: {prog} --help, and docs/configuration.md)",
        file=sys.stderr,
        flush=True,
    )
    sys.exit(2)


def _is_refusal(err: Exception) -> bool:
    """Whether ``err`` is a refusal at start-up (:class:`ConfigError`, :class:`~lit_rlvr.contracts.StartupError`;
    the latter's module is only looked up once loaded, so that the tools that never load it start light)."""
    contracts = sys.modules.get("lit_rlvr.contracts")
    return isinstance(err, ConfigError) or (contracts is not None and isinstance(err, contracts.StartupError))


def _tool(name: str) -> Callable[[list[str]], object]:
    """The ``main`` of tool ``name``, imported alone: ``report`` or ``demo-data`` load no torch."""
    module = importlib.import_module(TOOL_MODULES[name])
    return module.main


HELP = (
    "lit-rlvr: RL with verifiable rewards, the Lightning way. Training and evaluation: "
    "`lit-rlvr fit|validate --config …` (see configs/). Tools, each with its own --help: "
    f"{', '.join(f'`lit-rlvr {t}`' for t in TOOLS)}."
)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``lit-rlvr`` console script (``argv`` None: the command line)."""
    args = list(sys.argv[1:] if argv is None else argv)
    quiet_known_noise()
    if args and args[0] in TOOLS:
        try:
            _tool(args[0])(args[1:])
        except Exception as err:  # a refusal at start-up: the tool's few lines and exit 2
            if argv is not None or not _is_refusal(err):  # called from Python: the exception
                raise
            _exit_with_config_error(f"lit-rlvr {args[0]}", str(err))
        return
    if argv is None:  # LightningCLI reads sys.argv itself
        sys.argv[1:] = _nulls_as_dicts(sys.argv[1:])
    else:
        argv = _nulls_as_dicts(list(argv))
    # Lightning, torch and transformers: for fit and validate only (the tools above start without them)
    from lit_rlvr.cli.lightning_cli import RLVRCLI, RLVRParser
    from lit_rlvr.contracts import StartupError
    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.module import RLVRModule

    omegaconf = {"parser_mode": "omegaconf"}
    try:
        RLVRCLI(
            RLVRModule,
            PromptDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=argv,  # None: LightningCLI reads sys.argv itself
            parser_kwargs={"fit": omegaconf, "validate": omegaconf, "description": HELP, "prog": "lit-rlvr"},
            parser_class=RLVRParser,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
        )
    except (ConfigError, StartupError) as err:  # a setting, or data or a cache the run cannot use (at set-up)
        if argv is not None:  # called from Python: the exception, with its short message
            raise
        _exit_with_config_error(f"lit-rlvr {args[0] if args and not args[0].startswith('-') else ''}".strip(), str(err))
