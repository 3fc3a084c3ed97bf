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

import logging
import re
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from typing_extensions import override

from lit_rlvr.callbacks import HFExport, PassCountsWriter, RolloutCallback, SignalCheckpoint, StepProgressBar
from lit_rlvr.checkpoint import SafeCheckpointIO
from lit_rlvr.contracts import StartupError
from lit_rlvr.data import PromptDataModule
from lit_rlvr.flags import merge_mapping_flags
from lit_rlvr.module import RLVRModule
from lit_rlvr.plugins import load_plugins
from lit_rlvr.strategies import FSDP2Strategy  # noqa: F401  (registers --trainer.strategy=fsdp2)

TOOLS = ("cache", "demo-data", "report", "upgrade", "warmstart")
# values that must agree: (source, target); a target is never set by the user (see _refuse_linked_targets)
LINKS = (("model.init_args.policy.path", "data.init_args.tokenizer"),)
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


class RLVRParser(LightningArgumentParser):
    """Lightning's parser, whose errors are one short message instead of the usage and a namespace dump."""

    @override
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        from jsonargparse._common import debug_mode_active

        if not self.exit_on_error or debug_mode_active():  # a nested parser: its parent reports the error
            super().error(message, ex)
        self._logger.error(message)
        parser = getattr(ex, "subcommand_parser", None) or self
        _exit_with_config_error(parser.prog.replace(" [options]", ""), _config_message(message, ex))


class RLVRCLI(LightningCLI):
    """LightningCLI with first-class callbacks (rollouts, export, pass counts), plug-in imports and links."""

    @staticmethod
    @override
    def subcommands() -> dict[str, set[str]]:
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
        }

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--imports",
            type=list[str],
            default=[],
            help="plug-in modules to import before building anything (a user's rewards, advantages, divergences, adapters)",
        )
        # `rollout:` is its own config section; `class_path` swaps in a user's subclass.
        parser.add_lightning_class_args(RolloutCallback, "rollout", subclass_mode=True, required=False)
        parser.set_defaults({"rollout": {"class_path": "lit_rlvr.callbacks.RolloutCallback"}})
        parser.add_lightning_class_args(HFExport, "export")  # --export.dirpath=…: the trained policy, HF format
        parser.add_lightning_class_args(PassCountsWriter, "pass_counts")  # --pass_counts.path=…: per-prompt counts
        for source, target in LINKS:
            parser.link_arguments(source, target)

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        if isinstance(args, dict):
            return super().parse_arguments(parser, args)
        args = list(sys.argv[1:] if args is None else args)
        _refuse_linked_targets(args)
        self.config = parser.parse_args(merge_mapping_flags(parser, args, _SECTIONS))

    @override
    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as err:  # a class refused its settings: jsonargparse wraps its message
            raise ConfigError(_config_message(str(err), err)) from err

    def validate(self, **kwargs) -> list[dict[str, float]]:
        """``trainer.validate``, printing one table with a column per validation set (Lightning's
        own lists every set's metrics under every dataloader); ``--verbose=false``: no table."""
        from lit_rlvr.tools.report import results_table

        verbose = kwargs.pop("verbose", True)
        results = self.trainer.validate(**kwargs, verbose=False)
        if verbose and self.trainer.is_global_zero and results:
            print(results_table(results), flush=True)
        return results

    @override
    def instantiate_trainer(self, **kwargs) -> Trainer:
        """The trainer, with lit_rlvr's defaults for failures: checkpoints written atomically with a
        checksum verified on resume (:class:`~lit_rlvr.checkpoint.SafeCheckpointIO`, unless the config
        gives another ``CheckpointIO``), and a checkpoint plus a non-zero exit on SIGTERM / Ctrl-C
        (:class:`~lit_rlvr.callbacks.SignalCheckpoint`, unless the config has one). Where Lightning
        would add its rich progress bar, :class:`~lit_rlvr.callbacks.StepProgressBar` (no ``Epoch 0/-2``);
        a ``fit`` without ``data.val`` runs no validation loop (Lightning would set one up over no
        dataloaders and warn that their total length is zero)."""
        if self.subcommand == "fit" and isinstance(self.datamodule, PromptDataModule) and not self.datamodule.val_specs:
            kwargs["limit_val_batches"] = 0
        configured = self._get(self.config_init, "trainer", default={}).get("callbacks") or []
        own_bar = any(
            isinstance(c, ProgressBar) for c in (configured if isinstance(configured, list) else [configured])
        )
        trainer = super().instantiate_trainer(**kwargs)
        if not own_bar and type(trainer.progress_bar_callback) is RichProgressBar:  # Lightning's default bar
            trainer.callbacks[trainer.callbacks.index(trainer.progress_bar_callback)] = StepProgressBar()
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # Lightning's default, not a user's
            trainer.strategy.checkpoint_io = SafeCheckpointIO()
        if not any(isinstance(c, SignalCheckpoint) for c in trainer.callbacks):
            trainer.callbacks.append(SignalCheckpoint())
        return trainer

    @override
    def before_instantiate_classes(self) -> None:
        config = self.config.get(str(self.subcommand), self.config)
        load_plugins(config.get("imports") or [])


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


def _config_message(message: str, err: BaseException | None) -> str:
    """What a user needs from a parse or start-up error: the message of the exception jsonargparse
    caught (a class's own, lit_rlvr's: it names the key), else jsonargparse's innermost message after
    the keys that lead to it (``model.sampling.n: Expected a <class 'int'>. Got value: abc``), without
    its lists of union members and its namespace dumps.
    """
    chain: list[BaseException] = []
    while err is not None and all(err is not e for e in chain):
        chain.append(err)
        err = err.__cause__
    for e in chain:
        if not _raised_by(e, "jsonargparse"):
            return str(e)
    keys: list[str] = []
    for e in chain:
        if (head := str(e).split("\n", 1)[0]).startswith('Parser key "') and head.endswith('":'):
            if not keys or keys[-1] != head[12:-2]:
                keys.append(head[12:-2])
    innermost = str(chain[-1]).strip() if chain else message.strip()
    return f"{_short('.'.join(keys))}: {innermost}" if keys else innermost


def _raised_by(err: BaseException, package: str) -> bool:
    """Whether ``err`` was raised inside ``package`` (its innermost frame); a traceback-less one counts as not."""
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and f"{package}/" in Path(frames[-1].filename).as_posix()


def _exit_with_config_error(prog: str, message: str) -> NoReturn:
    """Print ``message`` as the last lines of the output, with where the options are listed, and exit 2."""
    print(
        f"{prog}: error: {message}\n(every option: {prog} --help, and docs/configuration.md)",
        file=sys.stderr,
        flush=True,
    )
    sys.exit(2)


def _refuse_linked_targets(args: list[str]) -> None:
    """Raise ``ValueError`` if a config file or a flag sets a linked target.

    jsonargparse overwrites a link's target with its source's value without a word, so
    ``data.tokenizer: other`` in a YAML file would silently become the policy's path.
    """
    import yaml

    targets = {variant: (source, target) for source, target in LINKS for variant in (target, _short(target))}
    found: list[tuple[str, str]] = []  # (where, key)
    for i, arg in enumerate(args):
        if arg.startswith("--") and (key := arg[2:].split("=", 1)[0]) in targets:
            found.append((f"the flag {arg.split('=', 1)[0]}", key))
        if arg in ("--config", "-c") and i + 1 < len(args) or arg.startswith("--config="):
            path = args[i + 1] if "=" not in arg else arg.split("=", 1)[1]
            try:
                config = yaml.safe_load(Path(path).read_text())
            except (OSError, yaml.YAMLError):
                continue
            for key in targets:
                node = config
                for part in key.split("."):
                    node = node.get(part) if isinstance(node, dict) else None
                if node is not None:
                    found.append((f"the config file {path}", key))
    if found:
        where, key = found[0]
        source, target = targets[key]
        raise ConfigError(
            f"{where} sets {_short(target)}, which is linked to {_short(source)} and always takes its value; "
            f"set {_short(source)} instead (values that must agree are given once)"
        )


def _tools() -> dict[str, Callable[[list[str]], object]]:
    from lit_rlvr.demo.data import main as demo_data_main
    from lit_rlvr.demo.warmstart import main as warmstart_main
    from lit_rlvr.tools.cache import main as cache_main
    from lit_rlvr.tools.report import main as report_main
    from lit_rlvr.tools.upgrade import main as upgrade_main

    return {
        "cache": cache_main,
        "demo-data": demo_data_main,
        "report": report_main,
        "upgrade": upgrade_main,
        "warmstart": warmstart_main,
    }


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
            _tools()[args[0]](args[1:])
        except (ConfigError, StartupError) as err:  # a refusal at start-up: the tool's few lines and exit 2
            if argv is not None:  # called from Python: the exception
                raise
            _exit_with_config_error(f"lit-rlvr {args[0]}", str(err))
        return
    if argv is None:  # LightningCLI reads sys.argv itself
        sys.argv[1:] = _nulls_as_dicts(sys.argv[1:])
    else:
        argv = _nulls_as_dicts(list(argv))
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


if __name__ == "__main__":
    main()
